"""What an `ImageIndex` answers as one shard of a sharded search.

A Ray shard of a folder's pictures (`RayIndex`) is an `ImageIndex`: these
methods are `SubicIndex`'s shard answers (`shard_answers`) among the
pictures a filter on the item table keeps, and the exact copies of the
queries by fingerprint (`_copies`, which the index's own answers use too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from subic_keras.search import filters
from subic_keras.search.instance_codes import InstanceCodes, shard_part

if TYPE_CHECKING:
    from subic_keras.search.items import ItemTable
    from subic_keras.search.subic_index import SubicIndex


class PictureShardAnswers:
    """The shard side of a sharded search, mixed into `ImageIndex`."""

    if TYPE_CHECKING:
        _lock: Any
        _items: ItemTable
        _codes: SubicIndex
        _instance: InstanceCodes | None

    def search_shard(
        self, queries, k: int, *, where=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`SubicIndex.search_shard` among the pictures `where` keeps."""
        where = filters.as_filter(where)
        with self._lock.read():
            keep = None if where is None else self._items.mask(where)
            return self._codes.search_kept(queries, k, keep, dtype=np.float64)

    def shard_both(self, queries, instance_queries, k: int, *, where=None) -> dict:
        """`instance_codes.shard_part` among the pictures `where` keeps: this
        shard's part of an answer by both codes."""
        where = filters.as_filter(where)
        with self._lock.read():
            keep = None if where is None else self._items.mask(where)
            if self._instance is None:
                raise ValueError("this shard keeps no instance codes")
            return shard_part(
                self._codes, self._instance, queries, instance_queries, k, keep,
                self._items.rows, keys=True,
            )  # fmt: skip

    def shard_copies(self, fingerprints, k: int, *, where=None) -> list:
        """Per query fingerprint, the first `k` pictures `where` keeps whose
        pixels have it, in insertion order: `(positions, ids, codes)`."""
        where = filters.as_filter(where)
        with self._lock.read():
            keep = None if where is None else self._items.mask(where)
            return self._copies(fingerprints, keep, k)

    def _copies(self, fingerprints, keep, k: int) -> list:
        """Per fingerprint, the first `k` pictures `keep` keeps whose pixels
        have it, in insertion order: `(positions, ids, codes)` (locked)."""
        keys, found = self._items.keys(), []
        for value in np.asarray(fingerprints, np.uint64):
            rows = keys.fingerprint_rows(value) if value else np.zeros(0, np.int64)
            if keep is not None:
                rows = rows[keep[rows]]
            rows = rows[:k]  # the class codes' positions too
            found.append((rows, self._items.ids[rows], self._codes.codes_at(rows)))
        return found
