"""`SubicIndex`: SuBiC codes, bit-packed in memory, searched with faiss.

The reference backend of `subic_keras.search`: exact scores from faiss's
product-quantizer scans (`engines`), the conventions of `base`, and the
`.subic` file format of `file_format`.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from subic_keras._validation import check_block_shape, check_int
from subic_keras.search import engines, file_format, packing
from subic_keras.search.base import (
    ReadWriteLock,
    SearchBackend,
    check_block_size,
    check_codes,
    check_ids,
    check_queries,
    duplicates,
    preview,
    search_codes_with,
)

_DEFAULT_ADD_CHUNK = 65_536
_DEFAULT_SEARCH_CHUNK = 1_024


class SubicIndex(SearchBackend):
    """Searchable database of SuBiC codes, scored by `score = sum_m z*[m*K + c_m]`.

    Codes are stored bit-packed (`M * log2 K` bits) in a faiss index; see the
    `subic_keras.search` docstring for the engines, conventions, file format
    and sharding.
    Searches may run from several threads at once; `add` and `remove` wait
    for running searches and block new ones while they change the index.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> index = SubicIndex(num_blocks=8, block_size=256)
    >>> ids = index.add(rng.integers(0, 256, size=(1000, 8)))  # ids 0..999
    >>> z_star = rng.random((2, 8 * 256), dtype=np.float32)  # SuBiC's queries
    >>> scores, ids = index.search(z_star, k=10)
    >>> ids.shape, bool(np.all(np.diff(scores, axis=1) <= 0))
    ((2, 10), True)

    Args:
        num_blocks: `M`, blocks per code (>= 1).
        block_size: `K`, a power of two in [2, 1024].
        exact: the faiss engine that stores the codes, and searches them
            when the native scan is not built (or `SUBIC_NATIVE=0`); with
            the native scan every search is exact. `True` forces faiss's
            exact scan. `None` (default) uses the fast-scan path when
            `block_size == 16` (and `num_blocks <= 256`) and the exact scan
            otherwise; `False` requires the fast-scan path.
        shortlist: fast-scan candidates re-scored exactly per query, at least
            `k`; `None` means `max(2k, k + 64)`. Only for faiss's fast-scan
            path.
        add_chunk_size: items encoded and added per step, which bounds the
            temporary memory of `add`.
        search_chunk_size: queries searched per step.

    Raises:
        ValueError: for a bad block shape, or `exact`/`shortlist` that do not
            fit the block shape.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        exact: bool | None = None,
        shortlist: int | None = None,
        *,
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ):
        num_blocks, block_size = check_block_shape(num_blocks, block_size)
        check_block_size(block_size)
        if exact is not None and not isinstance(exact, (bool, np.bool_)):
            raise TypeError(f"exact must be True, False or None, received {exact!r}")
        fast_possible = block_size == 16 and num_blocks <= engines.FAST_SCAN_MAX_BLOCKS
        if exact is False and not fast_possible:
            raise ValueError(
                "exact=False selects the 4-bit fast-scan path, which needs "
                f"block_size == 16 and num_blocks <= {engines.FAST_SCAN_MAX_BLOCKS}, "
                f"received block_size={block_size}, num_blocks={num_blocks}"
            )
        exact = (not fast_possible) if exact is None else bool(exact)
        if shortlist is not None:
            shortlist = check_int("shortlist", shortlist, minimum=1)
            if exact:
                raise ValueError(
                    "shortlist only applies to the fast-scan path (block_size 16, "
                    f"exact=False); received shortlist={shortlist} with exact=True"
                )
        self._num_blocks, self._block_size = num_blocks, block_size
        self._nbits = block_size.bit_length() - 1
        self._exact = exact
        self._shortlist = shortlist
        self._add_chunk = check_int("add_chunk_size", add_chunk_size, minimum=1)
        self._search_chunk = check_int(
            "search_chunk_size", search_chunk_size, minimum=1
        )
        self._engine: engines.FlatEngine | engines.FastScanEngine
        if exact:
            self._engine = engines.FlatEngine(num_blocks, block_size, self._nbits)
        else:
            self._engine = engines.FastScanEngine(num_blocks, block_size, shortlist)
        self._ids = np.empty(0, dtype=np.int64)
        self._size = 0
        self._max_id = -1  # largest id present; default ids continue after it
        self._lock = ReadWriteLock()

    # Properties ---------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def exact(self) -> bool:
        """Whether searches use the exact scan (else the fast-scan path)."""
        return self._exact

    @property
    def shortlist(self) -> int | None:
        return self._shortlist

    @property
    def code_size(self) -> int:
        """Bytes of one bit-packed code: `ceil(M * log2(K) / 8)`."""
        return self._engine.code_size

    @property
    def bytes_per_item(self) -> int:
        """In-memory bytes per item: the stored code plus its int64 id."""
        return self._engine.stored_size + 8

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"SubicIndex(num_blocks={self._num_blocks}, "
            f"block_size={self._block_size}, exact={self._exact}, "
            f"shortlist={self._shortlist}, items={self._size})"
        )

    # Mutation -----------------------------------------------------------

    def add(self, codes, ids=None) -> np.ndarray:
        """Adds codes to the index.

        Everything is validated before the index changes, so a rejected call
        leaves it as it was.

        Example:

        >>> index = SubicIndex(num_blocks=4, block_size=8)
        >>> index.add(np.array([[3, 0, 7, 1]]), ids=[42])
        array([42])
        >>> len(index)
        1

        Args:
            codes: integer codes `(n, M)` with values in `[0, K)`, or real
                per-block vectors / one-hot codes `(n, M*K)`, converted by
                per-block argmax (lowest index on ties).
            ids: int64 ids `(n,)`, >= 0 and unique. Default: consecutive ids
                after the largest id in the index (0 for an empty index).

        Returns:
            The int64 ids of the added items.

        Raises:
            ValueError: for a wrong shape or dtype, values outside `[0, K)`,
                NaN or inf, negative ids, or ids already in the index or
                repeated in `ids` (the message names them).
        """
        codes = check_codes(
            "codes", codes, self._num_blocks, self._block_size, self._add_chunk
        )
        n = len(codes)
        if ids is not None:
            ids = check_ids("ids", ids, length=n)
            repeated = duplicates(ids)
            if repeated.size:
                raise ValueError(f"ids must be unique, repeated: {preview(repeated)}")
        with self._lock.write():
            limit = engines.FAST_SCAN_MAX_ITEMS
            if not self._exact and self._size + n >= limit:
                raise ValueError(
                    f"the fast-scan path holds fewer than {limit} "
                    f"items (a faiss limit); this add would reach {self._size + n}. "
                    "Split the database with ShardedSubicIndex or use exact=True"
                )
            if ids is None:
                start = self._max_id + 1
                if start > np.iinfo(np.int64).max - n:
                    raise ValueError("default ids would overflow int64")
                ids = np.arange(start, start + n, dtype=np.int64)
            elif n and int(ids.min()) <= self._max_id:
                clash = ids[np.isin(ids, self._ids[: self._size])]
                if clash.size:
                    raise ValueError(f"ids already in the index: {preview(clash)}")
            self._append(codes, ids)
        return ids

    def _append(self, codes: np.ndarray, ids: np.ndarray) -> None:
        """Adds validated codes; undoes a partial add if faiss fails."""
        before = self._engine.ntotal
        try:
            for start in range(0, len(codes), self._add_chunk):
                chunk = codes[start : start + self._add_chunk]
                self._engine.add_packed(packing.pack(chunk, self._nbits))
        except BaseException:
            if self._engine.ntotal > before:
                self._engine.remove_range(before, self._engine.ntotal)
            raise
        needed = self._size + len(ids)
        if needed > len(self._ids):
            grown = np.empty(max(needed, 2 * len(self._ids)), dtype=np.int64)
            grown[: self._size] = self._ids[: self._size]
            self._ids = grown
        self._ids[self._size : needed] = ids
        self._size = needed
        if len(ids):
            self._max_id = max(self._max_id, int(ids.max()))

    def remove(self, ids) -> int:
        """Removes items by id; all or nothing.

        Args:
            ids: ids to remove (1-D integers, repeats allowed).

        Returns:
            The number of items removed.

        Raises:
            KeyError: if any id is not in the index (none is removed).
        """
        ids = np.unique(check_ids("ids", ids))
        with self._lock.write():
            existing = self._ids[: self._size]
            present = np.isin(existing, ids)
            if int(present.sum()) != len(ids):
                missing = ids[~np.isin(ids, existing)]
                raise KeyError(f"ids not in the index: {preview(missing)}")
            if not ids.size:
                return 0
            self._engine.remove_positions(np.flatnonzero(present))
            kept = existing[~present]
            self._ids = kept.copy()
            self._size = len(kept)
            self._max_id = int(kept.max()) if len(kept) else -1
        return len(ids)

    # Reading ------------------------------------------------------------

    def get_ids(self) -> np.ndarray:
        """Returns a copy of the ids, in insertion order."""
        with self._lock.read():
            return self._ids[: self._size].copy()

    def get_codes(self, ids=None) -> np.ndarray:
        """Returns stored integer codes `(n, M)` (int64).

        Args:
            ids: ids to look up, in the order wanted; `None` returns every
                code in insertion order (the order of `get_ids()`).

        Raises:
            KeyError: if an id is not in the index.
        """
        if ids is not None:
            ids = check_ids("ids", ids)
        with self._lock.read():
            if ids is None:
                positions = np.arange(self._size)
            else:
                positions = self._positions(ids)
            out = np.empty((len(positions), self._num_blocks), dtype=np.int64)
            for start in range(0, len(positions), self._add_chunk):
                chunk = positions[start : start + self._add_chunk]
                out[start : start + len(chunk)] = self._engine.codes(chunk)
            return out

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        """Positions of `ids` in insertion order; KeyError for unknown ids."""
        existing = self._ids[: self._size]
        # Sentinel -1 never matches: ids are validated >= 0.
        existing_or_none = np.append(existing, -1)
        order = np.argsort(existing, kind="stable")
        rank = np.searchsorted(existing, ids, sorter=order)
        positions = np.append(order, self._size)[rank]
        found = existing_or_none[positions] == ids
        if not found.all():
            raise KeyError(f"ids not in the index: {preview(ids[~found])}")
        return positions

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Asymmetric search: the `k` best codes for each real query `z*`.

        `score(z*, c) = sum_m z*[m*K + c_m]`; highest first, equal scores in
        insertion order. Scores are exact on both engines.

        Example:

        >>> index = SubicIndex(num_blocks=2, block_size=4)
        >>> ids = index.add(np.array([[0, 1], [2, 3]]), ids=[10, 11])
        >>> z_star = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
        >>> scores, ids = index.search(z_star, k=3)   # 5 + 1 = 6 for id 11
        >>> scores.tolist(), ids.tolist()             # k > len(index): both items
        ([[6.0, 0.0]], [[11, 10]])

        Args:
            queries: real `(nq, M*K)` array (e.g. SuBiC's ReLU output `z*`).
            k: results per query, >= 1; a `k` beyond `len(self)` returns
                every item.

        Returns:
            `(scores, ids)`: float32 and int64 `(nq, min(k, len(self)))`.

        Raises:
            ValueError: for a bad shape, NaN/inf queries or `k < 1`.
        """
        k = check_int("k", k, minimum=1)
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        with self._lock.read():
            return self._search(queries, k)

    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return engines.top_k(
            self._engine, self._ids[: self._size], queries, k, self._search_chunk
        )

    # `score_all` reads the ids and searches under one read lock.
    def _snapshot(self):
        return self._lock.read()

    def _snapshot_ids(self) -> np.ndarray:
        return self._ids[: self._size].copy()

    def _snapshot_search(self, queries, k: int):
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        return self._search(queries, k)

    def search_codes(self, codes, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Symmetric search: ranks stored codes by the number of equal blocks.

        `score(q, c) = #{m : q_m == c_m}`, an integer in `[0, M]`; highest
        first, equal scores in insertion order.

        Args:
            codes: query codes, in any form `add` accepts.
            k: results per query, >= 1; a `k` beyond `len(self)` returns
                every item.

        Returns:
            `(scores, ids)`: int32 and int64 `(nq, min(k, len(self)))`.
        """
        k = check_int("k", k, minimum=1)
        codes = check_codes("codes", codes, self._num_blocks, self._block_size)
        with self._lock.read():
            return search_codes_with(
                self._search,
                codes,
                min(k, self._size),
                self._block_size,
                self._search_chunk,
            )

    # Sharding -----------------------------------------------------------

    def shard(self, num_shards: int) -> list[SubicIndex]:
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
            bounds = np.linspace(0, self._size, num_shards + 1).astype(np.int64)
            shards = []
            for lo, hi in itertools.pairwise(bounds):
                shard = self._empty_like()
                for start in range(lo, hi, self._add_chunk):
                    stop = min(hi, start + self._add_chunk)
                    shard._append(
                        self._engine.codes(slice(start, stop)).astype(np.uint16),
                        self._ids[start:stop],
                    )
                shards.append(shard)
        return shards

    def _empty_like(self) -> SubicIndex:
        return SubicIndex(
            self._num_blocks,
            self._block_size,
            exact=self._exact,
            shortlist=self._shortlist,
            add_chunk_size=self._add_chunk,
            search_chunk_size=self._search_chunk,
        )

    # Persistence --------------------------------------------------------

    def save(
        self, path: str | os.PathLike, items: file_format.ItemTable | None = None
    ) -> None:
        """Writes the index atomically in the versioned `.subic` format.

        The byte layout is specified in `subic_keras.search.file_format`.

        Args:
            path: destination file; replaced only once fully written.
            items: what an `ImageIndex` records of each item (paths and
                fingerprints, in insertion order); `None` writes codes and
                ids only (format version 1).
        """
        with self._lock.read():
            header = file_format.Header(
                self._num_blocks,
                self._block_size,
                self._exact,
                self._size,
                self._shortlist,
            )
            chunks = (
                self._engine.packed(slice(start, start + self._add_chunk))
                for start in range(0, self._size, self._add_chunk)
            )
            if items is not None and len(items.paths) != self._size:
                raise ValueError(
                    f"items must describe the index's {self._size} items, "
                    f"received {len(items.paths)} paths"
                )
            file_format.write(path, header, chunks, self._ids[: self._size], items)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ) -> SubicIndex:
        """Reads an index written by `save`, verifying it first.

        Args:
            path: a file written by `SubicIndex.save`.
            add_chunk_size: as in the constructor.
            search_chunk_size: as in the constructor.

        Returns:
            The `SubicIndex`, with the same codes, ids, order and settings.

        Raises:
            ValueError: naming the path, if the file is not a SuBiC index, has
                an unsupported version, is truncated or fails its checksum.
        """
        header, packed, ids, _ = file_format.read(path)
        return cls.from_parts(
            path,
            header,
            packed,
            ids,
            add_chunk_size=add_chunk_size,
            search_chunk_size=search_chunk_size,
        )

    @classmethod
    def from_parts(
        cls,
        path: str | os.PathLike,
        header: file_format.Header,
        packed: np.ndarray,
        ids: np.ndarray,
        *,
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ) -> SubicIndex:
        """The index of what `file_format.read(path)` returned (the path
        names the file in errors)."""
        try:
            index = cls(
                header.num_blocks,
                header.block_size,
                exact=header.exact,
                shortlist=header.shortlist,
                add_chunk_size=add_chunk_size,
                search_chunk_size=search_chunk_size,
            )
        except ValueError as error:
            raise ValueError(
                f"{os.fspath(path)!r} is not a valid SuBiC index file: {error}"
            ) from error
        for start in range(0, header.size, index._add_chunk):
            index._engine.add_packed(packed[start : start + index._add_chunk].copy())
        index._ids, index._size = ids, header.size
        index._max_id = int(ids.max()) if header.size else -1
        return index
