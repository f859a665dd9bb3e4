"""Scanners: the strategies that rank a `CodeStore` for real queries `z*`.

Every scanner returns the top-`k` positions of the store and their exact
scores `sum_m z*[m*K + c_m]` (paper Sec. 3.3, Eq. 8), best first, equal
scores by position. `SubicIndex(..., scanner=NAME)` picks one:

- `"native-vbmi"`, `"native-avx512bw"`, `"native-avx2"`, `"native-neon"`,
  `"native-portable"`: the native exact scan (`native`, built by `pip
  install` where a C compiler is present), with the kernel named: AVX-512
  VBMI `vpermb`, AVX2 `pshufb` (16-entry sub-tables and a blend tree for
  5- to 8-bit sub-codes) on 512 bits with AVX-512BW or on 256, NEON `tbl`,
  or portable C. Bounds from 8-bit tables, exact float64
  refinement: the same ids as a float64 brute force.
- `"faiss"`: faiss's `IndexPQ` with identity centroids, exact for any `K`
  (scores summed in float32).
- `"faiss-fastscan"` (`K = 16`, `M <= 256`): faiss's 4-bit SIMD
  `IndexPQFastScan` gives a shortlist of `max(shortlist, k)` candidates
  (default `max(2k, k + 64)`), re-scored exactly from the store. Recall
  against the exact scan measured >= 0.999 on random codes with ReLU
  queries, but is not guaranteed.
- `"auto"` (default): the fastest native kernel this CPU runs
  (`available()` lists them, best first), else faiss's fast scan for
  `K = 16` and its exact scan otherwise.

A scanner keeps its own layout of the codes (tiles of the distinct codes
for the native kernels, a faiss index for faiss's), made on the first
search after the store changed: faiss's indexes are extended after
appends, the native tiles are made anew (equal codes may be anywhere).
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from subic_keras.search import native
from subic_keras.search.store import CodeStore

NATIVE_SCANNERS = {
    "native-vbmi": "vbmi",
    "native-avx512bw": "avx512bw",
    "native-avx2": "avx2",
    "native-neon": "neon",
    "native-portable": "portable",
}
SCANNERS = (*NATIVE_SCANNERS, "faiss", "faiss-fastscan")

# faiss's fast scan: 16-bit sums of up to 256 8-bit entries; C int positions.
FAST_SCAN_MAX_BLOCKS = 256
FAST_SCAN_MAX_ITEMS = 2**31 - 1
# Identity centroids (M x K x K floats) are real memory; 2**27 floats = 512 MiB.
_MAX_CENTROID_FLOATS = 1 << 27
# Elements (candidates x blocks) re-scored at once on the fast-scan path.
_RESCORE_BUDGET = 1 << 22
# faiss's exact scan of 3-, 5-, 6- and 7-bit blocks unpacks codes to bytes
# for batches of at least this many queries, this many items at a time.
_BYTE_SCAN_MIN_QUERIES = 32
_BYTE_SCAN_CHUNK = 1 << 20


def threads() -> int:
    """Threads a search uses: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def available(num_blocks: int, block_size: int) -> list[str]:
    """The scanners this CPU and build can run for such codes, best first."""
    names = [f"native-{kernel}" for kernel in native.kernels()]
    if _faiss() is not None:
        names.append("faiss")
        if block_size == 16 and num_blocks <= FAST_SCAN_MAX_BLOCKS:
            names.append("faiss-fastscan")
    return names


def resolve(scanner: str, num_blocks: int, block_size: int) -> str:
    """The scanner `scanner` names for such codes (`"auto"` chooses one).

    Raises:
        ValueError: naming the scanners that can run here, if `scanner` is
            unknown, or this CPU, build or block shape cannot run it.
    """
    can_run = available(num_blocks, block_size)
    if scanner == "auto":
        native_ones = [name for name in can_run if name in NATIVE_SCANNERS]
        if native_ones:
            return native_ones[0]
        return "faiss-fastscan" if "faiss-fastscan" in can_run else "faiss"
    if scanner not in can_run:
        if scanner not in SCANNERS:
            why = f"one of {', '.join(('auto', *SCANNERS))}"
        elif scanner == "faiss-fastscan" and _faiss() is not None:
            why = (
                f"faiss-fastscan needs block_size 16 and num_blocks <= "
                f"{FAST_SCAN_MAX_BLOCKS} (received {block_size} and {num_blocks}); "
                f"this index can use one of {', '.join(('auto', *can_run))}"
            )
        else:
            why = f"one this CPU and build can run: {', '.join(('auto', *can_run))}"
        raise ValueError(f"scanner must be {why}; received {scanner!r}")
    return scanner


def make(
    scanner: str, num_blocks: int, block_size: int, shortlist: int | None = None
) -> Scanner:
    """A new scanner of `resolve`d name `scanner`."""
    if scanner in NATIVE_SCANNERS:
        return NativeScanner(num_blocks, block_size, NATIVE_SCANNERS[scanner])
    if scanner == "faiss":
        return FaissScanner(num_blocks, block_size)
    return FastScanScanner(num_blocks, block_size, shortlist)


def best_first(scores: np.ndarray, positions: np.ndarray, k: int | None = None):
    """Each row by score, highest first, equal scores by position; its first `k`."""
    order = np.lexsort((positions, -scores), axis=-1)[:, :k]
    return (
        np.take_along_axis(scores, order, axis=1),
        np.take_along_axis(positions, order, axis=1),
    )


class Scanner(abc.ABC):
    """Ranks a `CodeStore`; keeps a layout of it in step with its versions."""

    name: str

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.nbits = block_size.bit_length() - 1
        self._synced = (-1, -1, 0)  # store version, removals, rows laid out
        self._sync_lock = threading.Lock()  # searches run in parallel

    def search(
        self, store: CodeStore, queries: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top `k <= store.size` scores and positions of each query, best first."""
        with self._sync_lock:
            version, removals, rows = self._synced
            if version != store.version:
                start = rows if removals == store.removals else 0
                self._lay_out(store, start)
                self._synced = (store.version, store.removals, store.size)
        return self._search(store, queries, k)

    @abc.abstractmethod
    def _lay_out(self, store: CodeStore, start: int) -> None:
        """Lays out the store's rows; those before `start` are laid out already."""

    @abc.abstractmethod
    def _search(self, store: CodeStore, queries: np.ndarray, k: int):
        """`search` once the layout is in step."""


class NativeScanner(Scanner):
    """The native exact scan with one kernel (see `native`)."""

    def __init__(self, num_blocks: int, block_size: int, kernel: str):
        super().__init__(num_blocks, block_size)
        self.name, self.kernel = "native-" + kernel, kernel
        self.layout = native.Layout.for_kernel(num_blocks, block_size, kernel)
        self._tiles: np.ndarray | None = None
        self._rows = 0
        self._groups: tuple[np.ndarray, np.ndarray] | None = None

    def _lay_out(self, store: CodeStore, start: int) -> None:
        # Rebuilt whole: a tile mixes every item's columns, and equal codes
        # (scanned once, `native.group_equal`) may be anywhere.
        grouped = native.group_equal(store.packed())
        if grouped is None:
            rows, self._groups = np.arange(store.size), None
        else:
            rows, self._groups = grouped[0], grouped[1:]
        self.layout = native.Layout.for_kernel(
            self.num_blocks, self.block_size, self.kernel, len(rows)
        )
        columns = np.empty((len(rows), self.layout.columns), dtype=self.layout.dtype)
        for first in range(0, len(rows), _BYTE_SCAN_CHUNK):
            part = slice(first, first + _BYTE_SCAN_CHUNK)
            if self.layout.raw_bytes:
                columns[part] = store.packed(rows[part])
            else:
                columns[part] = self.layout.columns_of(store.codes(rows[part]))
        self._tiles, self._rows = self.layout.tiles(columns), len(rows)

    def _search(self, store, queries, k):
        assert self._tiles is not None
        return native.search(
            self.layout,
            self._tiles,
            self._rows,
            queries,
            k,
            threads(),
            self.kernel,
            self._groups,
        )


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
    """`search(queries)`, a faiss search, split over `threads()` threads of
    this library, each running faiss with one OpenMP thread.

    How the faiss scanners run faiss, so that mixing them with the native
    scan in one process needs no environment variable. faiss's OpenMP
    threads spin for milliseconds after each call before they sleep
    (libgomp's default wait policy), and where every core is busy they take
    that time from whatever runs next: the native scan right after a faiss
    search lost 6 ms of 20 (60,000 codes, 2 cores). `OMP_WAIT_POLICY=PASSIVE`
    stops the spinning but costs faiss a wake-up per call (its Hamming scan
    of 60,000 codes: 28,500 queries/s instead of 36,100). Split this way,
    faiss leaves no spinning thread behind and runs as fast as under the
    default policy (35,000 and 34,300 queries/s, policy unset and PASSIVE).

    Returns:
        The concatenated `(distances, labels)` of the parts.
    """
    count = threads()
    if count == 1 or len(queries) < 2 * count:
        with _omp_threads(1):
            return search(queries)

    def run(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with _omp_threads(1):
            return search(queries[rows])

    parts = np.array_split(np.arange(len(queries)), count)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        found = list(pool.map(run, parts))
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
    with faiss's byte-aligned kernel (1.6x faster for `K = 64` at 1,000
    queries over 1M items).
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
        for first in range(start, store.size, _BYTE_SCAN_CHUNK):
            packed = store.packed(slice(first, first + _BYTE_SCAN_CHUNK))
            # Padding blocks hold code 0; their query columns are zero.
            rows = np.zeros((len(packed), self.stored_size), dtype=np.uint8)
            rows[:, : store.code_size] = packed
            self.index.add_sa_codes(rows)

    def _search(self, store, queries, k):
        if self.byte_group and len(queries) >= _BYTE_SCAN_MIN_QUERIES:
            found = in_threads(lambda q: self._byte_scan(store, q, k), queries)
        else:
            queries = _pad_columns(queries, self.width)
            found = in_threads(lambda q: self.index.search(q, k), queries)
        return best_first(*found)

    def _byte_scan(self, store, queries, k):
        """The same scores from codes unpacked to one byte per sub-quantizer."""
        faiss = _faiss()
        queries = np.ascontiguousarray(_pad_columns(queries, self.byte_width))
        nq, n = len(queries), store.size
        heap = faiss.ResultHeap(nq, k, keep_max=True)
        shifts = (np.arange(self.byte_group) * self.nbits).astype(np.uint8)
        for start in range(0, n, _BYTE_SCAN_CHUNK):
            stop = min(n, start + _BYTE_SCAN_CHUNK)
            codes = np.zeros(
                (stop - start, self.byte_pq.M * self.byte_group), dtype=np.uint8
            )
            codes[:, : self.num_blocks] = store.codes(slice(start, stop), np.uint8)
            grouped = codes.reshape(stop - start, -1, self.byte_group) << shifts
            codes = np.ascontiguousarray(np.bitwise_or.reduce(grouped, axis=-1))
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
        for first in range(start, store.size, _BYTE_SCAN_CHUNK):
            flat = faiss.IndexPQ(
                self.width, self.num_blocks, 4, faiss.METRIC_INNER_PRODUCT
            )
            _set_centroids(flat.pq, 1, self.block_size, 4)
            flat.is_trained = True
            flat.add_sa_codes(
                np.ascontiguousarray(
                    store.packed(slice(first, first + _BYTE_SCAN_CHUNK))
                )
            )
            self.index.merge_from(self._empty(flat), 0)

    def _search(self, store, queries, k):
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
