"""SuBiC's asymmetric search over bit-packed codes, backed by faiss.

A database item is an integer code `c` of `M` blocks with values in `[0, K)`;
a query is SuBiC's real vector `z*` of width `M * K` (block `m` in columns
`[m*K, (m+1)*K)`). The score is a look-up-table scan with `M` additions:

    score(z*, c) = sum_m z*[m*K + c_m]

Engines. A faiss `IndexPQ` with inner-product metric whose sub-quantizer
centroids are unit vectors computes exactly this score from the stored codes
(centroid `j` of sub-quantizer `m` is `e_j`, so `<z*_m, e_j> = z*_m[j]`).
`SubicIndex` uses two variants:

- exact scan (any `K`): an `IndexPQ` whose sub-quantizers each cover `g`
  consecutive blocks, with "g-hot" centroids (centroid `j` has a one in block
  `t` at position `(j >> t*log2 K) & (K-1)`). Its inner product is the sum of
  the `g` block scores, so the scan stays exact, and since codes are packed
  least-significant bit first the bytes are the same as one block per
  sub-quantizer. `g` makes sub-codes 8 bits where possible (`K` = 2, 4, 16,
  256: faiss's fastest look-up kernel; for `K = 16` 3.6x faster than 4-bit
  sub-quantizers over 1M items) and about 12 bits otherwise (for `K = 64`,
  1.4x faster than the 6-bit scan over 1M items; slower below ~25,000
  items, where both are fast). Batches of 32 or more queries over 3-, 5-,
  6- or 7-bit blocks (`K` = 8, 32, 64, 128) instead unpack the codes, a
  million items at a time, to one byte per sub-quantizer and scan them with
  faiss's byte-aligned kernel: 1.6x faster again for `K = 64` at 1,000
  queries over 1M items, while the index itself stays bit-packed. Scores
  agree with a float64 sum to ~1e-6 relative; they may differ in the last
  bits between query batch sizes (faiss builds the tables with BLAS for
  large batches, and batches take the byte-aligned path).
- fast scan (`K = 16` and `M <= 256`, the default there): faiss's SIMD
  `IndexPQFastScan` with identity centroids scans with 8-bit quantised
  look-up tables and returns a shortlist of `max(shortlist, k)` candidates
  (default `max(2k, k + 64)`), re-scored exactly in NumPy from the stored
  codes, so returned scores are exact. Recall against the exact scan is not
  guaranteed; it measured >= 0.999 (ties aside) on random codes with ReLU
  queries. Queries with a very large dynamic range (one huge entry) coarsen
  the 8-bit tables; use `exact=True` or a larger `shortlist` for those. faiss
  drops items whose quantised score is the minimum, so a query for which
  fewer than `shortlist` items score above it (e.g. an all-zero `z*`, or a
  tiny database) is answered by an exact NumPy scan of every item instead.

Ties. Returned rows are sorted by score, highest first, and equal scores by
insertion order (earlier first). Which of several items tied exactly at the
k-th score make the cut is decided by faiss: deterministic for a given index
and query batch, but not specified.

Missing results. When `k > len(index)` the extra slots hold id `-1` and score
`-inf` (`search`) or `-1` (`search_codes`), as faiss does.

File format (version 1, little-endian, no pickle):

    offset  size          field
    0       8             magic b"SUBICIDX"
    8       4   uint32    format version (1)
    12      4   uint32    M, num_blocks
    16      4   uint32    K, block_size (a power of two)
    20      4   uint32    flags: bit 0 = exact scan; other bits must be 0
    24      8   uint64    n, number of items
    32      4   uint32    code_size = ceil(M * log2(K) / 8)
    36      4   uint32    shortlist (0 = default)
    40      n*code_size   codes, each M blocks of log2(K) bits packed least
                          significant bit first (faiss's bit-string layout),
                          unused trailing bits zero
    ...     8*n  int64    ids, in insertion order
    ...     32            SHA-256 of every byte before it

`load` checks the size and the checksum in Python before any byte reaches
faiss, so a truncated or corrupted file raises `ValueError` naming the path.

Scaling beyond one process. A database too large for one index is split by
id range into shards (`SubicIndex.shard`, or one `SubicIndex` built per
machine from its own id range). The global top-k is the top-k of the
shards' top-k lists, so searching each shard and merging gives the same
result as one search of the whole database:

- in one process, `ShardedSubicIndex` searches shards through faiss
  `IndexShards` (one thread per shard, merged in faiss), then applies the
  engine's exact re-scoring and tie order to the merged list;
- across machines, each machine searches its own `SubicIndex` for the top
  `k` and sends `(scores, ids)` (about 12 bytes per result) to one place,
  where `merge_results` keeps the `k` best. Ties keep the order of the lists
  passed, so shards given in id-range order merge to exactly the unsharded
  ranking.

faiss implements neither `IndexPQ` nor the fast-scan indexes on GPU, so
searches run on CPU cores, with or without faiss-gpu.

The fast-scan path holds fewer than 2**31 items per index (a faiss limit).

Storage. `M * log2(K)` bits per item (`code_size` bytes, padded to whole
bytes) plus an int64 id; `bytes_per_item` reports the in-memory cost. The
fast-scan layout rounds `M` up to an even number of blocks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import struct
import threading
from collections.abc import Iterator, Sequence

import faiss
import numpy as np

from subic_keras._io import atomic_path
from subic_keras._validation import check_block_shape, check_finite, check_int

_MAGIC = b"SUBICIDX"
_VERSION = 1
# magic, version, M, K, flags, n, code_size, shortlist
_HEADER = struct.Struct("<8sIIIIQII")
_DIGEST_SIZE = 32
_FLAG_EXACT = 1
_MAX_BLOCK_SIZE = 1024
# Identity centroids (M x K x K floats for one block per sub-quantizer) are
# real memory; 2**27 floats = 512 MiB, e.g. M = 128 at K = 1024.
_MAX_CENTROID_FLOATS = 1 << 27
# The fast-scan kernel sums M uint8 table entries in uint16 accumulators.
_FAST_SCAN_MAX_BLOCKS = 256
# faiss's fast scan indexes items with C ints.
_FAST_SCAN_MAX_ITEMS = 2**31 - 1
# Elements (candidates x blocks) re-scored at once on the fast-scan path.
_RESCORE_BUDGET = 1 << 22
# The exact scan of 3-, 5-, 6- and 7-bit blocks unpacks codes to bytes for
# batches of at least this many queries, this many items at a time.
_BYTE_SCAN_MIN_QUERIES = 32
_BYTE_SCAN_CHUNK = 1 << 20
_DEFAULT_ADD_CHUNK = 65_536
_DEFAULT_SEARCH_CHUNK = 1_024


class _ReadWriteLock:
    """Many concurrent readers or one writer; waiting writers go first."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def _code_size(num_blocks: int, nbits: int) -> int:
    return (num_blocks * nbits + 7) // 8


def _pack_codes(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Packs integer codes `(n, M)` into `(n, ceil(M*nbits/8))` uint8 bytes.

    Bits are written least significant first, block after block, which is
    faiss's `BitstringWriter` layout (and so `ProductQuantizer`'s).
    """
    if nbits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    n, num_blocks = codes.shape
    shifts = np.arange(nbits, dtype=np.uint16)
    bits = (codes.astype(np.uint16)[:, :, None] >> shifts) & 1
    return np.packbits(
        bits.astype(np.uint8).reshape(n, num_blocks * nbits), axis=1, bitorder="little"
    )


def _unpack_codes(
    packed: np.ndarray, num_blocks: int, nbits: int, dtype=np.int64
) -> np.ndarray:
    """Inverse of `_pack_codes`: `(n, code_size)` bytes to `(n, M)` codes."""
    if nbits == 8:
        return packed[:, :num_blocks].astype(dtype)
    n = packed.shape[0]
    offsets = np.arange(num_blocks) * nbits
    mask = (1 << nbits) - 1
    if packed.shape[1] <= 8:
        # Up to 64 bits: one little-endian word per item, ~10x faster.
        words = np.zeros((n, 8), dtype=np.uint8)
        words[:, : packed.shape[1]] = packed
        words = words.view("<u8")
        return ((words >> offsets.astype(np.uint64)) & np.uint64(mask)).astype(dtype)
    # A block of <= 10 bits starting at bit offset % 8 <= 7 lies inside three
    # consecutive bytes, so one 24-bit word per block holds it.
    padded = np.zeros((n, packed.shape[1] + 2), dtype=np.uint32)
    padded[:, :-2] = packed
    first = offsets // 8
    words = (
        padded[:, first] | (padded[:, first + 1] << 8) | (padded[:, first + 2] << 16)
    )
    shifts = (offsets % 8).astype(np.uint32)
    return ((words >> shifts) & mask).astype(dtype)


def _clear_padding_bits(packed: np.ndarray, num_blocks: int, nbits: int) -> None:
    used = (num_blocks * nbits) % 8
    if used:
        packed[:, -1] &= (1 << used) - 1


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


def _selector(positions: np.ndarray):
    return faiss.IDSelectorBatch(np.ascontiguousarray(positions, dtype=np.int64))


class _FlatEngine:
    """Exact scan: faiss `IndexPQ` over grouped blocks (see module doc)."""

    def __init__(self, num_blocks: int, block_size: int, nbits: int):
        self.num_blocks, self.block_size, self.nbits = num_blocks, block_size, nbits
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
        self.code_size = _code_size(num_blocks, nbits)
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
        self.index.add_sa_codes(np.ascontiguousarray(packed))

    def remove_positions(self, positions: np.ndarray) -> None:
        self.index.remove_ids(_selector(positions))

    def remove_range(self, start: int, stop: int) -> None:
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
        return _unpack_codes(flat, self.num_blocks, self.nbits, dtype).reshape(
            (*shape, self.num_blocks)
        )

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.byte_group and len(queries) >= _BYTE_SCAN_MIN_QUERIES:
            scores, positions = self._byte_scan(queries, k)
        else:
            scores, positions = self._scan(queries, k)
        order = np.lexsort((positions, -scores), axis=-1)
        return (
            np.take_along_axis(scores, order, axis=1),
            np.take_along_axis(positions, order, axis=1),
        )

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
        padded = padded.reshape(len(codes), -1, group)
        shifts = (np.arange(group) * self.nbits).astype(np.uint8)
        return np.bitwise_or.reduce(padded << shifts, axis=-1).astype(np.uint8)


# Position of vector j (mod 16) inside a 16-byte half of a fast-scan block:
# faiss interleaves vectors 0..7 with 8..15 (pq4_pack_codes's perm0).
_FAST_SCAN_SLOT = np.array([2 * j if j < 8 else 2 * (j - 8) + 1 for j in range(16)])
_FAST_SCAN_BBS = 32
_FAST_SCAN_IMPLEM = 15


class _FastScanEngine:
    """4-bit SIMD shortlist with faiss `IndexPQFastScan`, exact re-scoring."""

    def __init__(self, num_blocks: int, block_size: int, shortlist: int | None):
        _check_fast_scan_layout()
        self.num_blocks, self.block_size, self.nbits = num_blocks, block_size, 4
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
        self.code_size = _code_size(num_blocks, 4)
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
        self.index.merge_from(blocked, 0)

    def remove_positions(self, positions: np.ndarray) -> None:
        self.index.remove_ids(_selector(positions))

    def remove_range(self, start: int, stop: int) -> None:
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
        return _pack_codes(codes.reshape(-1, self.num_blocks), 4)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
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
            rows = short[start : start + 64]
            scores[rows], positions[rows] = self._scan(queries[rows], k)
        return scores, positions

    def _rescore(self, queries, candidates, k):
        """Exact scores of `candidates`, the best `k` per row, best first."""
        valid = candidates >= 0
        candidates = np.where(valid, candidates, 0)
        columns = self.codes(candidates) + self.offsets
        exact = queries[np.arange(len(queries))[:, None, None], columns]
        exact = exact.sum(axis=-1, dtype=np.float64)
        exact[~valid] = -np.inf
        order = np.lexsort((candidates, -exact), axis=-1)[:, :k]
        return (
            np.take_along_axis(exact, order, axis=1).astype(np.float32),
            np.take_along_axis(candidates, order, axis=1),
        )

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
            order = np.lexsort((best, -best_scores), axis=-1)[:, :k]
            best_scores = np.take_along_axis(best_scores, order, axis=1)
            best = np.take_along_axis(best, order, axis=1)
        return best_scores.astype(np.float32), best


class _ShardsMixin:
    """Engines of several shards searched as one through faiss `IndexShards`.

    faiss searches the shards' indexes in parallel threads and merges their
    top-k lists, numbering items across shards (`successive_ids`); the
    engine's own logic (tie order, exact re-scoring of fast-scan shortlists,
    the byte-aligned batch scan) then runs on those global positions, with
    codes read back from the shard that holds each position.
    """

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


class _ShardedFlatEngine(_ShardsMixin, _FlatEngine):
    pass


class _ShardedFastScanEngine(_ShardsMixin, _FastScanEngine):
    pass


_SHARDED_ENGINES = {
    _FlatEngine: _ShardedFlatEngine,
    _FastScanEngine: _ShardedFastScanEngine,
}


@functools.cache
def _check_fast_scan_layout() -> None:
    """Checks once that `codes()` reads faiss's blocked layout correctly.

    The layout is a faiss implementation detail; if a faiss release changes
    it, fail loudly rather than re-score with wrong codes.
    """
    engine = _FastScanEngine.__new__(_FastScanEngine)
    engine.num_blocks, engine.block_size, engine.width = 3, 16, 48
    engine.index = faiss.IndexPQFastScan(
        48, 3, 4, faiss.METRIC_INNER_PRODUCT, _FAST_SCAN_BBS
    )
    _set_centroids(engine.index.pq, 1, 16, 4)
    engine.index.is_trained = True
    engine.padded_blocks = int(engine.index.M2)
    codes = (np.arange(70 * 3).reshape(70, 3) * 7) % 16
    engine.add_packed(_pack_codes(codes, 4))
    if not np.array_equal(engine.codes(np.arange(70)), codes):
        raise RuntimeError(
            f"faiss {faiss.__version__} stores fast-scan codes in a layout this "
            "module cannot read; use SubicIndex(..., exact=True)"
        )


def _check_block_size(block_size: int) -> int:
    if block_size & (block_size - 1) or block_size > _MAX_BLOCK_SIZE:
        raise ValueError(
            "block_size must be a power of two between 2 and "
            f"{_MAX_BLOCK_SIZE} (codes are stored with log2(block_size) bits "
            f"per block), received {block_size}"
        )
    return block_size


def _as_2d(name: str, array) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array, received shape {array.shape}; "
            "reshape a single item with .reshape(1, -1)"
        )
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, received dtype {array.dtype}")
    return array


def _as_codes(
    name: str, codes, num_blocks: int, block_size: int, chunk: int = _DEFAULT_ADD_CHUNK
) -> np.ndarray:
    """Integer codes `(n, M)`, or per-block vectors `(n, M*K)` -> argmax."""
    codes = _as_2d(name, codes)
    width = codes.shape[1]
    dtype = np.uint8 if block_size <= 256 else np.uint16
    if width == num_blocks * block_size:
        out = np.empty((len(codes), num_blocks), dtype=dtype)
        # In chunks: the finiteness mask and argmax temporaries stay small.
        for start in range(0, len(codes), chunk):
            part = codes[start : start + chunk]
            if part.dtype.kind == "f":
                check_finite(name, part)
            blocks = part.reshape(len(part), num_blocks, block_size)
            # argmax keeps the lowest index among equal maxima.
            out[start : start + chunk] = blocks.argmax(axis=-1)
        return out
    if width != num_blocks:
        raise ValueError(
            f"{name} must have width num_blocks = {num_blocks} (integer codes) "
            f"or num_blocks * block_size = {num_blocks * block_size} (per-block "
            f"vectors), received shape {codes.shape}"
        )
    if codes.dtype.kind not in "iu":
        raise ValueError(
            f"{name} of width num_blocks = {num_blocks} must be integer codes, "
            f"received dtype {codes.dtype}"
        )
    if codes.size:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= block_size:
            raise ValueError(
                f"{name} must hold values in [0, block_size) = [0, {block_size}), "
                f"received values in [{low}, {high}]"
            )
    return codes.astype(dtype)


def _as_queries(name: str, queries, num_blocks: int, block_size: int) -> np.ndarray:
    queries = _as_2d(name, queries)
    width = num_blocks * block_size
    if queries.shape[1] != width:
        raise ValueError(
            f"{name} must have width num_blocks * block_size = {num_blocks} * "
            f"{block_size} = {width}, received shape {queries.shape}"
        )
    with np.errstate(over="ignore"):  # overflow to inf is reported just below
        queries = np.ascontiguousarray(queries, dtype=np.float32)
    check_finite(name, queries)
    return queries


def _as_ids(name: str, ids, length: int | None = None) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim == 0:
        ids = ids.reshape(1)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(
            f"{name} must be a 1-D array of integers, received shape "
            f"{ids.shape} and dtype {ids.dtype}"
        )
    if length is not None and len(ids) != length:
        raise ValueError(
            f"{name} must have one id per code ({length}), received {len(ids)}"
        )
    if ids.size and ids.dtype.kind == "u" and int(ids.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64, received {int(ids.max())}")
    ids = ids.astype(np.int64)
    if ids.size and int(ids.min()) < 0:
        raise ValueError(
            f"{name} must be >= 0 (-1 marks missing results), received "
            f"{_preview(ids[ids < 0])}"
        )
    return ids


def _preview(values: np.ndarray, limit: int = 10) -> str:
    values = np.unique(values)
    shown = ", ".join(str(int(v)) for v in values[:limit])
    more = f", ... ({len(values)} in all)" if len(values) > limit else ""
    return f"[{shown}{more}]"


def _duplicates(ids: np.ndarray) -> np.ndarray:
    values, counts = np.unique(ids, return_counts=True)
    return values[counts > 1]


def _one_hot(codes: np.ndarray, block_size: int) -> np.ndarray:
    n, num_blocks = codes.shape
    out = np.zeros((n, num_blocks * block_size), dtype=np.float32)
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    np.put_along_axis(out, columns, 1.0, axis=1)
    return out


def _search_engine(
    engine, ids: np.ndarray, queries: np.ndarray, k: int, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids of `engine` (positions mapped through `ids`), padded with -1."""
    scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    found_ids = np.full((len(queries), k), -1, dtype=np.int64)
    found = min(k, engine.ntotal)
    if not found:
        return scores, found_ids
    for start in range(0, len(queries), chunk):
        rows = slice(start, start + chunk)
        chunk_scores, positions = engine.search(queries[rows], found)
        scores[rows, :found] = chunk_scores
        found_ids[rows, :found] = ids[positions]
    return scores, found_ids


def _search_codes(search, codes: np.ndarray, k: int, block_size: int, chunk: int):
    """Symmetric search through an asymmetric `search(queries, k)`."""
    scores = np.full((len(codes), k), -1, dtype=np.int32)
    ids = np.full((len(codes), k), -1, dtype=np.int64)
    for start in range(0, len(codes), chunk):
        rows = slice(start, start + chunk)
        found_scores, ids[rows] = search(_one_hot(codes[rows], block_size), k)
        valid = ids[rows] >= 0
        scores[rows] = np.where(
            valid, np.rint(np.where(valid, found_scores, 0)), -1
        ).astype(np.int32)
    return scores, ids


class SubicIndex:
    """Searchable database of SuBiC codes, scored by `score = sum_m z*[m*K + c_m]`.

    Codes are stored bit-packed (`M * log2 K` bits) in a faiss index; see the
    module docstring for the engines, tie order, file format and sharding.
    Searches may run from several threads at once; `add` and `remove` wait
    for running searches and block new ones while they change the index.

    Example:

    ```python
    index = SubicIndex(num_blocks=8, block_size=256)
    index.add(np.random.randint(0, 256, size=(1000, 8)))
    scores, ids = index.search(z_star, k=10)   # z_star: (nq, 8 * 256)
    ```

    Args:
        num_blocks: `M`, blocks per code (>= 1).
        block_size: `K`, a power of two in [2, 1024].
        exact: `True` forces the exact scan. `None` (default) uses the
            fast-scan path when `block_size == 16` (and `num_blocks <= 256`)
            and the exact scan otherwise; `False` requires the fast-scan path.
        shortlist: fast-scan candidates re-scored exactly per query, at least
            `k`; `None` means `max(2k, k + 64)`. Only for the fast-scan path.
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
        _check_block_size(block_size)
        if exact is not None and not isinstance(exact, (bool, np.bool_)):
            raise TypeError(f"exact must be True, False or None, received {exact!r}")
        fast_possible = block_size == 16 and num_blocks <= _FAST_SCAN_MAX_BLOCKS
        if exact is False and not fast_possible:
            raise ValueError(
                "exact=False selects the 4-bit fast-scan path, which needs "
                f"block_size == 16 and num_blocks <= {_FAST_SCAN_MAX_BLOCKS}, "
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
        if exact:
            self._engine = _FlatEngine(num_blocks, block_size, self._nbits)
        else:
            self._engine = _FastScanEngine(num_blocks, block_size, shortlist)
        self._ids = np.empty(0, dtype=np.int64)
        self._size = 0
        self._max_id = -1  # largest id present; default ids continue after it
        self._lock = _ReadWriteLock()

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

        ```python
        index.add(np.array([[3, 0, 7, 1]]), ids=[42])
        ```

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
        codes = _as_codes(
            "codes", codes, self._num_blocks, self._block_size, self._add_chunk
        )
        n = len(codes)
        if ids is not None:
            ids = _as_ids("ids", ids, length=n)
            repeated = _duplicates(ids)
            if repeated.size:
                raise ValueError(f"ids must be unique, repeated: {_preview(repeated)}")
        with self._lock.write():
            if not self._exact and self._size + n >= _FAST_SCAN_MAX_ITEMS:
                raise ValueError(
                    f"the fast-scan path holds fewer than {_FAST_SCAN_MAX_ITEMS} "
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
                    raise ValueError(f"ids already in the index: {_preview(clash)}")
            self._append(codes, ids)
        return ids

    def _append(self, codes: np.ndarray, ids: np.ndarray) -> None:
        """Adds validated codes; undoes a partial add if faiss fails."""
        before = self._engine.ntotal
        try:
            for start in range(0, len(codes), self._add_chunk):
                chunk = codes[start : start + self._add_chunk]
                self._engine.add_packed(_pack_codes(chunk, self._nbits))
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
        ids = np.unique(_as_ids("ids", ids))
        with self._lock.write():
            existing = self._ids[: self._size]
            present = np.isin(existing, ids)
            if int(present.sum()) != len(ids):
                missing = ids[~np.isin(ids, existing)]
                raise KeyError(f"ids not in the index: {_preview(missing)}")
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
            ids = _as_ids("ids", ids)
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
            raise KeyError(f"ids not in the index: {_preview(ids[~found])}")
        return positions

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Asymmetric search: the `k` best codes for each real query `z*`.

        `score(z*, c) = sum_m z*[m*K + c_m]`; highest first, equal scores in
        insertion order. Scores are exact on both engines.

        Example:

        ```python
        scores, ids = index.search(z_star, k=100)
        ```

        Args:
            queries: real `(nq, M*K)` array (e.g. SuBiC's ReLU output `z*`).
            k: results per query, >= 1. Slots beyond `len(self)` get id -1
                and score -inf.

        Returns:
            `(scores, ids)`: float32 `(nq, k)` and int64 `(nq, k)`.

        Raises:
            ValueError: for a bad shape, NaN/inf queries or `k < 1`.
        """
        k = check_int("k", k, minimum=1)
        queries = _as_queries("queries", queries, self._num_blocks, self._block_size)
        with self._lock.read():
            return self._search(queries, k)

    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return _search_engine(
            self._engine, self._ids[: self._size], queries, k, self._search_chunk
        )

    def search_codes(self, codes, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Symmetric search: ranks stored codes by the number of equal blocks.

        `score(q, c) = #{m : q_m == c_m}`, an integer in `[0, M]`; highest
        first, equal scores in insertion order.

        Args:
            codes: query codes, in any form `add` accepts.
            k: results per query, >= 1. Slots beyond `len(self)` get id -1
                and score -1.

        Returns:
            `(scores, ids)`: int32 `(nq, k)` and int64 `(nq, k)`.
        """
        k = check_int("k", k, minimum=1)
        codes = _as_codes("codes", codes, self._num_blocks, self._block_size)
        with self._lock.read():
            return _search_codes(
                self._search, codes, k, self._block_size, self._search_chunk
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

    def save(self, path: str | os.PathLike) -> None:
        """Writes the index atomically in the versioned format (module doc).

        Args:
            path: destination file; replaced only once fully written.
        """
        with self._lock.read(), atomic_path(path) as tmp, open(tmp, "wb") as f:
            digest = hashlib.sha256()

            def write(data: bytes) -> None:
                digest.update(data)
                f.write(data)

            flags = _FLAG_EXACT if self._exact else 0
            write(
                _HEADER.pack(
                    _MAGIC,
                    _VERSION,
                    self._num_blocks,
                    self._block_size,
                    flags,
                    self._size,
                    self.code_size,
                    self._shortlist or 0,
                )
            )
            for start in range(0, self._size, self._add_chunk):
                stop = min(self._size, start + self._add_chunk)
                write(self._engine.packed(slice(start, stop)).tobytes())
            write(self._ids[: self._size].astype("<i8").tobytes())
            f.write(digest.digest())

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
        path = os.fspath(path)

        def fail(reason: str) -> ValueError:
            return ValueError(f"{path!r} is not a valid SuBiC index file: {reason}")

        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = f.read(_HEADER.size)
            if len(header) < len(_MAGIC) or header[: len(_MAGIC)] != _MAGIC:
                raise fail(f"missing magic bytes {_MAGIC!r}")
            if len(header) < _HEADER.size:
                raise fail(f"truncated header ({size} bytes)")
            _, version, m, k, flags, n, code_size, shortlist = _HEADER.unpack(header)
            if version != _VERSION:
                raise fail(
                    f"format version {version} is not supported (this code "
                    f"reads version {_VERSION})"
                )
            if not (1 <= m and 2 <= k <= _MAX_BLOCK_SIZE and not k & (k - 1)):
                raise fail(f"invalid block shape num_blocks={m}, block_size={k}")
            nbits = k.bit_length() - 1
            if code_size != _code_size(m, nbits) or flags & ~_FLAG_EXACT:
                raise fail(f"inconsistent header: code_size={code_size}, flags={flags}")
            expected = _HEADER.size + n * (code_size + 8) + _DIGEST_SIZE
            if size != expected:
                raise fail(
                    f"size is {size} bytes, the header announces {expected} "
                    f"({n} items); the file is truncated or has trailing data"
                )
            body = f.read(expected - _HEADER.size)
        if len(body) != expected - _HEADER.size:
            raise fail("the file changed while it was read")
        digest = hashlib.sha256(header)
        digest.update(memoryview(body)[:-_DIGEST_SIZE])
        if digest.digest() != body[-_DIGEST_SIZE:]:
            raise fail("checksum mismatch (the file is corrupted)")
        try:
            index = cls(
                m,
                k,
                exact=bool(flags & _FLAG_EXACT),
                shortlist=shortlist or None,
                add_chunk_size=add_chunk_size,
                search_chunk_size=search_chunk_size,
            )
        except ValueError as error:
            raise fail(str(error)) from error
        packed = np.frombuffer(body, dtype=np.uint8, count=n * code_size)
        packed = packed.reshape(n, code_size)
        ids = np.frombuffer(body, dtype="<i8", count=n, offset=n * code_size)
        ids = ids.astype(np.int64)
        if n and (int(ids.min()) < 0 or _duplicates(ids).size):
            raise fail("ids are negative or repeated")
        for start in range(0, n, index._add_chunk):
            chunk = packed[start : start + index._add_chunk].copy()
            _clear_padding_bits(chunk, m, nbits)
            index._engine.add_packed(chunk)
        index._ids, index._size = ids, int(n)
        index._max_id = int(ids.max()) if n else -1
        return index


class ShardedSubicIndex:
    """Searches several `SubicIndex` shards as one, through faiss `IndexShards`.

    faiss searches the shards in parallel threads and merges their results;
    scores, ties and padding are those of one `SubicIndex` holding every
    shard's items in shard order. The shards stay independent objects: they
    may be added to or removed from between searches, and a search waits for
    any such change to finish.

    Example:

    ```python
    sharded = ShardedSubicIndex(index.shard(4))
    scores, ids = sharded.search(z_star, k=100)  # same as index.search
    ```

    Args:
        shards: `SubicIndex` objects with the same `num_blocks`, `block_size`,
            engine (`exact`) and `shortlist`, and disjoint ids (e.g. from
            `SubicIndex.shard`).

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
            for name in ("num_blocks", "block_size", "exact", "shortlist"):
                if getattr(shard, name) != getattr(shards[0], name):
                    raise ValueError(
                        "shards must share num_blocks, block_size, exact and "
                        f"shortlist; shards[0] has {name}="
                        f"{getattr(shards[0], name)}, shards[{i}] has "
                        f"{name}={getattr(shard, name)}"
                    )
        repeated = _duplicates(np.concatenate([s.get_ids() for s in shards]))
        if repeated.size:
            raise ValueError(f"shards share ids: {_preview(repeated)}")
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
    def _reading(self) -> Iterator[None]:
        # A writer holds one shard's lock only, so taking every read lock in
        # order cannot deadlock with it.
        with contextlib.ExitStack() as stack:
            for shard in self._shards:
                stack.enter_context(shard._lock.read())
            yield

    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        engines = [shard._engine for shard in self._shards]
        engine = _SHARDED_ENGINES[type(engines[0])](engines)
        ids = np.concatenate([shard._ids[: shard._size] for shard in self._shards])
        return _search_engine(engine, ids, queries, k, self._shards[0]._search_chunk)

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`SubicIndex.search` over the items of every shard."""
        k = check_int("k", k, minimum=1)
        queries = _as_queries("queries", queries, self.num_blocks, self.block_size)
        with self._reading():
            return self._search(queries, k)

    def search_codes(self, codes, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`SubicIndex.search_codes` over the items of every shard."""
        k = check_int("k", k, minimum=1)
        codes = _as_codes("codes", codes, self.num_blocks, self.block_size)
        with self._reading():
            return _search_codes(
                self._search,
                codes,
                k,
                self.block_size,
                self._shards[0]._search_chunk,
            )


def merge_results(
    results: Sequence[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merges per-shard top-k lists into the overall top-k by score.

    Equal scores keep the order of `results`, then the order within each list,
    so shards split by insertion order (`SubicIndex.shard`) merge to exactly
    the unsharded ranking. Slots with id -1 (missing) are ignored.

    Example:

    ```python
    scores, ids = merge_results([shard.search(z, 10) for shard in shards], 10)
    ```

    Args:
        results: a list of `(scores, ids)` pairs, each `(nq, k_i)`, as
            returned by `SubicIndex.search` on each shard.
        k: results to keep per query, >= 1.

    Returns:
        `(scores, ids)`: float32 `(nq, k)` and int64 `(nq, k)`, padded with
        score -inf and id -1 when fewer than `k` results exist.

    Raises:
        ValueError: for an empty list, mismatched shapes or NaN scores.
    """
    k = check_int("k", k, minimum=1)
    results = list(results)
    if not results:
        raise ValueError("results must hold at least one (scores, ids) pair")
    all_scores, all_ids = [], []
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
        all_scores.append(np.where(ids >= 0, scores, -np.inf).astype(np.float64))
        all_ids.append(ids.astype(np.int64))
    scores = np.concatenate(all_scores, axis=1)
    ids = np.concatenate(all_ids, axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    out_scores = np.full((len(scores), k), -np.inf, dtype=np.float32)
    out_ids = np.full((len(scores), k), -1, dtype=np.int64)
    taken = order.shape[1]
    out_scores[:, :taken] = np.take_along_axis(scores, order, axis=1)
    out_ids[:, :taken] = np.take_along_axis(ids, order, axis=1)
    out_ids[~np.isfinite(out_scores)] = -1
    return out_scores, out_ids
