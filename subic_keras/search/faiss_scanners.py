"""faiss's scans of a `CodeStore`: `IndexPQ` with identity centroids (exact
for any `K`) and the 4-bit `IndexPQFastScan` (a shortlist, re-scored).

A filter (`keep`) makes either scan the kept items' codes alone, with the
product quantizer's own look-up scan (`ProductQuantizer.search_ip`): exact
in float32, as the unfiltered `"faiss"` scan, for both.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from subic_keras.search import workers
from subic_keras.search.order import best_first
from subic_keras.search.scanner import Scanner
from subic_keras.search.store import CodeStore

# faiss's fast scan: 16-bit sums of up to 256 8-bit entries; C int positions.
FAST_SCAN_MAX_BLOCKS = 256
FAST_SCAN_MAX_ITEMS = 2**31 - 1
# Identity centroids (M x K x K floats) are real memory; 2**27 floats = 512 MiB.
_MAX_CENTROID_FLOATS = 1 << 27
# Elements (candidates x blocks) re-scored at once on the fast-scan path.
_RESCORE_BUDGET = 1 << 22
# faiss's exact scan of 3-, 5-, 6- and 7-bit blocks unpacks codes to bytes
# for batches of at least this many queries; codes are handed to faiss this
# many items at a time.
_BYTE_SCAN_MIN_QUERIES = 32
_CHUNK = 1 << 20


@functools.cache
def _faiss() -> Any:
    """faiss, or None where it is not installed (the native scan needs none)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


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
    _faiss().copy_array_to_vector(centroids.ravel(), pq.centroids)


@contextlib.contextmanager
def _omp_threads(count: int) -> Iterator[None]:
    """Sets the calling thread's OpenMP thread count for a block."""
    faiss = _faiss()
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def in_threads(search, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`search(queries)`, a faiss search, split over `workers.cores()` threads of
    this library, each running faiss with one OpenMP thread.

    How the faiss scanners run faiss, so that mixing them with the native
    scan in one process needs no environment variable: faiss's OpenMP
    threads spin after each call before they sleep (libgomp's default wait
    policy) and, where every core is busy, take that time from whatever runs
    next; `OMP_WAIT_POLICY=PASSIVE` stops the spinning but costs faiss a
    wake-up per call. Split this way, faiss leaves no spinning thread behind
    and keeps its speed under either policy (`benchmarks/search_speed.py`).

    Returns:
        The concatenated `(distances, labels)` of the parts.
    """
    count = workers.cores()
    if count == 1 or len(queries) < 2 * count:
        with _omp_threads(1):
            return search(queries)

    def run(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with _omp_threads(1):
            return search(queries[rows])

    parts = np.array_split(np.arange(len(queries)), count)
    found = workers.split_run(run, parts, count)
    return np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])


def _pad_columns(array: np.ndarray, width: int) -> np.ndarray:
    """Zero columns up to `width` (queries for padding blocks)."""
    if array.shape[1] == width:
        return array
    padded = np.zeros((len(array), width), dtype=np.float32)
    padded[:, : array.shape[1]] = array
    return padded


class FaissScanner(Scanner):
    """faiss `IndexPQ` with "g-hot" identity centroids: exact for any `K`.

    A sub-quantizer covers `g` consecutive blocks: centroid `j` has a one in
    block `t` at position `(j >> t*log2 K) & (K-1)`, so its inner product
    with `z*` is the sum of the `g` block scores, and since codes are packed
    least-significant bit first the store's bytes are its codes. `g` makes
    sub-codes 8 bits where possible (`K` = 2, 4, 16, 256: faiss's fastest
    look-up kernel) and about 12 bits otherwise. Batches of 32 or more
    queries over 3-, 5-, 6- or 7-bit blocks instead unpack the codes, a
    million items at a time, to one byte per sub-quantizer and scan them
    with faiss's byte-aligned kernel, which is faster for such batches.
    """

    name = "faiss"

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        faiss, nbits = _faiss(), self.nbits
        self.group = 8 // nbits if nbits in (1, 2, 4, 8) else max(1, 12 // nbits)
        num_groups = -(-num_blocks // self.group)
        self.width = num_groups * self.group * block_size
        ksub, dsub = 1 << (self.group * nbits), self.group * block_size
        if num_groups * ksub * dsub > _MAX_CENTROID_FLOATS:
            raise ValueError(
                f"num_blocks={num_blocks} with block_size={block_size} is too large "
                f"for the faiss scanner: its identity centroids would hold "
                f"{num_groups * ksub * dsub} floats (limit {_MAX_CENTROID_FLOATS}); "
                "use a native scanner"
            )
        self.index = faiss.IndexPQ(
            self.width, num_groups, self.group * nbits, faiss.METRIC_INNER_PRODUCT
        )
        _set_centroids(self.index.pq, self.group, block_size, nbits)
        self.index.is_trained = True
        self.stored_size = int(self.index.code_size)
        self.byte_group = 8 // nbits if nbits < 8 and 8 % nbits else 0
        if self.byte_group:
            num_bytes = -(-num_blocks // self.byte_group)
            self.byte_width = num_bytes * self.byte_group * block_size
            self.byte_pq = faiss.ProductQuantizer(self.byte_width, num_bytes, 8)
            _set_centroids(self.byte_pq, self.byte_group, block_size, nbits)

    def _lay_out(self, store: CodeStore, start: int) -> None:
        if start == 0:
            self.index.reset()
        for first in range(start, store.size, _CHUNK):
            packed = store.packed(slice(first, first + _CHUNK))
            # Padding blocks hold code 0; their query columns are zero.
            rows = np.zeros((len(packed), self.stored_size), dtype=np.uint8)
            rows[:, : store.code_size] = packed
            self.index.add_sa_codes(rows)

    def _search(self, store, queries, k, keep):
        if keep is not None:
            positions = np.flatnonzero(keep)
            pq, width = self.index.pq, self.width

            def chunks(start: int, stop: int) -> np.ndarray:
                # Padding blocks hold code 0; their query columns are zero.
                rows = np.zeros((stop - start, self.stored_size), dtype=np.uint8)
                rows[:, : store.code_size] = store.packed(positions[start:stop])
                return rows

            search = _subset_scan(pq, width, positions, chunks, k)
            return best_first(*in_threads(search, queries))
        if self.byte_group and len(queries) >= _BYTE_SCAN_MIN_QUERIES:
            found = in_threads(lambda q: self._byte_scan(store, q, k), queries)
        else:
            queries = _pad_columns(queries, self.width)
            found = in_threads(lambda q: self.index.search(q, k), queries)
        return best_first(*found)

    def _byte_scan(self, store, queries, k):
        """The same scores from codes unpacked to one byte per sub-quantizer."""
        shifts = (np.arange(self.byte_group) * self.nbits).astype(np.uint8)

        def unpacked(start: int, stop: int) -> np.ndarray:
            codes = np.zeros(
                (stop - start, self.byte_pq.M * self.byte_group), dtype=np.uint8
            )
            codes[:, : self.num_blocks] = store.codes(slice(start, stop), np.uint8)
            grouped = codes.reshape(stop - start, -1, self.byte_group) << shifts
            return np.bitwise_or.reduce(grouped, axis=-1)

        positions = np.arange(store.size)
        return _subset_scan(self.byte_pq, self.byte_width, positions, unpacked, k)(
            queries
        )


def _subset_scan(pq, width: int, positions: np.ndarray, codes_of, k: int):
    """A search of the items at `positions` by `pq`'s look-up scan.

    `codes_of(start, stop)` gives the codes of `positions[start:stop]` in
    `pq`'s layout; they are made and scanned `_CHUNK` items at a time.

    Returns:
        `search(queries) -> (scores, positions)`, the top `k` of each.
    """

    def search(queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        faiss = _faiss()
        queries = np.ascontiguousarray(_pad_columns(queries, width))
        nq = len(queries)
        heap = faiss.ResultHeap(nq, k, keep_max=True)
        for start in range(0, len(positions), _CHUNK):
            stop = min(len(positions), start + _CHUNK)
            codes = np.ascontiguousarray(codes_of(start, stop))
            found = min(k, stop - start)
            scores = np.empty((nq, found), dtype=np.float32)
            labels = np.empty((nq, found), dtype=np.int64)
            result = faiss.float_minheap_array_t()
            result.nh, result.k = nq, found
            result.val, result.ids = faiss.swig_ptr(scores), faiss.swig_ptr(labels)
            pq.search_ip(
                faiss.swig_ptr(queries), nq, faiss.swig_ptr(codes), stop - start,
                result, True,
            )  # fmt: skip
            chunk = positions[start:stop]
            heap.add_result(
                scores, np.where(labels >= 0, chunk[np.maximum(labels, 0)], -1)
            )
        heap.finalize()
        return heap.D, heap.I

    return search


class FastScanScanner(Scanner):
    """faiss's 4-bit `IndexPQFastScan` shortlist, re-scored exactly."""

    name = "faiss-fastscan"

    def __init__(self, num_blocks: int, block_size: int, shortlist: int | None):
        super().__init__(num_blocks, block_size)
        self.shortlist = shortlist
        self.width = num_blocks * block_size
        self.offsets = np.arange(num_blocks, dtype=np.int64) * block_size
        self.index = self._empty()

    def _empty(self, flat=None):
        faiss = _faiss()
        if flat is not None:  # faiss converts a flat IndexPQ to its blocked layout
            return faiss.IndexPQFastScan(flat, 32)
        index = faiss.IndexPQFastScan(
            self.width, self.num_blocks, 4, faiss.METRIC_INNER_PRODUCT, 32
        )
        _set_centroids(index.pq, 1, self.block_size, 4)
        index.is_trained = True
        index.implem = 15  # faiss's fastest kernel for one query at a time
        return index

    def _lay_out(self, store: CodeStore, start: int) -> None:
        faiss = _faiss()
        if start == 0:
            self.index = self._empty()
        if store.size - start >= FAST_SCAN_MAX_ITEMS - self.index.ntotal:
            raise ValueError(
                f"the faiss-fastscan scanner holds fewer than {FAST_SCAN_MAX_ITEMS} "
                f"items (a faiss limit); this index has {store.size}. Use a native "
                "scanner or shard the database"
            )
        for first in range(start, store.size, _CHUNK):
            flat = faiss.IndexPQ(
                self.width, self.num_blocks, 4, faiss.METRIC_INNER_PRODUCT
            )
            _set_centroids(flat.pq, 1, self.block_size, 4)
            flat.is_trained = True
            flat.add_sa_codes(
                np.ascontiguousarray(store.packed(slice(first, first + _CHUNK)))
            )
            self.index.merge_from(self._empty(flat), 0)

    def _search(self, store, queries, k, keep):
        if keep is not None:
            # The kept codes scanned exactly by the 4-bit quantizer's own
            # look-ups: the same float32 sums as the "faiss" scanner's.
            positions = np.flatnonzero(keep)
            search = _subset_scan(
                self.index.pq,
                self.width,
                positions,
                lambda start, stop: store.packed(positions[start:stop]),
                k,
            )
            return best_first(*in_threads(search, queries))
        n = store.size
        shortlist = max(2 * k, k + 64) if self.shortlist is None else self.shortlist
        shortlist = min(n, max(k, shortlist))
        _, candidates = in_threads(lambda q: self.index.search(q, shortlist), queries)
        scores = np.empty((len(queries), k), dtype=np.float64)
        positions = np.empty((len(queries), k), dtype=np.int64)
        step = max(1, _RESCORE_BUDGET // (shortlist * self.num_blocks))
        for start in range(0, len(queries), step):
            rows = slice(start, start + step)
            scores[rows], positions[rows] = self._rescore(
                store, queries[rows], candidates[rows], k
            )
        # faiss never returns items whose quantised score is the minimum, 0
        # (every block at its table's minimum). When fewer than `shortlist`
        # items score above it, rank those rows by an exact scan instead.
        short = np.flatnonzero((candidates < 0).any(axis=1))
        for start in range(0, len(short), 64):
            rows = short[start : start + 64]
            scores[rows], positions[rows] = self._scan(store, queries[rows], k)
        return scores, positions

    def _rescore(self, store, queries, candidates, k):
        """Exact scores of `candidates`, the best `k` per row, best first."""
        valid = candidates >= 0
        candidates = np.where(valid, candidates, 0)
        columns = store.codes(candidates) + self.offsets
        rows = np.arange(len(queries))[:, None, None]
        exact = queries[rows, columns].sum(axis=-1, dtype=np.float64)
        exact[~valid] = -np.inf
        return best_first(exact, candidates, k)

    def _scan(self, store, queries, k):
        """Exact top-k over every stored item, in chunks (NumPy)."""
        best_scores = np.full((len(queries), 0), -np.inf)
        best = np.zeros((len(queries), 0), dtype=np.int64)
        chunk = max(1, _RESCORE_BUDGET // (len(queries) * self.num_blocks))
        for start in range(0, store.size, chunk):
            positions = np.arange(start, min(store.size, start + chunk))
            columns = store.codes(positions) + self.offsets
            chunk_scores = queries[:, columns].sum(axis=-1, dtype=np.float64)
            best_scores = np.concatenate([best_scores, chunk_scores], axis=1)
            best = np.concatenate(
                [best, np.broadcast_to(positions, chunk_scores.shape)], axis=1
            )
            best_scores, best = best_first(best_scores, best, k)
        return best_scores, best
