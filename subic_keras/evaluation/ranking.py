"""Ranking with tie groups, and the per-chunk metrics `evaluation` reports.

A chunk of queries' scores is ranked once (`_rank`): each database item's
place and the size and relevant count of its tie group, so that every tie
policy of `evaluation` (pessimistic, optimistic, expected, index) is an
exact formula over the groups rather than a sort per policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from subic_keras._validation import check_int

_TIES = ("pessimistic", "optimistic", "expected", "index")
# Scores held by one chunk of queries when `chunk_size` is not given.
_CHUNK_ELEMENTS = 1 << 20


# ---------------------------------------------------------------------------
# Argument checks.


def check_choice(name: str, value, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, received {value!r}")
    return value


def check_scores(scores) -> np.ndarray:
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


def check_labels(name: str, labels, length: int, axis_name: str) -> np.ndarray:
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


def check_label_pair(query_labels, database_labels, scores: np.ndarray):
    query = check_labels(
        "query_labels", query_labels, scores.shape[0], "scores.shape[0]"
    )
    database = check_labels(
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


def check_cutoff(name: str, value, num_database: int) -> int:
    value = check_int(name, value, minimum=1)
    if value > num_database:
        raise ValueError(
            f"{name} must be <= the number of database items ({num_database}), "
            f"received {value}"
        )
    return value


def check_chunk_size(chunk_size, num_database: int) -> int:
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


def ranked_chunks(
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


def nan_where_none_relevant(values: np.ndarray, num_relevant: np.ndarray):
    return np.where(num_relevant > 0, values, np.nan)


def ap_full(r: _Ranking) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        if r.relevant is None:
            total = _expected_terms(r).sum(axis=1)
        else:
            hits = np.cumsum(r.relevant, axis=1)
            position = np.arange(1, hits.shape[1] + 1)
            total = np.where(r.relevant, hits / position, 0.0).sum(axis=1)
        return nan_where_none_relevant(total / r.num_relevant, r.num_relevant)


def ap_top_k(r: _Ranking, k: int, harmonic: np.ndarray) -> np.ndarray:
    if r.relevant is not None:
        relevant = r.relevant[:, :k]
        hits = np.cumsum(relevant, axis=1)
        total = np.where(relevant, hits / np.arange(1, k + 1), 0.0).sum(axis=1)
        retrieved = hits[:, -1]
        ap = np.divide(total, retrieved, out=np.zeros(len(total)), where=retrieved > 0)
        return nan_where_none_relevant(ap, r.num_relevant)

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
    return nan_where_none_relevant(ap, r.num_relevant)


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


def ap_interpolated(r: _Ranking, levels: int) -> np.ndarray:
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
    return nan_where_none_relevant(total / levels, r.num_relevant)


def hits_at(r: _Ranking, cutoffs: np.ndarray) -> np.ndarray:
    """Relevant items within the top k, for each k in `cutoffs` (expected value
    for "expected": c + r m / n when k takes m items of a tie group)."""
    if r.relevant is not None:
        return np.cumsum(r.relevant, axis=1)[:, cutoffs - 1].astype(np.float64)
    p = cutoffs - 1
    start, size, before, in_group = r.groups()
    taken = p - start[:, p] + 1
    return before[:, p] + in_group[:, p] * taken / size[:, p]


def prepare(scores, query_labels, database_labels, ties, chunk_size):
    scores = check_scores(scores)
    query, database = check_label_pair(query_labels, database_labels, scores)
    ties = check_choice("ties", ties, _TIES)
    chunk_size = check_chunk_size(chunk_size, scores.shape[1])
    return scores, query, database, ties, chunk_size


def mean_over_queries(values: np.ndarray, what: str) -> np.ndarray:
    keep = ~np.isnan(values[:, 0] if values.ndim == 2 else values)
    if not np.any(keep):
        raise ValueError(
            f"cannot compute {what}: no query has a relevant database item "
            "(check that query_labels and database_labels use the same classes)"
        )
    return values[keep].mean(axis=0)
