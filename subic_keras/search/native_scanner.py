"""`NativeScanner`: the native exact scan (`native`) with one SIMD kernel.

The tiles hold each distinct code once (`native.group_equal`) or every
item. A filter reaches the kernel as one bit per item, and an item without
its bit is never scored exactly nor kept. When the filter keeps few items
for the batch's size, their codes are gathered into tiles of their own
first, so that the scan reads only them: gathering a row costs what
scanning dozens of rows for one query does (`GATHER_PER_QUERY`), so the share
of rows below which it pays grows with the number of queries, and once
gathered, a repeated filter scans its own tiles.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from subic_keras.search import native, workers
from subic_keras.search.scanner import Scanner
from subic_keras.search.store import CodeStore

# Rows laid out per step (the temporaries of a layout stay small).
_LAYOUT_CHUNK = 1 << 20
# A filter keeping at most this share of the items per query of the batch
# gathers them into tiles of their own, kept while the filter is repeated
# (at most `GATHER_BELOW` of the items: the copies' memory stays below the
# tiles' own); above it, the kernels skip items by their bits
# (`benchmarks/filter_speed.py` measures both sides).
GATHER_PER_QUERY = 1 / 64
GATHER_BELOW = 0.25
# Filters whose prepared scans (bits, gathered tiles) are kept: a filter
# repeated from search to search (the index caches its mask) is prepared
# once.
_PREPARED = 4


class NativeScanner(Scanner):
    """The native exact scan with one kernel (see `native`)."""

    def __init__(self, num_blocks: int, block_size: int, kernel: str):
        super().__init__(num_blocks, block_size)
        self.name, self.kernel = "native-" + kernel, kernel
        self.layout = native.Layout.for_kernel(num_blocks, block_size, kernel)
        self._tiles: np.ndarray | None = None
        self._rows = 0
        self._groups: tuple[np.ndarray, np.ndarray] | None = None
        self._row_of: np.ndarray | None = None  # each item's row, with groups
        self._prepared: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self._prepared_lock = threading.Lock()

    def _lay_out(self, store: CodeStore, start: int) -> None:
        # Rebuilt whole: a tile mixes every item's columns, and equal codes
        # (scanned once, `native.group_equal`) may be anywhere.
        grouped = native.group_equal(store.packed())
        self._lay_out_grouped(store, None if grouped is None else grouped[1:])

    def grouping(self, store: CodeStore) -> tuple[np.ndarray, np.ndarray] | None:
        with self._sync_lock:
            if self._synced[0] == store.version:
                return self._groups
        return super().grouping(store)

    def _lay_out_grouped(
        self, store: CodeStore, groups: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        self._groups = groups
        if groups is None:
            rows = np.arange(store.size)
        else:
            starts, members = groups
            rows = members[starts[:-1]]  # each distinct code's first item
        self.layout = native.Layout.for_kernel(
            self.num_blocks, self.block_size, self.kernel, len(rows)
        )
        columns = np.empty((len(rows), self.layout.columns), dtype=self.layout.dtype)
        for first in range(0, len(rows), _LAYOUT_CHUNK):
            part = slice(first, first + _LAYOUT_CHUNK)
            if self.layout.raw_bytes:
                columns[part] = store.packed(rows[part])
            else:
                columns[part] = self.layout.columns_of(store.codes(rows[part]))
        self._tiles, self._rows = self.layout.tiles(columns), len(rows)
        self._row_of = None
        with self._prepared_lock:
            self._prepared.clear()

    def _search(self, store, queries, k, keep):
        assert self._tiles is not None
        tiles, rows, groups, bits = self._tiles, self._rows, self._groups, None
        gathered = None
        if keep is not None:
            prepared = self._prepare(keep)
            share = min(GATHER_BELOW, GATHER_PER_QUERY * len(queries))
            if "gathered" in prepared:
                share = GATHER_BELOW  # gathered already: as good as free
            if prepared["count"] <= share * len(keep):
                if "gathered" not in prepared:
                    prepared["gathered"] = self._gather(np.flatnonzero(keep))
                tiles, rows, groups, gathered = prepared["gathered"]
            else:
                if "bits" not in prepared:
                    prepared["bits"] = np.packbits(keep, bitorder="little")
                bits = prepared["bits"]
        scores, positions = native.search(
            self.layout,
            tiles,
            rows,
            queries,
            k,
            workers.cores(),
            self.kernel,
            groups,
            bits,
        )
        if gathered is not None and groups is None:
            positions = gathered[positions]
        return scores, positions

    def _prepare(self, keep: np.ndarray) -> dict:
        """What the scans with the filter `keep` need, made as they need it
        and kept for the last few filters (an entry holds `keep` itself, so
        its identity names it)."""
        with self._prepared_lock:
            entry = self._prepared.get(id(keep))
            if entry is not None and entry["keep"] is keep:
                self._prepared.move_to_end(id(keep))
                return entry
            entry = {"keep": keep, "count": int(np.count_nonzero(keep))}
            self._prepared[id(keep)] = entry
            while len(self._prepared) > _PREPARED:
                self._prepared.popitem(last=False)
            return entry

    def _gather(self, kept: np.ndarray):
        """Tiles holding the codes of the items `kept` alone (increasing
        positions): `(tiles, rows, groups, rows kept)`."""
        assert self._tiles is not None
        if self._groups is None:
            rows, groups = kept, None
        else:
            # The kept items by row (the distinct code each has), each
            # row's in increasing positions, as `native.search` takes them.
            row_of = self._rows_of_items()[kept]
            order = np.argsort(row_of, kind="stable")
            rows, counts = np.unique(row_of[order], return_counts=True)
            starts = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(counts, out=starts[1:])
            groups = (starts, kept[order])
        layout = self.layout
        tile_size = layout.columns * native.TILE
        first = (rows // native.TILE) * tile_size + rows % native.TILE
        columns = self._tiles[first[:, None] + np.arange(layout.columns) * native.TILE]
        return layout.tiles(columns), len(rows), groups, rows

    def _rows_of_items(self) -> np.ndarray:
        """The row of each item (the distinct code it has), made once."""
        row_of = self._row_of
        if row_of is None:
            assert self._groups is not None
            starts, members = self._groups
            row_of = np.empty(
                len(members), np.int32 if self._rows < 2**31 else np.int64
            )
            row_of[members] = np.repeat(
                np.arange(self._rows, dtype=row_of.dtype), np.diff(starts)
            )
            self._row_of = row_of
        return row_of
