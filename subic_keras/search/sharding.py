"""Searching beyond one index: shards in one process, and result merging.

A database too large for one index is split by id range into shards
(`SubicIndex.shard`, or one `SubicIndex` built per machine from its own id
range). The global top-k is the top-k of the shards' top-k lists, so
searching each shard and merging gives the same result as one search of the
whole database:

- in one process, `ShardedSubicIndex` holds every shard still (its
  `view`), searches each for its top `k` and merges the lists by score,
  ties in shard order;
- across machines, each machine searches its own `SubicIndex` for the top
  `k` with float64 scores (`SubicIndex.search_shard`) and sends `(scores,
  ids)` (16 bytes per result) to one place, where `merge_results` keeps the
  `k` best. Ties keep the order of the lists passed, so shards given in
  insertion order merge to exactly the unsharded ranking. (Scores rounded
  to float32, as `search` returns them, may tie where the sums differ.)
  Ray actors (`ray_index.RayIndex`) merge their shards' answers so.

Both order by `order.best_order` (score, then position across the
shards), the order of one scan of the whole database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search.base import Searcher
from subic_keras.search.checks import duplicates, preview
from subic_keras.search.items import IdColumns
from subic_keras.search.order import best_first, best_order
from subic_keras.search.subic_index import SubicIndex
from subic_keras.search.views import View, top_k


class ShardedSubicIndex(Searcher):
    """Searches several `SubicIndex` shards as one.

    Each shard is searched for its top `k` (with its scanner's threads) and
    the lists are merged; scores, ties and result width are those of one
    `SubicIndex` holding every shard's items in shard order. The shards stay
    independent objects: they may be added to or removed from between
    searches, and a search waits for any such change to finish.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> index = SubicIndex(num_blocks=4, block_size=64)
    >>> ids = index.add(rng.integers(0, 64, size=(1000, 4)))
    >>> z_star = rng.random((3, 4 * 64), dtype=np.float32)
    >>> sharded = ShardedSubicIndex(index.shard(4))
    >>> [np.array_equal(a, b) for a, b in zip(sharded.search(z_star, k=100),
    ...                                       index.search(z_star, k=100))]
    [True, True]

    Args:
        shards: `SubicIndex` objects with the same `num_blocks` and
            `block_size`, and disjoint ids (e.g. from `SubicIndex.shard`).

    Raises:
        ValueError: for no shards, mismatched settings or shared ids.
        TypeError: for a shard that is not a `SubicIndex`.
    """

    def __init__(self, shards: Sequence[SubicIndex]):
        shards = list(shards)
        if not shards:
            raise ValueError("shards must hold at least one SubicIndex, received none")
        for i, shard in enumerate(shards):
            if not isinstance(shard, SubicIndex):
                raise TypeError(
                    f"shards[{i}] must be a SubicIndex, received {type(shard).__name__}"
                )
            for name in ("num_blocks", "block_size"):
                if getattr(shard, name) != getattr(shards[0], name):
                    raise ValueError(
                        "shards must share num_blocks and block_size; "
                        f"shards[0] has {name}="
                        f"{getattr(shards[0], name)}, shards[{i}] has "
                        f"{name}={getattr(shard, name)}"
                    )
        positions: dict[int, int] = {}
        for i, shard in enumerate(shards):
            if id(shard) in positions:
                # Even empty: a later add would give the same items twice.
                raise ValueError(
                    f"shards must be distinct SubicIndex objects, received the "
                    f"same one at positions {positions[id(shard)]} and {i}"
                )
            positions[id(shard)] = i
        repeated = duplicates(np.concatenate([s.get_ids() for s in shards]))
        if repeated.size:
            raise ValueError(f"shards share ids: {preview(repeated)}")
        self._shards = shards

    @property
    def shards(self) -> list[SubicIndex]:
        return list(self._shards)

    @property
    def num_blocks(self) -> int:
        return self._shards[0].num_blocks

    @property
    def block_size(self) -> int:
        return self._shards[0].block_size

    def __len__(self) -> int:
        return sum(len(s) for s in self._shards)

    @contextlib.contextmanager
    def _views(self) -> Iterator[list[View]]:
        # Every shard is held in one global lock order, whatever the order
        # of the shards: waiting writers go first, so two sharded indexes
        # taking [a, b] and [b, a] could each hold one and wait for the other.
        with contextlib.ExitStack() as stack:
            views: dict[int, View] = {}
            for i in sorted(range(len(self._shards)), key=self._rank_of):
                views[i] = stack.enter_context(self._shards[i].view())
            yield [views[i] for i in range(len(self._shards))]

    def _rank_of(self, i: int) -> int:
        return self._shards[i].lock.rank

    def _search(self, queries, k, where):
        with self._views() as views:
            ids = np.concatenate([view.ids for view in views])
            starts = np.cumsum([0] + [len(view.ids) for view in views])
            keep = None if where is None else where.mask(IdColumns(ids))
            return top_k(
                View(
                    ids, lambda q, found, kept: _merged(views, starts, q, found, kept)
                ),
                queries,
                k,
                self._query_chunk,
                keep,
            )


def _merged(
    views: list[View],
    starts: np.ndarray,
    queries: np.ndarray,
    k: int,
    keep: np.ndarray | None,
):
    """Top `k` positions over the views (of the items of `keep`, numbered
    across them), numbered across them, best first: each shard filters its
    own items inside its scan."""
    found = []
    for view, start in zip(views, starts):
        part = None if keep is None else keep[start : start + len(view.ids)]
        count = len(view.ids) if part is None else int(np.count_nonzero(part))
        if count:
            scores, positions = view.search(queries, min(k, count), part)
            found.append((scores, positions + start))
    scores = np.concatenate([f[0] for f in found], axis=1).astype(np.float64)
    positions = np.concatenate([f[1] for f in found], axis=1)
    return best_first(scores, positions, k)


def merge_results(
    results: Sequence[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merges per-shard top-k lists into the overall top-k by score.

    Equal scores keep the order of `results`, then the order within each list,
    so shards split by insertion order (`SubicIndex.shard`) and searched with
    float64 scores (`SubicIndex.search_shard`) merge to exactly the
    unsharded ranking. Slots with id -1 (missing) are ignored.

    Example:

    >>> first = (np.array([[3.0, 1.0]]), np.array([[7, 8]]))
    >>> second = (np.array([[2.0, -np.inf]]), np.array([[9, -1]]))
    >>> scores, ids = merge_results([first, second], k=3)
    >>> scores.tolist(), ids.tolist()
    ([[3.0, 2.0, 1.0]], [[7, 9, 8]])
    >>> merge_results([first, second], k=4)[1].tolist()   # 3 items for 4 slots
    [[7, 9, 8, -1]]

    Args:
        results: a list of `(scores, ids)` pairs, each `(nq, k_i)`, as
            returned by `SubicIndex.search` on each shard.
        k: results to keep per query, >= 1.

    Returns:
        `(scores, ids)`: float32 (float64 if any input is) and int64
        `(nq, min(k, w))`, where `w` is the total width of the lists, padded
        with score -inf and id -1 where they hold fewer items. A slot is
        missing by its id (-1), never by its score.

    Raises:
        ValueError: for an empty list, mismatched shapes or NaN scores.
    """
    k = check_int("k", k, minimum=1)
    results = list(results)
    if not results:
        raise ValueError("results must hold at least one (scores, ids) pair")
    all_scores, id_lists = [], []
    for i, pair in enumerate(results):
        if len(pair) != 2:
            raise ValueError(f"results[{i}] must be a (scores, ids) pair")
        scores, ids = np.asarray(pair[0]), np.asarray(pair[1])
        if scores.ndim != 2 or scores.shape != ids.shape:
            raise ValueError(
                f"results[{i}] must hold scores and ids of the same 2-D shape, "
                f"received {scores.shape} and {ids.shape}"
            )
        if scores.shape[0] != np.shape(results[0][0])[0]:
            raise ValueError(
                f"results must share the number of queries; results[0] has "
                f"{np.shape(results[0][0])[0]}, results[{i}] has {scores.shape[0]}"
            )
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"results[{i}] ids must be integers, received {ids.dtype}")
        if np.isnan(scores).any():
            raise ValueError(f"results[{i}] scores must not be NaN")
        all_scores.append(scores.astype(np.float64))
        id_lists.append(ids.astype(np.int64))
    scores = np.concatenate(all_scores, axis=1)
    ids = np.concatenate(id_lists, axis=1)
    # A missing slot is told by its id, never by its score: a real item may
    # score -inf (a query beyond float32's range), and it still ranks before
    # every missing slot, which comes after every column.
    missing = ids < 0
    columns = np.arange(ids.shape[1]) + np.where(missing, ids.shape[1], 0)
    order = best_order(np.where(missing, -np.inf, scores), columns, k)
    dtype = np.result_type(*[np.asarray(pair[0]).dtype for pair in results], np.float32)
    out_scores = np.take_along_axis(scores, order, axis=1).astype(dtype)
    merged = np.take_along_axis(ids, order, axis=1)
    out_scores[merged < 0] = -np.inf
    return out_scores, merged
