"""The engines behind `SubicIndex`: the native exact scan, and faiss's scans.

Where `pip install` built the native extension (`native`, a C compiler is
all it needs), both engines search with it: every search is exact, with
SIMD bounds over quantised tables and exact float64 refinement, and faster
than faiss's scans (`benchmarks/search_speed.py`; the README's table names
the CPU and the kernel). faiss's scans below search when it was not built,
or with `SUBIC_NATIVE=0`. faiss stores the codes either way.

A faiss `IndexPQ` with inner-product metric whose sub-quantizer centroids
are unit vectors computes SuBiC's score exactly from the stored codes
(centroid `j` of sub-quantizer `m` is `e_j`, so `<z*_m, e_j> = z*_m[j]`).

- `FlatEngine`, the exact scan (any `K`): an `IndexPQ` whose sub-quantizers
  each cover `g` consecutive blocks, with "g-hot" centroids (centroid `j`
  has a one in block `t` at position `(j >> t*log2 K) & (K-1)`). Its inner
  product is the sum of the `g` block scores, so the scan stays exact, and
  since codes are packed least-significant bit first the bytes are the same
  as one block per sub-quantizer. `g` makes sub-codes 8 bits where possible
  (`K` = 2, 4, 16, 256: faiss's fastest look-up kernel; for `K = 16` 3.6x
  faster than 4-bit sub-quantizers over 1M items) and about 12 bits
  otherwise (for `K = 64`, 1.4x faster than the 6-bit scan over 1M items;
  slower below ~25,000 items, where both are fast). Batches of 32 or more
  queries over 3-, 5-, 6- or 7-bit blocks (`K` = 8, 32, 64, 128) instead
  unpack the codes, a million items at a time, to one byte per
  sub-quantizer and scan them with faiss's byte-aligned kernel: 1.6x faster
  again for `K = 64` at 1,000 queries over 1M items, while the index itself
  stays bit-packed. Scores agree with a float64 sum to ~1e-6 relative; they
  may differ in the last bits between query batch sizes (faiss builds the
  tables with BLAS for large batches, and batches take the byte-aligned
  path).
- `FastScanEngine` (`K = 16` and `M <= 256`): faiss's SIMD
  `IndexPQFastScan` with identity centroids scans with 8-bit quantised
  look-up tables and returns a shortlist of `max(shortlist, k)` candidates
  (default `max(2k, k + 64)`), re-scored exactly in NumPy from the stored
  codes, so returned scores are exact. Recall against the exact scan is not
  guaranteed; it measured >= 0.999 (ties aside) on random codes with ReLU
  queries. Queries with a very large dynamic range (one huge entry) coarsen
  the 8-bit tables; use `exact=True` or a larger `shortlist` for those.
  faiss drops items whose quantised score is the minimum, so a query for
  which fewer than `shortlist` items score above it (e.g. an all-zero `z*`,
  or a tiny database) is answered by an exact NumPy scan of every item.
- `sharded(engines)` searches several engines as one through faiss
  `IndexShards`.

Engines know positions (insertion order), not ids; `top_k` maps positions to
ids and pads missing results.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import faiss
import numpy as np

from subic_keras.search import native, packing

# Identity centroids (M x K x K floats for one block per sub-quantizer) are
# real memory; 2**27 floats = 512 MiB, e.g. M = 128 at K = 1024.
_MAX_CENTROID_FLOATS = 1 << 27
# The fast-scan kernel sums M uint8 table entries in uint16 accumulators.
FAST_SCAN_MAX_BLOCKS = 256
# faiss's fast scan indexes items with C ints.
FAST_SCAN_MAX_ITEMS = 2**31 - 1
# Elements (candidates x blocks) re-scored at once on the fast-scan path.
_RESCORE_BUDGET = 1 << 22
# The exact scan of 3-, 5-, 6- and 7-bit blocks unpacks codes to bytes for
# batches of at least this many queries, this many items at a time.
_BYTE_SCAN_MIN_QUERIES = 32
_BYTE_SCAN_CHUNK = 1 << 20


def _set_centroids(pq, group: int, block_size: int, nbits: int) -> None:
    """Sets "g-hot" centroids: sub-quantizer code j -> one 1 per block.

    Codes at or above `2**(group * nbits)` (when `pq.ksub` is larger) never
    occur; their centroids stay zero.
    """
    centroids = np.zeros((pq.M, pq.ksub, group * block_size), dtype=np.float32)
    code = np.arange(1 << (group * nbits))
    for t in range(group):
        position = t * block_size + ((code >> (t * nbits)) & (block_size - 1))
        centroids[:, code, position] = 1.0
    faiss.copy_array_to_vector(centroids.ravel(), pq.centroids)


def _byte_group(nbits: int) -> int:
    """Blocks per byte on the byte-aligned batch scan; 0 where not used."""
    if nbits < 8 and 8 % nbits:
        return 8 // nbits
    return 0


def _exact_group(nbits: int) -> int:
    """Blocks per faiss sub-quantizer on the exact path (see module doc)."""
    if nbits in (1, 2, 4, 8):
        return 8 // nbits
    return max(1, 12 // nbits)


@contextlib.contextmanager
def _omp_threads(count: int) -> Iterator[None]:
    """Sets the calling thread's OpenMP thread count for a block."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def _pad_columns(array: np.ndarray, width: int) -> np.ndarray:
    """Zero columns up to `width` (queries for padding blocks)."""
    if array.shape[1] == width:
        return array
    padded = np.zeros((len(array), width), dtype=np.float32)
    padded[:, : array.shape[1]] = array
    return padded


def _best_first(scores: np.ndarray, positions: np.ndarray, k: int | None = None):
    """Each row by score, highest first, equal scores by position; its first `k`."""
    order = np.lexsort((positions, -scores), axis=-1)[:, :k]
    return (
        np.take_along_axis(scores, order, axis=1),
        np.take_along_axis(positions, order, axis=1),
    )


def _selector(positions: np.ndarray):
    return faiss.IDSelectorBatch(np.ascontiguousarray(positions, dtype=np.int64))


def _threads() -> int:
    """Threads of a search: faiss's OpenMP setting (all cores by default)."""
    return max(1, faiss.omp_get_max_threads())


class _NativeScan:
    """The native exact scan (`native`) over an engine's codes, when built.

    The kernel's tiled copy of the codes is made on the first search after
    a change (`SubicIndex` holds its write lock while changing them).
    """

    num_blocks: int
    block_size: int
    layout: native.Layout
    _tiles: np.ndarray | None

    def _init_native(self) -> None:
        self.layout = native.Layout.for_block_size(self.num_blocks, self.block_size)
        self._tiles = None

    def _changed(self) -> None:
        self._tiles = None

    @property
    def native(self) -> bool:
        """Whether searches run the native scan."""
        return native.available()

    def _native_tiles(self) -> np.ndarray:
        tiles = self._tiles
        if tiles is None:
            n = self.ntotal  # type: ignore[attr-defined]
            columns = np.empty((n, self.layout.columns), dtype=self.layout.dtype)
            for start in range(0, n, _BYTE_SCAN_CHUNK):
                part = slice(start, min(n, start + _BYTE_SCAN_CHUNK))
                if self.layout.raw_bytes:
                    columns[part] = self.packed(part)
                else:
                    columns[part] = self.layout.columns_of(self.codes(part))
            tiles = self._tiles = self.layout.tiles(columns)
        return tiles

    def _native_search(self, queries: np.ndarray, k: int):
        return native.search(
            self.layout,
            self._native_tiles(),
            self.ntotal,  # type: ignore[attr-defined]
            queries,
            k,
            _threads(),
        )

    # Provided by the engines.
    packed: Callable[..., np.ndarray]
    codes: Callable[..., np.ndarray]


class FlatEngine(_NativeScan):
    """Exact scan: faiss `IndexPQ` over grouped blocks (see module doc)."""

    def __init__(self, num_blocks: int, block_size: int, nbits: int):
        self.num_blocks, self.block_size, self.nbits = num_blocks, block_size, nbits
        self._init_native()
        self.group = _exact_group(nbits)
        self.num_groups = -(-num_blocks // self.group)
        self.width = self.num_groups * self.group * block_size
        ksub, dsub = 1 << (self.group * nbits), self.group * block_size
        table = self.num_groups * ksub * dsub
        if table > _MAX_CENTROID_FLOATS:
            raise ValueError(
                f"num_blocks={num_blocks} with block_size={block_size} is too "
                "large for the exact scan: its identity centroid table would "
                f"hold {table} floats (limit {_MAX_CENTROID_FLOATS})"
            )
        self.index = faiss.IndexPQ(
            self.width, self.num_groups, self.group * nbits, faiss.METRIC_INNER_PRODUCT
        )
        _set_centroids(self.index.pq, self.group, block_size, nbits)
        self.index.is_trained = True
        self.stored_size = int(self.index.code_size)
        self.code_size = packing.code_size(num_blocks, nbits)
        self.byte_group = _byte_group(nbits)
        if self.byte_group:
            num_bytes = -(-num_blocks // self.byte_group)
            self.byte_width = num_bytes * self.byte_group * block_size
            self.byte_pq = faiss.ProductQuantizer(self.byte_width, num_bytes, 8)
            _set_centroids(self.byte_pq, self.byte_group, block_size, nbits)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add_packed(self, packed: np.ndarray) -> None:
        if self.stored_size != self.code_size:
            # Padding blocks hold code 0; their query columns are zero.
            padded = np.zeros((len(packed), self.stored_size), dtype=np.uint8)
            padded[:, : self.code_size] = packed
            packed = padded
        self._changed()
        self.index.add_sa_codes(np.ascontiguousarray(packed))

    def remove_positions(self, positions: np.ndarray) -> None:
        self._changed()
        self.index.remove_ids(_selector(positions))

    def remove_range(self, start: int, stop: int) -> None:
        self._changed()
        self.index.remove_ids(faiss.IDSelectorRange(start, stop))

    def packed(self, positions) -> np.ndarray:
        n = self.ntotal
        if not n:
            raw = np.zeros(0, dtype=np.uint8)
        else:
            raw = faiss.rev_swig_ptr(self.index.codes.data(), n * self.stored_size)
        rows = raw.reshape(n, self.stored_size)[positions]
        return np.array(rows[..., : self.code_size])

    def codes(self, positions, dtype=np.int64) -> np.ndarray:
        packed = self.packed(positions)
        shape = packed.shape[:-1]
        flat = packed.reshape(-1, self.code_size)
        return packing.unpack(flat, self.num_blocks, self.nbits, dtype).reshape(
            (*shape, self.num_blocks)
        )

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.native:
            return self._native_search(queries, k)
        if self.byte_group and len(queries) >= _BYTE_SCAN_MIN_QUERIES:
            scores, positions = self._byte_scan(queries, k)
        else:
            scores, positions = self._scan(queries, k)
        return _best_first(scores, positions)

    def _scan(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = _pad_columns(queries, self.width)
        if len(queries) == 1:
            # faiss scans one query on one thread anyway, but builds its tables
            # with multi-threaded BLAS; on a busy machine waking those threads
            # cost 30 ms for K = 64 (vs 1.5 ms). OpenMP settings are per
            # thread, so this does not affect other searching threads.
            with _omp_threads(1):
                return self.index.search(queries, k)
        return self.index.search(queries, k)

    def _byte_scan(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The same scores from codes unpacked to one byte per sub-quantizer.

        faiss decodes sub-codes of 3, 5, 6 or 7 bits (and the 12-bit groups of
        `_scan`) bit by bit; its byte-aligned kernel is ~1.6x faster (K = 64,
        1M items, 1,000 queries). Unpacking a chunk costs about as much as
        scanning it for a handful of queries, so only batches use this path.
        """
        queries = np.ascontiguousarray(_pad_columns(queries, self.byte_width))
        nq, n = len(queries), self.ntotal
        heap = faiss.ResultHeap(nq, k, keep_max=True)
        for start in range(0, n, _BYTE_SCAN_CHUNK):
            stop = min(n, start + _BYTE_SCAN_CHUNK)
            codes = self._byte_codes(self.codes(slice(start, stop), np.uint8))
            found = min(k, stop - start)
            scores = np.empty((nq, found), dtype=np.float32)
            positions = np.empty((nq, found), dtype=np.int64)
            result = faiss.float_minheap_array_t()
            result.nh, result.k = nq, found
            result.val, result.ids = faiss.swig_ptr(scores), faiss.swig_ptr(positions)
            self.byte_pq.search_ip(
                faiss.swig_ptr(queries),
                nq,
                faiss.swig_ptr(codes),
                stop - start,
                result,
                True,
            )
            heap.add_result(scores, np.where(positions >= 0, positions + start, -1))
        heap.finalize()
        return heap.D, heap.I

    def _byte_codes(self, codes: np.ndarray) -> np.ndarray:
        """Integer codes `(n, M)` to `(n, bytes)` uint8, `byte_group` per byte."""
        group = self.byte_group
        padded = np.zeros((len(codes), self.byte_pq.M * group), dtype=np.uint8)
        padded[:, : self.num_blocks] = codes
        if group == 1:
            return padded
        grouped = padded.reshape(len(codes), -1, group)
        shifts = (np.arange(group) * self.nbits).astype(np.uint8)
        return np.bitwise_or.reduce(grouped << shifts, axis=-1).astype(np.uint8)


# Position of vector j (mod 16) inside a 16-byte half of a fast-scan block:
# faiss interleaves vectors 0..7 with 8..15 (pq4_pack_codes's perm0).
_FAST_SCAN_SLOT = np.array([2 * j if j < 8 else 2 * (j - 8) + 1 for j in range(16)])
_FAST_SCAN_BBS = 32
_FAST_SCAN_IMPLEM = 15


class FastScanEngine(_NativeScan):
    """4-bit SIMD shortlist with faiss `IndexPQFastScan`, exact re-scoring."""

    num_blocks: int
    index: Any

    def __init__(self, num_blocks: int, block_size: int, shortlist: int | None):
        _check_fast_scan_layout()
        self.num_blocks, self.block_size, self.nbits = num_blocks, block_size, 4
        self._init_native()
        self.shortlist = shortlist
        self.width = num_blocks * block_size
        self.index = faiss.IndexPQFastScan(
            self.width, num_blocks, 4, faiss.METRIC_INNER_PRODUCT, _FAST_SCAN_BBS
        )
        _set_centroids(self.index.pq, 1, block_size, 4)
        self.index.is_trained = True
        self.index.implem = _FAST_SCAN_IMPLEM
        self.padded_blocks = int(self.index.M2)
        self.stored_size = self.padded_blocks // 2
        self.code_size = packing.code_size(num_blocks, 4)
        self.offsets = np.arange(num_blocks, dtype=np.int64) * block_size

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add_packed(self, packed: np.ndarray) -> None:
        # faiss converts a flat IndexPQ to the blocked fast-scan layout.
        flat = faiss.IndexPQ(self.width, self.num_blocks, 4, faiss.METRIC_INNER_PRODUCT)
        _set_centroids(flat.pq, 1, self.block_size, 4)
        flat.is_trained = True
        flat.add_sa_codes(np.ascontiguousarray(packed))
        blocked = faiss.IndexPQFastScan(flat, _FAST_SCAN_BBS)
        self._changed()
        self.index.merge_from(blocked, 0)

    def remove_positions(self, positions: np.ndarray) -> None:
        self._changed()
        self.index.remove_ids(_selector(positions))

    def remove_range(self, start: int, stop: int) -> None:
        self._changed()
        self.index.remove_ids(faiss.IDSelectorRange(start, stop))

    def codes(self, positions) -> np.ndarray:
        """Decodes the blocked layout; `positions` is any int array or slice."""
        if isinstance(positions, slice):
            positions = np.arange(self.ntotal)[positions]
        positions = np.asarray(positions, dtype=np.int64)
        if not positions.size:
            return np.zeros((*positions.shape, self.num_blocks), dtype=np.int64)
        raw = faiss.rev_swig_ptr(self.index.codes.get(), self.index.codes.size())
        lane = positions % _FAST_SCAN_BBS
        base = (positions // _FAST_SCAN_BBS) * (self.padded_blocks * 16)
        base = base + _FAST_SCAN_SLOT[lane % 16]
        shift = ((lane // 16) * 4).astype(np.uint8)
        # Byte of block 2p at +32p, of block 2p+1 at +32p+16.
        byte_offsets = (
            np.arange(self.padded_blocks // 2)[:, None] * 32 + np.array([0, 16])
        ).ravel()
        data = raw[base[..., None] + byte_offsets]
        codes = (data >> shift[..., None]) & 15
        return codes[..., : self.num_blocks].astype(np.int64)

    def packed(self, positions) -> np.ndarray:
        codes = self.codes(positions)
        return packing.pack(codes.reshape(-1, self.num_blocks), 4)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.native:
            return self._native_search(queries, k)
        n = self.ntotal
        shortlist = max(2 * k, k + 64) if self.shortlist is None else self.shortlist
        shortlist = min(n, max(k, shortlist))
        _, candidates = self.index.search(queries, shortlist)
        scores = np.empty((len(queries), k), dtype=np.float32)
        positions = np.empty((len(queries), k), dtype=np.int64)
        step = max(1, _RESCORE_BUDGET // (shortlist * self.num_blocks))
        for start in range(0, len(queries), step):
            rows = slice(start, start + step)
            scores[rows], positions[rows] = self._rescore(
                queries[rows], candidates[rows], k
            )
        # faiss never returns items whose quantised score is the minimum, 0
        # (every block at its table's minimum). When fewer than `shortlist`
        # items score above it, rank those rows by an exact scan instead.
        short = np.flatnonzero((candidates < 0).any(axis=1))
        for start in range(0, len(short), 64):
            short_rows = short[start : start + 64]
            scores[short_rows], positions[short_rows] = self._scan(
                queries[short_rows], k
            )
        return scores, positions

    def _rescore(self, queries, candidates, k):
        """Exact scores of `candidates`, the best `k` per row, best first."""
        valid = candidates >= 0
        candidates = np.where(valid, candidates, 0)
        columns = self.codes(candidates) + self.offsets
        exact = queries[np.arange(len(queries))[:, None, None], columns]
        exact = exact.sum(axis=-1, dtype=np.float64)
        exact[~valid] = -np.inf
        scores, positions = _best_first(exact, candidates, k)
        return scores.astype(np.float32), positions

    def _scan(self, queries, k):
        """Exact top-k over every stored item, in chunks (NumPy)."""
        best_scores = np.full((len(queries), 0), -np.inf)
        best = np.zeros((len(queries), 0), dtype=np.int64)
        chunk = max(1, _RESCORE_BUDGET // (len(queries) * self.num_blocks))
        for start in range(0, self.ntotal, chunk):
            positions = np.arange(start, min(self.ntotal, start + chunk))
            columns = self.codes(positions) + self.offsets
            chunk_scores = queries[:, columns].sum(axis=-1, dtype=np.float64)
            best_scores = np.concatenate([best_scores, chunk_scores], axis=1)
            best = np.concatenate(
                [best, np.broadcast_to(positions, chunk_scores.shape)], axis=1
            )
            best_scores, best = _best_first(best_scores, best, k)
        return best_scores.astype(np.float32), best


class _ShardsMixin:
    """Engines of several shards searched as one through faiss `IndexShards`.

    faiss searches the shards' indexes in parallel threads and merges their
    top-k lists, numbering items across shards (`successive_ids`); the
    engine's own logic (tie order, exact re-scoring of fast-scan shortlists,
    the byte-aligned batch scan) then runs on those global positions, with
    codes read back from the shard that holds each position.
    """

    # Copied from the first engine; declared for the type checker.
    num_blocks: int
    index: Any

    def __init__(self, engines: Sequence):
        first = engines[0]
        vars(self).update(vars(first))
        self.engines = list(engines)
        self.starts = np.cumsum([0] + [e.ntotal for e in engines])
        self.index = faiss.IndexShards(first.index.d, True, True)
        for engine in engines:
            self.index.add_shard(engine.index)

    @property
    def ntotal(self) -> int:
        return int(self.starts[-1])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.engines[0].native:
            return super().search(queries, k)  # type: ignore[misc]
        # Each shard scans its own codes; positions are numbered across shards.
        found = [
            (scores, positions + start)
            for engine, start in zip(self.engines, self.starts)
            if engine.ntotal
            for scores, positions in [engine.search(queries, min(k, engine.ntotal))]
        ]
        scores = np.concatenate([f[0] for f in found], axis=1)
        positions = np.concatenate([f[1] for f in found], axis=1)
        return _best_first(scores, positions, k)

    def codes(self, positions, dtype=np.int64) -> np.ndarray:
        if isinstance(positions, slice):
            positions = np.arange(self.ntotal)[positions]
        positions = np.asarray(positions, dtype=np.int64)
        out = np.zeros((*positions.shape, self.num_blocks), dtype=dtype)
        shard = np.searchsorted(self.starts, positions, side="right") - 1
        for s, engine in enumerate(self.engines):
            mask = shard == s
            if mask.any():
                out[mask] = engine.codes(positions[mask] - self.starts[s]).astype(dtype)
        return out


class _ShardedFlat(_ShardsMixin, FlatEngine):
    pass


class _ShardedFastScan(_ShardsMixin, FastScanEngine):
    pass


_SHARDED_ENGINES: dict[type, Callable[[Sequence], FlatEngine | FastScanEngine]] = {
    FlatEngine: _ShardedFlat,
    FastScanEngine: _ShardedFastScan,
}


def sharded(engines: Sequence) -> FlatEngine | FastScanEngine:
    """One engine over `engines` (all of one kind), searched in parallel."""
    return _SHARDED_ENGINES[type(engines[0])](engines)


@functools.cache
def _check_fast_scan_layout() -> None:
    """Checks once that `codes()` reads faiss's blocked layout correctly.

    The layout is a faiss implementation detail; if a faiss release changes
    it, fail loudly rather than re-score with wrong codes.
    """
    engine = FastScanEngine.__new__(FastScanEngine)
    engine.num_blocks, engine.block_size, engine.width = 3, 16, 48
    engine.index = faiss.IndexPQFastScan(
        48, 3, 4, faiss.METRIC_INNER_PRODUCT, _FAST_SCAN_BBS
    )
    _set_centroids(engine.index.pq, 1, 16, 4)
    engine.index.is_trained = True
    engine.padded_blocks = int(engine.index.M2)
    codes = (np.arange(70 * 3).reshape(70, 3) * 7) % 16
    engine.add_packed(packing.pack(codes, 4))
    if not np.array_equal(engine.codes(np.arange(70)), codes):
        raise RuntimeError(
            f"faiss {faiss.__version__} stores fast-scan codes in a layout this "
            "module cannot read; use SubicIndex(..., exact=True)"
        )


def top_k(
    engine, ids: np.ndarray, queries: np.ndarray, k: int, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-`min(k, n)` of `engine`, positions mapped through `ids`."""
    found = min(k, engine.ntotal)
    scores = np.empty((len(queries), found), dtype=np.float32)
    found_ids = np.empty((len(queries), found), dtype=np.int64)
    if not found:
        return scores, found_ids
    for start in range(0, len(queries), chunk):
        rows = slice(start, start + chunk)
        scores[rows], positions = engine.search(queries[rows], found)
        found_ids[rows] = ids[positions]
    return scores, found_ids
