"""An index held still, and the exact top `k` of what it holds.

A `View` is what `SubicIndex.view()` yields under the index's read lock:
its ids and the scan over their positions. `top_k` and `top_positions`
search one in chunks of queries; `sharding` searches several at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from subic_keras.search import native
from subic_keras.search.native import SecondCode
from subic_keras.search.store import CodeStore

# The most items of the `k`-th result's tie group beyond the scan's best
# that `tie_ordered_top_k` orders (the rest keep insertion order).
MAX_TIED = 10_000


@dataclasses.dataclass(frozen=True)
class View:
    """An index held still (`SubicIndex.view`): its ids and an exact search.

    `search(queries, k, keep)` takes checked float32 queries, `k` at most
    the number of items searched, and `keep` (one boolean per position, or
    None for every item), and returns float64 (or float32) scores and
    positions into `ids`, best first, equal scores by position.
    """

    ids: np.ndarray
    search: Callable[
        [np.ndarray, int, np.ndarray | None], tuple[np.ndarray, np.ndarray]
    ]


def top_k(
    view: View,
    queries: np.ndarray,
    k: int,
    chunk: int,
    keep: np.ndarray | None = None,
    dtype=np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-`min(k, n)` of a view (`n` items, those of `keep` if given),
    positions mapped to its ids, scores of `dtype`."""
    scores, positions = top_positions(view, queries, k, chunk, keep, dtype)
    return scores, view.ids[positions]


def top_positions(
    view: View,
    queries: np.ndarray,
    k: int,
    chunk: int,
    keep: np.ndarray | None = None,
    dtype=np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """`top_k` with insertion positions instead of ids, `chunk` queries a
    scan."""
    found = min(k, len(view.ids) if keep is None else int(np.count_nonzero(keep)))
    scores = np.empty((len(queries), found), dtype=dtype)
    positions = np.empty((len(queries), found), dtype=np.int64)
    for start in range(0, len(queries) if found else 0, chunk):
        rows = slice(start, start + chunk)
        scores[rows], positions[rows] = view.search(queries[rows], found, keep)
    return scores, positions


def every_score(
    view: View, queries: np.ndarray, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of every query against every item of a view, `(nq, n)`
    float32, and its ids in increasing order (the columns' order): the
    scores of `top_k` with `k = n`, `chunk` queries a scan."""
    ids = np.sort(view.ids)
    scores = np.empty((len(queries), len(ids)), np.float32)
    if not len(ids):
        return scores, ids
    for start in range(0, len(queries), chunk):
        part, found = top_k(view, queries[start : start + chunk], len(ids), chunk)
        columns = np.searchsorted(ids, found)
        np.put_along_axis(scores[start : start + len(part)], columns, part, axis=1)
    return scores, ids


def tie_ordered_top_k(
    view: View,
    store: CodeStore,
    queries: np.ndarray,
    k: int,
    keep: np.ndarray | None,
    key: SecondCode,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`top_k` of a view over `store` (`chunk` queries a scan), equal scores
    ordered by `key`'s scores (higher first), then by position: float32
    scores and ids.

    The scan's best `k + 1` tell whether the `k`-th result's tie group goes
    on beyond them; where it does, the rest of it (the items of its codes,
    up to `MAX_TIED` more) is ordered with them: in C for the whole batch
    (`native.order_ties`), or one query at a time here where it is unbuilt.
    """
    kept = len(view.ids) if keep is None else int(np.count_nonzero(keep))
    k = min(k, kept)
    wide = min(kept, k + 1)
    scores, positions = top_positions(view, queries, wide, chunk, keep)
    ordered = native.order_ties(scores, positions, k, store, keep, key, MAX_TIED)
    if ordered is not None:
        return ordered[0], view.ids[ordered[1]]
    out_scores = scores[:, :k].copy()
    out_positions = positions[:, :k].copy()
    for row in range(len(queries) if k else 0):
        score, position = scores[row], positions[row]
        extends = wide > k and score[k - 1] == score[k]
        if not extends and not np.any(score[1:k] == score[: k - 1]):
            continue  # no tie among the best k: the scan's order stands
        if extends:
            score, position = _with_tie_group(store, score, position, k, keep)
        key_values = key.scores(row, position)
        if len(position) > 4 * k:  # the best k first, then their order
            chosen = _best_tied(score, position, key_values, k)
            score, position = score[chosen], position[chosen]
            key_values = key_values[chosen]
        order = np.lexsort((position, -key_values, -score.astype(np.float64)))
        out_scores[row] = score[order[:k]]
        out_positions[row] = position[order[:k]]
    return out_scores, view.ids[out_positions]


def _best_tied(score, position, key_values, k: int) -> np.ndarray:
    """The candidates of the best `k` by score, the `k`-th's tie group cut
    by key, equal keys by position (in any order: the caller sorts them)."""
    bar = score[k - 1]
    above = np.flatnonzero(score > bar)
    tied = np.flatnonzero(score == bar)
    need = k - len(above)
    values = key_values[tied]
    cut = -np.partition(-values, need - 1)[need - 1]  # the need-th best key
    better, equal = tied[values > cut], tied[values == cut]
    equal = equal[np.argsort(position[equal], kind="stable")][: need - len(better)]
    return np.concatenate([above, better, equal])


def _with_tie_group(
    store: CodeStore,
    score: np.ndarray,
    position: np.ndarray,
    k: int,
    keep: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """A query's best from the scan, with the rest of the `k`-th's tie group
    (the items of its codes that `keep` keeps, up to `MAX_TIED` more)."""
    bar = score[k - 1]
    tied = store.same_codes(position[score == bar])
    if keep is not None:
        tied = tied[keep[tied]]
    # Enough of it, whatever the scan found, without what it found.
    tied = without(tied[: MAX_TIED + len(position)], position)[:MAX_TIED]
    return (
        np.concatenate([score, np.full(len(tied), bar, score.dtype)]),
        np.concatenate([position, tied]),
    )


def without(increasing: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`increasing` (sorted, distinct) without `values`, in order."""
    at = np.searchsorted(increasing, values)
    found = at < len(increasing)
    found[found] = increasing[at[found]] == values[found]
    keep = np.ones(len(increasing), bool)
    keep[at[found]] = False
    return increasing[keep]


def exact_first(
    scores: np.ndarray,
    ids: np.ndarray,
    queries,
    found: list,
    copy: np.ndarray | None = None,
) -> np.ndarray:
    """Puts each query's exact copies first in its results, in place
    (`copies_first`; `found[row]`: their ids in insertion order, and their
    codes); which results they are. `copy`, where given (which results are
    copies by an instance code), follows its results."""
    exact = np.zeros(ids.shape, bool)
    copy = np.zeros(ids.shape, bool) if copy is None else copy
    queries = np.asarray(queries, np.float32)
    for row, (copies, codes) in enumerate(found):
        if not len(copies):
            continue
        near = ids[row][copy[row]]  # the copies by the instance code move with theirs
        copies_first(scores, ids, exact, row, queries[row], copies, codes)
        copy[row] = np.isin(ids[row], near)
    return exact


def copies_first(
    scores: np.ndarray,
    ids: np.ndarray,
    exact: np.ndarray,
    row: int,
    query: np.ndarray,
    copies: np.ndarray,
    codes: np.ndarray,
) -> None:
    """Puts the exact copies of query `row` (`copies`, ids in insertion
    order, and their `codes`) first in its results, in place, with their
    scores, marked in `exact`; the rest keep their order."""
    block = np.arange(codes.shape[1]) * (len(query) // codes.shape[1])
    put_first(scores, ids, exact, row, copies, query[codes + block].sum(axis=1))


def put_first(
    scores: np.ndarray,
    ids: np.ndarray,
    flags: np.ndarray,
    row: int,
    first: np.ndarray,
    first_scores: np.ndarray,
) -> None:
    """Puts the ids `first`, with their scores, first in the results of
    query `row`, in place, marked in `flags`; the rest keep their order."""
    width = ids.shape[1]
    first, first_scores = first[:width], first_scores[:width]
    rest = ~np.isin(ids[row], first)
    ids[row] = np.concatenate([first, ids[row][rest]])[:width]
    scores[row] = np.concatenate([first_scores, scores[row][rest]])[:width]
    flags[row, : len(first)] = True
