"""Exact retrieval metrics: mAP, precision and recall at k, and search scores.

Every number the project reports is measured here, so every variant is named
and every choice is exact:

- **Ranking.** `scores` has shape `(num_queries, num_database)`; higher is
  better. Hamming-like scores are full of ties, and how a tie is broken moves
  mAP by several points, so the `ties` argument is always explicit:

  - `"pessimistic"` (default): inside a group of equal scores the relevant
    items come after the irrelevant ones (the worst case);
  - `"optimistic"`: the relevant items come first (the best case);
  - `"expected"`: the exact mean over all orders of every tie group, each
    order equally likely, computed in closed form (no sampling);
  - `"index"`: ties are broken by database index (a stable sort), the
    behaviour of most deep-hashing code bases.

  Without ties the four agree, and equal `sklearn.metrics.average_precision_score`.

- **Relevance.** Labels are class ids `(n,)` (relevant = same class) or
  multi-hot `(n, C)` (relevant = at least one shared label).

- **Queries without any relevant database item** have no defined AP: the
  per-query functions return NaN for them and every mean excludes them.

Queries are processed in chunks, so memory stays bounded (about `chunk_size *
num_database` scores at a time) for any number of queries.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from subic_keras._validation import (
    check_block_shape,
    check_finite,
    check_int,
    check_width,
)

# The named protocols live in `protocols`; re-exported here, where earlier
# releases defined them.
from subic_keras.protocols import RETRIEVAL_PROTOCOLS as RETRIEVAL_PROTOCOLS
from subic_keras.protocols import RetrievalProtocol as RetrievalProtocol
from subic_keras.protocols import protocol_split as protocol_split

_TIES = ("pessimistic", "optimistic", "expected", "index")
# Number of recall levels of each interpolation (0, 1/(L-1), ..., 1).
_INTERPOLATIONS = {"none": None, "11point": 11, "21point": 21}
# Scores held by one chunk of queries when `chunk_size` is not given.
_CHUNK_ELEMENTS = 1 << 20


# ---------------------------------------------------------------------------
# Argument checks.


def _check_choice(name: str, value, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, received {value!r}")
    return value


def _check_scores(scores) -> np.ndarray:
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(
            "scores must be a 2-D array of shape (num_queries, num_database), "
            f"received shape {scores.shape}"
        )
    if scores.dtype.kind not in "biuf":
        raise TypeError(f"scores must hold real numbers, received dtype {scores.dtype}")
    if scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(
            "scores must have at least one query and one database item, "
            f"received shape {scores.shape}"
        )
    if scores.dtype.kind == "f":
        nan = int(np.count_nonzero(np.isnan(scores)))
        if nan:
            raise ValueError(f"scores must not contain NaN, received {nan} NaN values")
    return scores


def _check_labels(name: str, labels, length: int, axis_name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim not in (1, 2):
        raise ValueError(
            f"{name} must be class ids of shape (n,) or multi-hot labels of "
            f"shape (n, num_classes), received shape {labels.shape}"
        )
    if labels.shape[0] != length:
        raise ValueError(
            f"{name} must have {length} rows to match {axis_name}, "
            f"received {labels.shape[0]}"
        )
    if labels.ndim == 1:
        if labels.dtype.kind not in "biu":
            raise TypeError(
                f"{name} must hold integer class ids, received dtype {labels.dtype}"
            )
        return labels
    if labels.dtype.kind not in "biuf" or not np.all((labels == 0) | (labels == 1)):
        raise ValueError(f"{name} is 2-D so it must be multi-hot, with values 0 or 1")
    return labels.astype(np.float32)


def _check_label_pair(query_labels, database_labels, scores: np.ndarray):
    query = _check_labels(
        "query_labels", query_labels, scores.shape[0], "scores.shape[0]"
    )
    database = _check_labels(
        "database_labels", database_labels, scores.shape[1], "scores.shape[1]"
    )
    if query.ndim != database.ndim:
        raise ValueError(
            "query_labels and database_labels must both be class ids or both be "
            f"multi-hot, received shapes {query.shape} and {database.shape}"
        )
    if query.ndim == 2 and query.shape[1] != database.shape[1]:
        raise ValueError(
            "query_labels and database_labels must have the same number of "
            f"classes, received {query.shape[1]} and {database.shape[1]}"
        )
    return query, database


def _check_cutoff(name: str, value, num_database: int) -> int:
    value = check_int(name, value, minimum=1)
    if value > num_database:
        raise ValueError(
            f"{name} must be <= the number of database items ({num_database}), "
            f"received {value}"
        )
    return value


def _check_chunk_size(chunk_size, num_database: int) -> int:
    if chunk_size is None:
        return max(1, _CHUNK_ELEMENTS // num_database)
    return check_int("chunk_size", chunk_size, minimum=1)


# ---------------------------------------------------------------------------
# Ranking with tie groups.


class _Ranking(NamedTuple):
    """One chunk of queries, ranked; every array is indexed by rank position.

    `relevant` is the relevance in rank order after the tie rule (None for
    "expected"). For each position, `start` and `size` describe its tie group,
    `before` counts relevant items ranked before the group and `in_group` the
    relevant items inside it (None for "index", which needs no groups).
    """

    relevant: np.ndarray | None
    start: np.ndarray | None
    size: np.ndarray | None
    before: np.ndarray | None
    in_group: np.ndarray | None
    num_relevant: np.ndarray

    def groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`(start, size, before, in_group)`, kept by every tie rule but "index"."""
        if (
            self.start is None
            or self.size is None
            or self.before is None
            or self.in_group is None
        ):
            raise ValueError('ties="index" keeps no tie groups')
        return self.start, self.size, self.before, self.in_group

    def ranked_relevance(self) -> np.ndarray:
        """`relevant`, kept by every tie rule but "expected"."""
        if self.relevant is None:
            raise ValueError('ties="expected" keeps no ranked relevance')
        return self.relevant


def _rank(scores: np.ndarray, relevant: np.ndarray, ties: str) -> _Ranking:
    rows, n = scores.shape
    if ties == "index":
        # A stable ascending sort of the reversed row, read backwards, ranks by
        # decreasing score with ties in increasing index (no negation, so no
        # integer overflow).
        order = n - 1 - np.argsort(scores[:, ::-1], axis=1, kind="stable")[:, ::-1]
        ranked = np.take_along_axis(relevant, order, axis=1)
        return _Ranking(ranked, None, None, None, None, ranked.sum(axis=1))

    # The order inside a tie group is irrelevant: the tie rule rewrites it.
    order = np.argsort(scores, axis=1)[:, ::-1]
    ranked_scores = np.take_along_axis(scores, order, axis=1)
    ranked = np.take_along_axis(relevant, order, axis=1)
    # int32 positions and counts halve the memory of a chunk (n < 2**31).
    position = np.arange(n, dtype=np.int32)
    first = np.ones((rows, n), dtype=bool)
    first[:, 1:] = ranked_scores[:, 1:] != ranked_scores[:, :-1]
    last = np.ones((rows, n), dtype=bool)
    last[:, :-1] = first[:, 1:]
    start = np.maximum.accumulate(np.where(first, position, 0), axis=1)
    end = np.where(last, position, np.int32(n))
    end = np.minimum.accumulate(end[:, ::-1], axis=1)[:, ::-1]
    cumulative = np.zeros((rows, n + 1), dtype=np.int32)
    np.cumsum(ranked, axis=1, out=cumulative[:, 1:])
    before = np.take_along_axis(cumulative, start, axis=1)
    in_group = np.take_along_axis(cumulative, end + 1, axis=1) - before
    size = end - start + 1
    offset = position - start
    if ties == "pessimistic":
        resolved = offset >= size - in_group
    elif ties == "optimistic":
        resolved = offset < in_group
    else:
        resolved = None
    return _Ranking(resolved, start, size, before, in_group, cumulative[:, -1])


def _relevance(query: np.ndarray, database: np.ndarray) -> np.ndarray:
    if query.ndim == 1:
        return query[:, None] == database[None, :]
    # 0/1 float32 products are exact integer counts below 2**24 classes.
    return (query @ database.T) > 0


def _ranked_chunks(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    ties: str,
    chunk_size: int,
) -> Iterator[tuple[slice, _Ranking]]:
    for begin in range(0, scores.shape[0], chunk_size):
        rows = slice(begin, min(begin + chunk_size, scores.shape[0]))
        relevant = _relevance(query_labels[rows], database_labels)
        yield rows, _rank(scores[rows], relevant, ties)


# ---------------------------------------------------------------------------
# Per-chunk metrics.


def _expected_terms(r: _Ranking) -> np.ndarray:
    """E[rel(p) * precision(p)] at every rank position p, under random tie orders.

    Position p (0-based) is the j-th (j = p - start + 1) of a tie group of n
    items holding r relevant ones, c relevant items ranked before it. In a
    uniformly random order of the group, P(rel(p)) = r / n and, given that
    p is relevant, the j - 1 places above it inside the group hold on average
    (j - 1)(r - 1)/(n - 1) of the other r - 1 relevant items (hypergeometric).
    Hence E[rel(p) * #relevant in 1..p] = (r/n)(c + 1 + (j - 1)(r - 1)/(n - 1)).
    """
    start, size, before, in_group = r.groups()
    position = np.arange(start.shape[1])
    slope = np.where(size > 1, (in_group - 1) / np.maximum(size - 1, 1), 0.0)
    expected_hits = before + 1 + slope * (position - start)
    return (in_group / size) * expected_hits / (position + 1)


def _nan_where_none_relevant(values: np.ndarray, num_relevant: np.ndarray):
    return np.where(num_relevant > 0, values, np.nan)


def _ap_full(r: _Ranking) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        if r.relevant is None:
            total = _expected_terms(r).sum(axis=1)
        else:
            hits = np.cumsum(r.relevant, axis=1)
            position = np.arange(1, hits.shape[1] + 1)
            total = np.where(r.relevant, hits / position, 0.0).sum(axis=1)
        return _nan_where_none_relevant(total / r.num_relevant, r.num_relevant)


def _ap_top_k(r: _Ranking, k: int, harmonic: np.ndarray) -> np.ndarray:
    if r.relevant is not None:
        relevant = r.relevant[:, :k]
        hits = np.cumsum(relevant, axis=1)
        total = np.where(relevant, hits / np.arange(1, k + 1), 0.0).sum(axis=1)
        retrieved = hits[:, -1]
        ap = np.divide(total, retrieved, out=np.zeros(len(total)), where=retrieved > 0)
        return _nan_where_none_relevant(ap, r.num_relevant)

    # "expected": only the tie group that straddles rank k is uncertain.
    terms = _expected_terms(r)
    starts, sizes, befores, in_groups = r.groups()
    start = starts[:, k - 1]
    in_front = np.arange(terms.shape[1]) < start[:, None]
    settled = np.where(in_front, terms, 0.0).sum(axis=1)
    ap = np.zeros(len(start))
    for row in range(len(start)):
        if r.num_relevant[row] == 0:
            continue
        ap[row] = _expected_ap_at_cut(
            settled=settled[row],
            before=int(befores[row, k - 1]),
            start=int(start[row]),
            size=int(sizes[row, k - 1]),
            in_group=int(in_groups[row, k - 1]),
            taken=k - int(start[row]),
            harmonic=harmonic,
        )
    return _nan_where_none_relevant(ap, r.num_relevant)


def _expected_ap_at_cut(
    settled: float,
    before: int,
    start: int,
    size: int,
    in_group: int,
    taken: int,
    harmonic: np.ndarray,
) -> float:
    """Exact E[AP@k] when rank k cuts a tie group.

    The group holds `size` items (`in_group` relevant) at 1-based ranks
    `start + 1 ...`; its first `taken` ranks fall within the top k. The number
    h of relevant items among them is hypergeometric, and given h they are
    spread uniformly over those `taken` ranks, so (as in `_expected_terms`)
    E[sum of rel * precision over the taken ranks | h] =
    (h/m) [(c + 1 - a (1 + s)) (H_{s+m} - H_s) + a m], a = (h - 1)/(m - 1),
    with m = taken, s = start, c = before and H the harmonic numbers. AP@k
    divides by c + h (0 when nothing relevant is retrieved), so the
    expectation is taken over h exactly.
    """
    low = max(0, taken - (size - in_group))
    high = min(in_group, taken)
    h = np.arange(low, high + 1, dtype=np.float64)
    # log P(h + 1) / P(h) of the hypergeometric law, accumulated from `low`.
    ratio = np.log((in_group - h[:-1]) * (taken - h[:-1])) - np.log(
        (h[:-1] + 1) * (size - in_group - taken + h[:-1] + 1)
    )
    log_p = np.concatenate([[0.0], np.cumsum(ratio)])
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    slope = (h - 1) / (taken - 1) if taken > 1 else np.zeros_like(h)
    harmonic_sum = harmonic[start + taken] - harmonic[start]
    within = (h / taken) * (
        (before + 1 - slope * (1 + start)) * harmonic_sum + slope * taken
    )
    retrieved = before + h
    ap = np.divide(
        settled + within, retrieved, out=np.zeros_like(h), where=retrieved > 0
    )
    return float(np.dot(p, ap))


def _ap_interpolated(r: _Ranking, levels: int) -> np.ndarray:
    hits = np.cumsum(r.ranked_relevance(), axis=1)
    precision = hits / np.arange(1, hits.shape[1] + 1)
    # Best precision at this rank or any later one (recall only grows).
    best_after = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    rows = np.arange(hits.shape[0])
    total = np.zeros(hits.shape[0])
    for j in range(levels):
        # Recall >= j/(L-1) means at least ceil(j R / (L-1)) hits; integer
        # arithmetic keeps e.g. recall 0.5 of R = 2 exact.
        needed = (j * r.num_relevant + levels - 2) // (levels - 1)
        first_rank = np.count_nonzero(hits < needed[:, None], axis=1)
        first_rank = np.minimum(first_rank, hits.shape[1] - 1)
        total += best_after[rows, first_rank]
    return _nan_where_none_relevant(total / levels, r.num_relevant)


def _hits_at(r: _Ranking, cutoffs: np.ndarray) -> np.ndarray:
    """Relevant items within the top k, for each k in `cutoffs` (expected value
    for "expected": c + r m / n when k takes m items of a tie group)."""
    if r.relevant is not None:
        return np.cumsum(r.relevant, axis=1)[:, cutoffs - 1].astype(np.float64)
    p = cutoffs - 1
    start, size, before, in_group = r.groups()
    taken = p - start[:, p] + 1
    return before[:, p] + in_group[:, p] * taken / size[:, p]


def _prepare(scores, query_labels, database_labels, ties, chunk_size):
    scores = _check_scores(scores)
    query, database = _check_label_pair(query_labels, database_labels, scores)
    ties = _check_choice("ties", ties, _TIES)
    chunk_size = _check_chunk_size(chunk_size, scores.shape[1])
    return scores, query, database, ties, chunk_size


def _mean_over_queries(values: np.ndarray, what: str) -> np.ndarray:
    keep = ~np.isnan(values[:, 0] if values.ndim == 2 else values)
    if not np.any(keep):
        raise ValueError(
            f"cannot compute {what}: no query has a relevant database item "
            "(check that query_labels and database_labels use the same classes)"
        )
    return values[keep].mean(axis=0)


# ---------------------------------------------------------------------------
# Public metrics.


def average_precision(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    top_k: int | None = None,
    *,
    interpolation: str = "none",
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> np.ndarray:
    """Average precision of every query.

    With the database ranked by decreasing score, `rel(r)` the relevance of
    rank r and `P(r)` the precision of the top r:

    - full ranking (`top_k=None`): `AP = (1/R) Σ_r P(r) rel(r)`, R the number
      of relevant database items;
    - `top_k=k`: `AP@k = (1/R_k) Σ_{r<=k} P(r) rel(r)`, R_k the number of
      relevant items retrieved within the top k (0 when R_k = 0). This is the
      definition of the DSH/DPSH code bases (not `1/min(k, R)`);
    - `interpolation="11point"` / `"21point"`: the mean, over recall levels
      t in {0, 0.1, ..., 1} / {0, 0.05, ..., 1}, of the best precision at any
      rank with recall >= t (0 if none). The SuBiC authors' code uses
      21 points. Full ranking only.

    Ties are resolved by `ties` (see the module docstring). On the full
    ranking `"pessimistic"` and `"optimistic"` give the lowest and highest AP
    over tie orders; AP@k is not monotone in the order (an extra relevant item
    at a low precision lowers the mean), so for `top_k` they are the named
    orders, not necessarily the extremes. `"expected"` is
    exact: E[AP] sums, at each rank, E[rel(r) P(r)] in closed form over random
    orders of each tie group; for `top_k`, the random R_k is handled exactly by
    summing over the hypergeometric number of relevant items the top k takes
    from the tie group it cuts.

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1]])
    >>> average_precision(scores, [1], [1, 0, 1, 0], ties="expected")
    array([0.91666667])

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot
            `(num_queries, num_classes)`.
        database_labels: the same for the database.
        top_k: evaluate the top `k` ranks only; None for the full ranking.
        interpolation: `"none"`, `"11point"` or `"21point"`.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time (memory ~ `chunk_size *
            num_database`); by default about 2**20 scores per chunk.

    Returns:
        Float64 array `(num_queries,)`: NaN for queries with no relevant item
        in the database.

    Raises:
        ValueError: on bad shapes, NaN scores, an unknown option, `top_k`
            outside `[1, num_database]`, or `top_k`/`"expected"` combined with
            interpolation.
        TypeError: on non-numeric scores, non-integer class ids or `top_k`.
    """
    scores, query, database, ties, chunk_size = _prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    mode = _check_ap_options(top_k, interpolation, ties, scores.shape[1])
    ap, _, _ = _per_query(scores, query, database, ties, chunk_size, ap=mode)
    return ap


def mean_average_precision(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    top_k: int | None = None,
    *,
    interpolation: str = "none",
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> float:
    """Mean of `average_precision` over the queries that have a relevant item.

    `mAP = (1/|Q'|) Σ_{q in Q'} AP(q)`, Q' the queries with at least one
    relevant database item (the others have no defined AP and are excluded;
    `average_precision` marks them NaN). All options are those of
    `average_precision`; `top_k=None` is mAP over the full ranking (mAP@all).

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1], [0.1, 0.2, 0.3, 0.4]])
    >>> mean_average_precision(scores, [1, 0], [1, 0, 1, 0], ties="index")
    0.8333333333333333

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot labels.
        database_labels: class ids `(num_database,)` or multi-hot labels.
        top_k: evaluate the top `k` ranks only (AP@k, see
            `average_precision`); None for the full ranking.
        interpolation: `"none"`, `"11point"` or `"21point"`.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time.

    Returns:
        The mean average precision, a Python float.

    Raises:
        ValueError: as `average_precision`, or when no query has a relevant
            database item.
    """
    ap = average_precision(
        scores,
        query_labels,
        database_labels,
        top_k,
        interpolation=interpolation,
        ties=ties,
        chunk_size=chunk_size,
    )
    return float(_mean_over_queries(ap, "mean_average_precision"))


def _per_query(
    scores, query_labels, database_labels, ties, chunk_size, *, ap=None, cutoffs=None
):
    """One ranking pass: AP (if `ap` is "full", an int top k, or a number of
    interpolation levels as ("levels", L)), hits at `cutoffs`, and R per query."""
    num_queries, num_database = scores.shape
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, num_database + 1))])
    ap_values = np.empty(num_queries) if ap is not None else None
    hits = np.empty((num_queries, len(cutoffs))) if cutoffs is not None else None
    num_relevant = np.empty(num_queries)
    for rows, r in _ranked_chunks(
        scores, query_labels, database_labels, ties, chunk_size
    ):
        num_relevant[rows] = r.num_relevant
        if ap == "full":
            ap_values[rows] = _ap_full(r)
        elif isinstance(ap, tuple):
            ap_values[rows] = _ap_interpolated(r, ap[1])
        elif ap is not None:
            ap_values[rows] = _ap_top_k(r, ap, harmonic)
        if cutoffs is not None:
            hits[rows] = _hits_at(r, cutoffs)
    return ap_values, hits, num_relevant


def _check_ap_options(top_k, interpolation, ties, num_database):
    """Validates the AP options; returns the `ap` argument of `_per_query`."""
    levels = _INTERPOLATIONS[
        _check_choice("interpolation", interpolation, tuple(_INTERPOLATIONS))
    ]
    if top_k is not None:
        top_k = _check_cutoff("top_k", top_k, num_database)
    if levels is not None and top_k is not None:
        raise ValueError(
            f"interpolation={interpolation!r} is defined on the full ranking, so "
            f"top_k must be None, received top_k={top_k}"
        )
    if levels is not None and ties == "expected":
        raise NotImplementedError(
            f"interpolation={interpolation!r} with ties='expected' has no exact "
            "closed form here; use ties='pessimistic', 'optimistic' or 'index'"
        )
    if levels is not None:
        return ("levels", levels)
    return "full" if top_k is None else top_k


def _hits_at_k(scores, query_labels, database_labels, k, ties, chunk_size):
    """`(k, relevant items in each query's top k, relevant items per query)`."""
    scores, query, database, ties, chunk_size = _prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    k = _check_cutoff("k", k, scores.shape[1])
    _, hits, num_relevant = _per_query(
        scores, query, database, ties, chunk_size, cutoffs=np.array([k])
    )
    return k, hits[:, 0], num_relevant


def precision_at_k(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    k: int,
    *,
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> float:
    """Mean precision of the top `k`: `(1/|Q'|) Σ_q |relevant in top k| / k`.

    Q' are the queries with at least one relevant database item, as for
    `mean_average_precision`. With `ties="expected"` the count is its exact
    expectation: a tie group of n items with r relevant ones that contributes
    m items to the top k contributes r m / n.

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1]])
    >>> precision_at_k(scores, [1], [1, 0, 1, 0], k=2, ties="expected")
    0.75

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot labels.
        database_labels: class ids `(num_database,)` or multi-hot labels.
        k: the cutoff, in `[1, num_database]`.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time.

    Returns:
        The mean precision at k, a Python float.
    """
    k, hits, num_relevant = _hits_at_k(
        scores, query_labels, database_labels, k, ties, chunk_size
    )
    precision = _nan_where_none_relevant(hits / k, num_relevant)
    return float(_mean_over_queries(precision, "precision_at_k"))


def recall_at_k(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    k: int,
    *,
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> float:
    """Mean recall of the top `k`: `(1/|Q'|) Σ_q |relevant in top k| / R_q`.

    R_q is the number of relevant database items of query q; Q' the queries
    with R_q > 0. Ties as in `precision_at_k`.

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1]])
    >>> recall_at_k(scores, [1], [1, 0, 1, 0], k=2, ties="pessimistic")
    0.5

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot labels.
        database_labels: class ids `(num_database,)` or multi-hot labels.
        k: the cutoff, in `[1, num_database]`.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time.

    Returns:
        The mean recall at k, a Python float.
    """
    k, hits, num_relevant = _hits_at_k(
        scores, query_labels, database_labels, k, ties, chunk_size
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = _nan_where_none_relevant(hits / num_relevant, num_relevant)
    return float(_mean_over_queries(recall, "recall_at_k"))


def precision_recall_curve(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    num_points: int = 100,
    *,
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean precision and recall at rank cutoffs, for plotting.

    The curve is sampled at rank cutoffs (not at fixed recall levels):
    `cutoffs = np.unique(np.round(np.linspace(1, num_database, num_points)))`,
    so it has `min(num_points, num_database)` points or fewer. At each cutoff
    k, precision and recall are those of `precision_at_k` / `recall_at_k`,
    averaged over the queries that have a relevant item.

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1]])
    >>> precision, recall = precision_recall_curve(
    ...     scores, [1], [1, 0, 1, 0], num_points=4
    ... )
    >>> precision.round(3), recall
    (array([1.   , 0.5  , 0.667, 0.5  ]), array([0.5, 0.5, 1. , 1. ]))

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot labels.
        database_labels: class ids `(num_database,)` or multi-hot labels.
        num_points: number of cutoffs, >= 2.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time.

    Returns:
        `(precision, recall)`, two float64 arrays of the same length,
        recall non-decreasing.
    """
    scores, query, database, ties, chunk_size = _prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    num_points = check_int("num_points", num_points, minimum=2)
    cutoffs = np.unique(np.round(np.linspace(1, scores.shape[1], num_points)))
    cutoffs = cutoffs.astype(np.int64)
    _, hits, num_relevant = _per_query(
        scores, query, database, ties, chunk_size, cutoffs=cutoffs
    )
    keep = num_relevant > 0
    if not np.any(keep):
        raise ValueError(
            "cannot compute precision_recall_curve: no query has a relevant "
            "database item"
        )
    precision = (hits[keep] / cutoffs).mean(axis=0)
    recall = (hits[keep] / num_relevant[keep, None]).mean(axis=0)
    return precision, recall


def evaluate_retrieval(
    scores: np.ndarray,
    query_labels: np.ndarray,
    database_labels: np.ndarray,
    top_k: int | None = None,
    ks: Sequence[int] = (1, 10, 100),
    *,
    interpolation: str = "none",
    ties: str = "pessimistic",
    chunk_size: int | None = None,
) -> dict:
    """mAP, precision@k and recall@k in one JSON-serialisable dictionary.

    Example:

    >>> scores = np.array([[0.9, 0.5, 0.5, 0.1]])
    >>> evaluate_retrieval(scores, [1], [1, 0, 1, 0], ks=(1, 2))["precision@2"]
    0.5

    Args:
        scores: `(num_queries, num_database)` scores, higher is better.
        query_labels: class ids `(num_queries,)` or multi-hot labels.
        database_labels: class ids `(num_database,)` or multi-hot labels.
        top_k: as in `mean_average_precision`.
        ks: cutoffs for precision and recall, each in `[1, num_database]`.
        interpolation: as in `mean_average_precision`.
        ties: `"pessimistic"`, `"optimistic"`, `"expected"` or `"index"`.
        chunk_size: queries ranked at a time.

    Returns:
        `{"map": float, "precision@k": float, "recall@k": float (for each k),
        "num_queries": int (queries evaluated), "num_queries_without_relevant":
        int (excluded), "top_k": int or None, "interpolation": str,
        "ties": str}`.
    """
    scores, query, database, ties, chunk_size = _prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    mode = _check_ap_options(top_k, interpolation, ties, scores.shape[1])
    if isinstance(ks, (str, bytes, numbers.Number)) or not hasattr(ks, "__iter__"):
        raise TypeError(f"ks must be a sequence of integers, received {ks!r}")
    cutoffs = np.array(
        [_check_cutoff("ks", k, scores.shape[1]) for k in ks], dtype=np.int64
    )
    ap, hits, num_relevant = _per_query(
        scores, query, database, ties, chunk_size, ap=mode, cutoffs=cutoffs
    )
    result: dict[str, Any] = {
        "map": float(_mean_over_queries(ap, "evaluate_retrieval"))
    }
    keep = num_relevant > 0
    precision = (hits[keep] / cutoffs).mean(axis=0)
    recall = (hits[keep] / num_relevant[keep, None]).mean(axis=0)
    for k, p, r in zip(cutoffs, precision, recall):
        result[f"precision@{k}"] = float(p)
        result[f"recall@{k}"] = float(r)
    num_evaluated = int(np.count_nonzero(~np.isnan(ap)))
    result.update(
        num_queries=num_evaluated,
        num_queries_without_relevant=int(len(ap) - num_evaluated),
        top_k=None if top_k is None else int(top_k),
        interpolation=interpolation,
        ties=ties,
    )
    return result


# ---------------------------------------------------------------------------
# Scores from codes.


def _check_matrix(name: str, array) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, received shape {array.shape}")
    return array


def _chunk_rows_for(width: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, width))


def hamming_scores(
    query_bits: np.ndarray,
    database_bits: np.ndarray,
    *,
    packed: bool = False,
) -> np.ndarray:
    """Negated Hamming distances, so that higher is better.

    `score[i, j] = -Σ_b [q_i[b] != d_j[b]]`, computed as
    `-(|q_i| + |d_j| - 2 q_i·d_j)` with one exact float32 matrix product.

    Example:

    >>> hamming_scores(np.array([[1, 0, 1]]), np.array([[1, 0, 1], [0, 1, 1]]))
    array([[ 0, -2]], dtype=int32)

    Args:
        query_bits: `(num_queries, num_bits)` of 0/1 (any integer, bool or
            float dtype), or with `packed=True` uint8 bytes from `np.packbits`
            along axis 1.
        database_bits: `(num_database, num_bits)`, in the same form.
        packed: whether the bits are packed 8 per uint8 byte. It is never
            guessed, since a packed byte may itself be 0 or 1.

    Returns:
        Int32 array `(num_queries, num_database)`.

    Raises:
        ValueError: on non-2-D inputs, different widths, or values other
            than 0/1 when `packed=False`.
        TypeError: on a non-uint8 dtype when `packed=True`.
    """
    query = _check_matrix("query_bits", query_bits)
    database = _check_matrix("database_bits", database_bits)
    if query.shape[1] != database.shape[1]:
        raise ValueError(
            "query_bits and database_bits must have the same number of "
            f"columns, received {query.shape[1]} and {database.shape[1]}"
        )
    if packed:
        for name, array in (("query_bits", query), ("database_bits", database)):
            if array.dtype != np.uint8:
                raise TypeError(
                    f"{name} must have dtype uint8 when packed=True, "
                    f"received {array.dtype}"
                )
        # Padding bits are zero on both sides, so they never differ.
        query = np.unpackbits(query, axis=1)
        database = np.unpackbits(database, axis=1)
    else:
        for name, array in (("query_bits", query), ("database_bits", database)):
            if array.dtype.kind not in "biuf" or not np.all(
                (array == 0) | (array == 1)
            ):
                raise ValueError(
                    f"{name} must hold bits 0 or 1 (pass packed=True for bytes "
                    "from np.packbits)"
                )
    if query.shape[1] >= 1 << 24:
        raise ValueError(
            f"query_bits must have fewer than 2**24 bits, received {query.shape[1]}"
        )
    query = query.astype(np.float32)
    database = database.astype(np.float32)
    # Integer-valued float32 products are exact below 2**24 bits.
    common = query @ database.T
    distance = query.sum(axis=1)[:, None] + database.sum(axis=1)[None, :] - 2 * common
    return -np.rint(distance).astype(np.int32)


def asymmetric_scores(
    queries_z: np.ndarray,
    database_codes: np.ndarray,
    num_blocks: int,
    block_size: int,
) -> np.ndarray:
    """SuBiC's asymmetric score of real queries against integer codes.

    `score(z*, c) = (z*)ᵀ b(c) = Σ_m z*_m[c_m]`: a table look-up per block,
    `M` additions per database item, never a dense `(n, M*K)` one-hot matrix.

    Example:

    >>> z = np.array([[0.0, 1.0, 2.0, 3.0]])
    >>> asymmetric_scores(z, np.array([[1, 0], [0, 1]]), num_blocks=2, block_size=2)
    array([[3., 3.]])

    Args:
        queries_z: `(num_queries, M*K)` real query vectors (the ReLU output of
            `FC0`), block m in columns `[m*K, (m+1)*K)`.
        database_codes: `(num_database, M)` integer codes in `[0, K)`.
        num_blocks: M.
        block_size: K.

    Returns:
        `(num_queries, num_database)` scores in the floating dtype of
        `queries_z` (float64 for integer input).

    Raises:
        ValueError: on bad shapes, non-finite `queries_z`, or codes outside
            `[0, K)`.
        TypeError: on non-integer codes.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    z = _check_matrix("queries_z", queries_z)
    codes = _check_matrix("database_codes", database_codes)
    check_width("queries_z", z.shape[1], num_blocks, block_size)
    if z.dtype.kind not in "biuf":
        raise TypeError(f"queries_z must hold real numbers, received dtype {z.dtype}")
    if z.dtype.kind != "f":
        z = z.astype(np.float64)
    check_finite("queries_z", z)
    if codes.dtype.kind not in "iu":
        raise TypeError(
            f"database_codes must have an integer dtype, received {codes.dtype}"
        )
    if codes.shape[1] != num_blocks:
        raise ValueError(
            f"database_codes must have num_blocks = {num_blocks} columns, "
            f"received {codes.shape[1]}"
        )
    if codes.size and (codes.min() < 0 or codes.max() >= block_size):
        raise ValueError(
            f"database_codes must lie in [0, block_size) = [0, {block_size}), "
            f"received values in [{codes.min()}, {codes.max()}]"
        )
    # Column of z holding block m's entry for every database item.
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    result = np.empty((z.shape[0], codes.shape[0]), dtype=z.dtype)
    step = _chunk_rows_for(codes.shape[0])
    for begin in range(0, z.shape[0], step):
        block = z[begin : begin + step]
        out = result[begin : begin + step]
        np.take(block, columns[:, 0], axis=1, out=out)
        for m in range(1, num_blocks):
            out += np.take(block, columns[:, m], axis=1)
    return result
