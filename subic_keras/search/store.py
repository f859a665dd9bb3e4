"""`CodeStore`: bit-packed SuBiC codes and their ids, in insertion order.

Exactly what a `.subic` file holds (`file_format`): one row of
`code_size = ceil(M * log2 K / 8)` bytes per item (`packing`) and an
int64 id per row. Scanners (`scanners`) read it and keep their own layouts of it,
rebuilt when `version` says it changed; the store itself takes no lock (the
index that owns it does).
"""

from __future__ import annotations

import numpy as np

from subic_keras.search import packing
from subic_keras.search.checks import preview


class CodeStore:
    """Packed codes `(n, code_size)` and ids `(n,)`, growing by doubling.

    Args:
        num_blocks: `M`.
        block_size: `K`, a power of two.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.nbits = block_size.bit_length() - 1
        self.code_size = packing.code_size(num_blocks, self.nbits)
        self._packed = np.zeros((0, self.code_size), dtype=np.uint8)
        self._ids = np.zeros(0, dtype=np.int64)
        self._same: tuple[int, np.ndarray, np.ndarray] | None = None
        self.size = 0
        self.max_id = -1  # the largest id present; default ids continue after it
        # `version` changes with every change; `removals` only when rows
        # move, so a scanner may extend its layout over appended rows.
        self.version = 0
        self.removals = 0

    @property
    def ids(self) -> np.ndarray:
        """The ids, in insertion order (a view: copy it to keep it)."""
        return self._ids[: self.size]

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Positions of `ids` (checked, >= 0) in insertion order; KeyError
        for ids not stored."""
        existing = self.ids
        # Sentinel -1 never matches: ids are validated >= 0.
        existing_or_none = np.append(existing, -1)
        order = np.argsort(existing, kind="stable")
        rank = np.searchsorted(existing, ids, sorter=order)
        positions = np.append(order, len(existing))[rank]
        found = existing_or_none[positions] == ids
        if not found.all():
            raise KeyError(f"ids not in the index: {preview(ids[~found])}")
        return positions

    def packed(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """Packed codes of `rows` (positions), a view for a slice."""
        return self._packed[: self.size][rows]

    def codes(
        self, rows: slice | np.ndarray = slice(None), dtype=np.int64
    ) -> np.ndarray:
        """Integer codes `(..., M)` of `rows`, any shape of positions."""
        packed = self.packed(rows)
        flat = packed.reshape(-1, self.code_size)
        codes = packing.unpack(flat, self.num_blocks, self.nbits, dtype)
        return codes.reshape((*packed.shape[:-1], self.num_blocks))

    def same_codes(self, positions: np.ndarray) -> np.ndarray:
        """Every position whose code equals the code at one of `positions`
        (those included), increasing."""
        return self.with_codes(self.packed(np.asarray(positions, np.int64)))

    def with_codes(self, packed: np.ndarray) -> np.ndarray:
        """Every position whose packed code is one of the rows `packed`,
        increasing.

        The codes' keys are sorted once per version of the store, then each
        lookup is a binary search.
        """
        if not len(packed):
            return np.zeros(0, np.int64)
        order, sorted_keys = self.by_first_bytes()
        wanted = np.unique(_keys(packed))
        lo = np.searchsorted(sorted_keys, wanted, side="left")
        hi = np.searchsorted(sorted_keys, wanted, side="right")
        if len(wanted) == 1:  # one key's items, in increasing positions already
            found = order[lo[0] : hi[0]]
        else:
            found = np.sort(
                order[np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])]
            )
        if self.code_size > 8:  # keys are the first 8 bytes: check the rest
            rows = self.packed()
            equal = (rows[found][:, None] == packed[None]).all(-1).any(-1)
            found = found[equal]
        return found.astype(np.int64)

    def by_first_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """The positions (int64) by their codes' first 8 bytes read as one
        uint64 (`_keys`), equal ones in increasing positions, and those
        words, increasing: sorted once per version of the store."""
        if self._same is None or self._same[0] != self.version:
            keys = _keys(self.packed())
            order = np.argsort(keys, kind="stable")
            self._same = (self.version, order, keys[order])
        return self._same[1], self._same[2]

    def append(self, packed: np.ndarray, ids: np.ndarray) -> None:
        """Appends checked packed codes and ids (as many of each)."""
        needed = self.size + len(ids)
        if needed > len(self._ids):
            capacity = max(needed, 2 * len(self._ids), 1024)
            grown_packed = np.empty((capacity, self.code_size), dtype=np.uint8)
            grown_packed[: self.size] = self._packed[: self.size]
            grown_ids = np.empty(capacity, dtype=np.int64)
            grown_ids[: self.size] = self._ids[: self.size]
            self._packed, self._ids = grown_packed, grown_ids
        self._packed[self.size : needed] = packed
        self._ids[self.size : needed] = ids
        self.size = needed
        if len(ids):
            self.max_id = max(self.max_id, int(ids.max()))
        self.version += 1

    def truncate(self, size: int) -> None:
        """Drops the rows from `size` on (undoes a failed append)."""
        self.size = size
        self.max_id = int(self.ids.max()) if size else -1
        self.removals += 1
        self.version += 1

    def keep(self, mask: np.ndarray) -> None:
        """Keeps the rows where `mask` is true, in order."""
        self._packed = self.packed()[mask].copy()
        self._ids = self.ids[mask].copy()
        self.truncate(len(self._ids))


def _keys(packed: np.ndarray) -> np.ndarray:
    """One uint64 per row of packed codes: its first 8 bytes."""
    width = min(8, packed.shape[1])
    words = np.zeros((len(packed), 8), np.uint8)
    words[:, :width] = packed[:, :width]
    return words.view(np.uint64).ravel()
