"""What a `SubicIndex` answers as one shard of a sharded search.

A sharded search (`sharding.ShardedSubicIndex` in one process, `RayIndex`
across machines) asks each shard for its best with float64 scores and
merges them (`sharding.merge_results`): `search_shard` is each shard's
side of that exchange, and `shard` splits an index into shards in the
first place.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from subic_keras._validation import check_int

if TYPE_CHECKING:
    from subic_keras.search.store import CodeStore


class ShardAnswers:
    """The shard side of a sharded search, mixed into `SubicIndex`."""

    if TYPE_CHECKING:
        _store: CodeStore
        _add_chunk: int
        _lock: Any

        def _checked_search(self, queries, k, where, dtype=np.float32): ...
        def _empty_like(self) -> Any: ...
        def __len__(self) -> int: ...

    def search_shard(
        self, queries, k: int, *, where=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`search` with float64 scores: what a shard sends to
        `sharding.merge_results`.

        The scans sum in float64; `search` rounds the sums to float32, where
        two different sums can become equal (1 + 2**-30 and 1) and a merge
        could no longer tell which came first. Merged from these, shards
        given in insertion order rank exactly as one index would.
        """
        return self._checked_search(queries, k, where, dtype=np.float64)

    # Sharding -----------------------------------------------------------

    def shard(self, num_shards: int) -> list:
        """Splits the items into `num_shards` indexes by insertion order.

        Shard `s` holds a contiguous run of items (sizes differ by at most
        one), with the same settings. Searching every shard and merging with
        `merge_results` gives the same results as searching this index (up
        to which of several items tied exactly at the k-th score are kept).

        Args:
            num_shards: >= 1.

        Returns:
            A list of new `SubicIndex` objects.
        """
        num_shards = check_int("num_shards", num_shards, minimum=1)
        with self._lock.read():
            bounds = np.linspace(0, len(self), num_shards + 1).astype(np.int64)
            shards = []
            for lo, hi in itertools.pairwise(bounds):
                shard = self._empty_like()
                for start in range(lo, hi, self._add_chunk):
                    rows = slice(start, min(hi, start + self._add_chunk))
                    shard._store.append(self._store.packed(rows), self._store.ids[rows])
                shards.append(shard)
        return shards
