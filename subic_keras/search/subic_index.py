"""`SubicIndex`: SuBiC codes, bit-packed in memory, searched by a scanner.

The reference backend of `subic_keras.search`: a `CodeStore` (packed codes
and ids, as the `.subic` file format of `file_format` holds them) ranked by
one of the `scanners` (the native exact scan, or faiss's), with the
conventions of `base`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

from subic_keras._validation import check_block_shape, check_int
from subic_keras.search import file_format, filters, native, packing, scanners
from subic_keras.search.base import SearchBackend
from subic_keras.search.checks import (
    check_block_size,
    check_ids,
    check_num_blocks,
    check_queries,
    preview,
)
from subic_keras.search.items import IdColumns
from subic_keras.search.locks import ReadWriteLock
from subic_keras.search.native import SecondCode
from subic_keras.search.shard_answers import ShardAnswers
from subic_keras.search.store import CodeStore
from subic_keras.search.views import View, every_score, tie_ordered_top_k, top_k
from subic_keras.search.writer_records import WriterRecords

_DEFAULT_ADD_CHUNK = 65_536
_DEFAULT_SEARCH_CHUNK = 1_024


class SubicIndex(WriterRecords, ShardAnswers, SearchBackend):
    """Searchable database of SuBiC codes, scored by `score = sum_m z*[m*K + c_m]`.

    Codes are stored bit-packed (`M * log2 K` bits) with an int64 id each,
    and ranked by a scanner (`subic_keras.search.scanners`); see the
    `subic_keras.search` docstring for the conventions, file format and
    sharding. Searches may run from several threads at once; `add` and
    `remove` wait for running searches and block new ones while they
    change the index.

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
        scanner: what ranks the codes: `"auto"` (default, the fastest this
            CPU and build run), a native kernel (`"native-vbmi"`,
            `"native-avx512bw"`, `"native-avx2"`, `"native-neon"`,
            `"native-portable"`: exact),
            `"faiss"` (exact) or `"faiss-fastscan"` (`K = 16`: a shortlist
            re-scored exactly). `scanners.available(M, K)` lists those this
            machine runs.
        shortlist: candidates per query that `"faiss-fastscan"` re-scores,
            at least `k`; `None` means `max(2k, k + 64)`.
        add_chunk_size: items encoded and added per step, which bounds the
            temporary memory of `add`.
        search_chunk_size: queries searched per step.

    Raises:
        ValueError: for a bad block shape, a scanner this machine cannot
            run (the message names those it can), or a `shortlist` without
            `"faiss-fastscan"`.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        scanner: str = "auto",
        *,
        shortlist: int | None = None,
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ):
        num_blocks, block_size = check_block_shape(num_blocks, block_size)
        check_block_size(block_size)
        check_num_blocks(num_blocks)
        if not isinstance(scanner, str):
            raise TypeError(f"scanner must be a string, received {scanner!r}")
        name = scanners.resolve(scanner, num_blocks, block_size)
        if shortlist is not None:
            shortlist = check_int("shortlist", shortlist, minimum=1)
            if name != "faiss-fastscan":
                raise ValueError(
                    "shortlist only applies to scanner='faiss-fastscan'; received "
                    f"shortlist={shortlist} with scanner={name!r}"
                )
        self._num_blocks, self._block_size = num_blocks, block_size
        self._nbits = block_size.bit_length() - 1
        self._shortlist = shortlist
        self._add_chunk = check_int("add_chunk_size", add_chunk_size, minimum=1)
        # The base class's: queries per step of search and search_codes.
        self._query_chunk = check_int("search_chunk_size", search_chunk_size, minimum=1)
        self._store = CodeStore(num_blocks, block_size)
        self._scanner = scanners.make(name, num_blocks, block_size, shortlist)
        self._lock = ReadWriteLock()
        self._masks = filters.MaskCache()
        # Read from a file of an earlier version that held its items'
        # looks, which this version reads past (`file_format`).
        self.written_with_looks = False

    # Properties ---------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def scanner(self) -> str:
        """The scanner's name (what `"auto"` chose, if it was asked)."""
        return self._scanner.name

    @property
    def shortlist(self) -> int | None:
        return self._shortlist

    @property
    def code_size(self) -> int:
        """Bytes of one bit-packed code: `ceil(M * log2(K) / 8)`."""
        return self._store.code_size

    @property
    def bytes_per_item(self) -> int:
        """Stored bytes per item: the packed code and its int64 id."""
        return self._store.code_size + 8

    @property
    def lock(self) -> ReadWriteLock:
        """The index's lock; `view` holds it for reading. Code that holds
        several indexes' locks takes them in the order of `lock.rank`."""
        return self._lock

    def __len__(self) -> int:
        return self._store.size

    def __repr__(self) -> str:
        return (
            f"SubicIndex(num_blocks={self._num_blocks}, "
            f"block_size={self._block_size}, scanner={self.scanner!r}, "
            f"items={len(self)})"
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
        codes, ids = self._checked_additions(codes, ids)
        n = len(codes)
        with self._lock.write():
            store = self._store
            if ids is None:
                start = store.max_id + 1
                if start > np.iinfo(np.int64).max - n:
                    raise ValueError("default ids would overflow int64")
                ids = np.arange(start, start + n, dtype=np.int64)
            elif n and int(ids.min()) <= store.max_id:
                clash = ids[np.isin(ids, store.ids)]
                if clash.size:
                    raise ValueError(f"ids already in the index: {preview(clash)}")
            self._append(codes, ids)
        return ids

    def _append(self, codes: np.ndarray, ids: np.ndarray) -> None:
        """Adds validated codes; undoes a partial add if packing fails."""
        before = self._store.size
        try:
            for start in range(0, len(codes), self._add_chunk):
                stop = start + self._add_chunk
                packed = packing.pack(codes[start:stop], self._nbits)
                self._store.append(packed, ids[start:stop])
        except BaseException:
            if self._store.size > before:
                self._store.truncate(before)
            raise

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
            present = np.isin(self._store.ids, ids)
            if int(present.sum()) != len(ids):
                missing = ids[~np.isin(ids, self._store.ids)]
                raise KeyError(f"ids not in the index: {preview(missing)}")
            if ids.size:
                self._store.keep(~present)
        return len(ids)

    # Reading ------------------------------------------------------------

    def get_ids(self) -> np.ndarray:
        """Returns a copy of the ids, in insertion order."""
        with self._lock.read():
            return self._store.ids.copy()

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
                positions = np.arange(len(self))
            else:
                positions = self._store.positions(ids)
            out = np.empty((len(positions), self._num_blocks), dtype=np.int64)
            for start in range(0, len(positions), self._add_chunk):
                chunk = positions[start : start + self._add_chunk]
                out[start : start + len(chunk)] = self._store.codes(chunk)
            return out

    def search(self, queries, k: int, *, where=None) -> tuple[np.ndarray, np.ndarray]:
        """Asymmetric search: the `k` best codes for each real query `z*`.

        `score(z*, c) = sum_m z*[m*K + c_m]`; highest first, equal scores in
        insertion order. Scores are exact with every scanner.

        Example:

        >>> index = SubicIndex(num_blocks=2, block_size=4)
        >>> ids = index.add(np.array([[0, 1], [2, 3]]), ids=[10, 11])
        >>> z_star = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
        >>> scores, ids = index.search(z_star, k=3)   # 5 + 1 = 6 for id 11
        >>> scores.tolist(), ids.tolist()             # k > len(index): both items
        ([[6.0, 0.0]], [[11, 10]])
        >>> index.search(z_star, k=3, where="id < 11")[1].tolist()
        [[10]]

        Args:
            queries: real `(nq, M*K)` array (e.g. SuBiC's ReLU output `z*`).
            k: results per query, >= 1; a `k` beyond `len(self)` returns
                every item.
            where: ids, or a filter on `id` (`subic_keras.search.filters`):
                the exact top `k` among those items.

        Returns:
            `(scores, ids)`: float32 and int64 `(nq, min(k, n))`, `n` the
            number of items searched.

        Raises:
            ValueError: for a bad shape, NaN/inf queries, `k < 1`, or a
                filter on a field other than `id`.
        """
        return self._checked_search(queries, k, where)

    def _checked_search(self, queries, k, where, dtype=np.float32):
        """`_search` of arguments checked here (`Searcher.search`'s checks)."""
        k = self._check_k(k)
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        return self._search(queries, k, filters.as_filter(where), dtype)

    def _search(self, queries, k, where, dtype=np.float32):
        with self.view() as view:
            keep = None if where is None else self._mask(view, where)
            return self._top_k(view, queries, k, keep, dtype)

    def _mask(self, view: View, where: filters.Filter) -> np.ndarray | None:
        state = (self._store.version, self._store.removals)
        return self._masks.mask(where, IdColumns(view.ids), state)

    def _top_k(self, view: View, queries, k: int, keep, dtype=np.float32, key=None):
        """`top_k` (scores of `dtype`), or equal scores ordered by `key`
        (`tie_ordered_top_k`)."""
        if key is not None:
            return tie_ordered_top_k(
                view, self._store, queries, k, keep, key, self._query_chunk
            )
        return top_k(view, queries, k, self._query_chunk, keep, dtype)

    def search_kept(
        self, queries, k: int, keep: np.ndarray | None, key=None, dtype=np.float32
    ) -> tuple[np.ndarray, np.ndarray]:
        """`search` among the items where `keep` (one boolean per item, in
        insertion order, the order of `get_ids()`) is true: what an index
        with its own item table (`ImageIndex`) filters with; `keep=None`
        searches every item. `key` (a `native.SecondCode`), where given, orders equal
        scores (`views.tie_ordered_top_k`)."""
        k = self._check_k(k)
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        with self.view() as view:
            if keep is not None and np.shape(keep) != view.ids.shape:
                raise ValueError(
                    f"keep must hold one boolean per item ({len(view.ids)}), "
                    f"received shape {np.shape(keep)}"
                )
            if keep is not None:
                keep = np.asarray(keep, bool)
            return self._top_k(view, queries, k, keep, dtype, key)

    def second_code(self, queries: np.ndarray) -> SecondCode:
        """Its codes and `queries` (checked), as what orders another index's
        equal scores (`search_kept(key=...)`, the same items at the same
        positions), under the lock of a search that holds it still."""
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        return SecondCode(self._store.packed(), self._nbits, queries)

    def scores_at(self, query: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Scores (float64) of one query for the items at insertion positions
        (1-D), under the lock of a search that holds the index still."""
        return native.score_rows(self._store.packed(), positions, query, self._nbits)

    def codes_at(self, positions: np.ndarray) -> np.ndarray:
        """Integer codes `(n, M)` (int64) of the items at insertion positions
        (1-D), under the lock of a search that holds the index still: no
        look-up of ids (`get_codes` sorts them all)."""
        return self._store.codes(np.asarray(positions, np.int64))

    def _scan(self, queries: np.ndarray, k: int, keep: np.ndarray | None = None):
        """The scanner's top `k` scores and positions (locked)."""
        return self._scanner.search(self._store, queries, k, keep)

    @contextlib.contextmanager
    def view(self) -> Iterator[View]:
        """Holds the index still (its read lock) and yields a `View` of it:
        the ids, and the exact search of positions into them."""
        with self._lock.read():
            yield View(self._store.ids, self._scan)

    def score_all(self, queries, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """Scores of every query against every item, `(nq, n)`, and the ids.

        Columns follow the ids in increasing order; the scores are those of
        `search` with `k = len(self)`, so they are exactly the index's, all
        from one state of it (the read lock is held throughout).
        """
        queries = check_queries("queries", queries, self._num_blocks, self._block_size)
        with self.view() as view:
            return every_score(view, queries, chunk)

    def _empty_like(self) -> SubicIndex:
        return SubicIndex(
            self._num_blocks,
            self._block_size,
            scanner=self.scanner,
            shortlist=self._shortlist,
            add_chunk_size=self._add_chunk,
            search_chunk_size=self._query_chunk,
        )

    # Persistence --------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes the index atomically in the versioned `.subic` format.

        The byte layout is specified in `subic_keras.search.file_format`.
        The file holds the codes and ids; the scanner is chosen on `load`.

        Args:
            path: destination file; replaced only once fully written.
        """
        with self.contents() as (header, chunks, ids):
            items = None
            groups, metadata = self.file_groups(), self.file_metadata()
            if metadata or groups is not None:
                items = file_format.Items(metadata, groups=groups)
            file_format.write(path, header, chunks, ids, items)

    def file_groups(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The grouping of equal codes a file of this index holds (inside
        `contents()`), for a loaded index to be searched at once."""
        return self._scanner.grouping(self._store)

    @contextlib.contextmanager
    def contents(self) -> Iterator[tuple[file_format.Header, Iterator, np.ndarray]]:
        """Holds the index still and yields what its file holds: the
        header, the packed codes in chunks, and the ids (for an index that
        writes them with more, `ImageIndex.save`)."""
        with self._lock.read():
            size = len(self)
            header = file_format.Header(
                self._num_blocks, self._block_size, size, self._shortlist
            )
            chunks = (
                self._store.packed(slice(start, start + self._add_chunk))
                for start in range(0, size, self._add_chunk)
            )
            yield header, chunks, self._store.ids

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        scanner: str = "auto",
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ) -> SubicIndex:
        """Reads an index written by `save`, verifying it first.

        Args:
            path: a file written by `SubicIndex.save`.
            scanner: as in the constructor.
            add_chunk_size: as in the constructor.
            search_chunk_size: as in the constructor.

        Returns:
            The `SubicIndex`, with the same codes, ids and order.

        Raises:
            ValueError: naming the path, if the file is not a SuBiC index, has
                an unsupported version, is truncated or fails its checksum.
        """
        header, packed, ids, items = file_format.read(path)
        return cls.from_parts(
            path,
            header,
            packed,
            ids,
            items=items,
            scanner=scanner,
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
        items: file_format.Items | None = None,
        scanner: str = "auto",
        add_chunk_size: int = _DEFAULT_ADD_CHUNK,
        search_chunk_size: int = _DEFAULT_SEARCH_CHUNK,
    ) -> SubicIndex:
        """The index of what `file_format.read(path)` returned (the path
        names the file in errors), with the model record of its `items`
        where it holds one; looks of an earlier version's file are left out
        (`written_with_looks` says so). A file's shortlist applies where the
        scanner is `"faiss-fastscan"`."""
        # A scanner this machine cannot run is the caller's error, not the file's.
        name = scanners.resolve(scanner, header.num_blocks, header.block_size)
        try:
            index = cls(
                header.num_blocks,
                header.block_size,
                scanner=name,
                shortlist=header.shortlist if name == "faiss-fastscan" else None,
                add_chunk_size=add_chunk_size,
                search_chunk_size=search_chunk_size,
            )
        except ValueError as error:
            raise ValueError(
                f"{os.fspath(path)!r} is not a valid SuBiC index file: {error}"
            ) from error
        index._store.append(packed, ids)
        if items is not None:
            index.written_with_looks = items.earlier_looks
            try:
                index.read_records(items.metadata)
            except ValueError as error:
                raise ValueError(
                    f"{os.fspath(path)!r} is not a valid SuBiC index file: {error}"
                ) from None
        # Laid out and warmed now (from the file's grouping where it holds
        # one): the first search costs what the next ones do.
        if index._store.size:
            groups = None if items is None else items.groups
            index._scanner.lay_out(index._store, groups)
        return index
