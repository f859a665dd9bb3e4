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
from collections.abc import Sequence
from typing import Any

import numpy as np

from subic_keras._validation import (
    check_int,
)

# The named protocols live in `protocols`; re-exported here, where earlier
# releases defined them.
from subic_keras.data.protocols import RETRIEVAL_PROTOCOLS as RETRIEVAL_PROTOCOLS
from subic_keras.data.protocols import RetrievalProtocol as RetrievalProtocol
from subic_keras.data.protocols import protocol_split as protocol_split

# Scores from codes live in `code_scores`; re-exported here, where earlier
# releases defined them.
from subic_keras.evaluation.code_scores import asymmetric_scores as asymmetric_scores
from subic_keras.evaluation.code_scores import hamming_scores as hamming_scores
from subic_keras.evaluation.ranking import (
    ap_full,
    ap_interpolated,
    ap_top_k,
    check_choice,
    check_cutoff,
    hits_at,
    mean_over_queries,
    nan_where_none_relevant,
    prepare,
    ranked_chunks,
)

# Number of recall levels of each interpolation (0, 1/(L-1), ..., 1).
_INTERPOLATIONS = {"none": None, "11point": 11, "21point": 21}


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
    scores, query, database, ties, chunk_size = prepare(
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
    return float(mean_over_queries(ap, "mean_average_precision"))


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
    for rows, r in ranked_chunks(
        scores, query_labels, database_labels, ties, chunk_size
    ):
        num_relevant[rows] = r.num_relevant
        if ap == "full":
            ap_values[rows] = ap_full(r)
        elif isinstance(ap, tuple):
            ap_values[rows] = ap_interpolated(r, ap[1])
        elif ap is not None:
            ap_values[rows] = ap_top_k(r, ap, harmonic)
        if cutoffs is not None:
            hits[rows] = hits_at(r, cutoffs)
    return ap_values, hits, num_relevant


def _check_ap_options(top_k, interpolation, ties, num_database):
    """Validates the AP options; returns the `ap` argument of `_per_query`."""
    levels = _INTERPOLATIONS[
        check_choice("interpolation", interpolation, tuple(_INTERPOLATIONS))
    ]
    if top_k is not None:
        top_k = check_cutoff("top_k", top_k, num_database)
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
    scores, query, database, ties, chunk_size = prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    k = check_cutoff("k", k, scores.shape[1])
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
    precision = nan_where_none_relevant(hits / k, num_relevant)
    return float(mean_over_queries(precision, "precision_at_k"))


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
        recall = nan_where_none_relevant(hits / num_relevant, num_relevant)
    return float(mean_over_queries(recall, "recall_at_k"))


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
    scores, query, database, ties, chunk_size = prepare(
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
    scores, query, database, ties, chunk_size = prepare(
        scores, query_labels, database_labels, ties, chunk_size
    )
    mode = _check_ap_options(top_k, interpolation, ties, scores.shape[1])
    if isinstance(ks, (str, bytes, numbers.Number)) or not hasattr(ks, "__iter__"):
        raise TypeError(f"ks must be a sequence of integers, received {ks!r}")
    cutoffs = np.array(
        [check_cutoff("ks", k, scores.shape[1]) for k in ks], dtype=np.int64
    )
    ap, hits, num_relevant = _per_query(
        scores, query, database, ties, chunk_size, ap=mode, cutoffs=cutoffs
    )
    result: dict[str, Any] = {"map": float(mean_over_queries(ap, "evaluate_retrieval"))}
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
