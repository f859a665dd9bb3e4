"""The native exact scan: SIMD bounds on quantised tables, exact refinement.

`_scan.c` (built by `pip install .` where a C compiler is present) scores
every item with integer look-up tables of 8 bits, added with SIMD shuffles
(AVX2 `pshufb` for 4-bit sub-codes, AVX-512 VBMI `vpermb` for sub-codes of
5 to 8 bits, portable C elsewhere). Rounding the tables down bounds each
item's exact score from both sides, so once `k` items are kept every item
whose bound falls below the k-th exact score is skipped, and every other
item is scored exactly in float64: the result is the exact top-k, equal
scores by position (earlier first). Bounds are tight for typical queries;
a query with one huge entry coarsens them, and more items are then scored
exactly (slower, never wrong).

Blocks are grouped into sub-codes of at most 8 bits: on CPUs with AVX-512
VBMI one sub-code per byte (8, 4 or 2 blocks for `K` = 2, 4, 16, exactly
the bytes `FlatEngine` stores; two blocks for `K` = 8; one for `K` = 32 ...
256), elsewhere two 4-bit sub-codes per byte for `K` = 2, 4, 16. Blocks of
512 or 1024 values are one uint16 sub-code each, bounded in portable C.
Each query gets one float64 table per sub-code, the sum of its blocks'
entries of `z*`, and scores are float64 until `top_k` rounds them. The database is kept
in tiles of `TILE` items, one row of bytes per sub-code column, built on
the first search after a change.

`SUBIC_NATIVE=0` in the environment turns the native scan off (the faiss
engines then search); `kernel()` names the kernel this CPU runs.

Measured (`benchmarks/search_speed.py`, AMD EPYC Zen 4 with AVX-512 VBMI, 2
threads, 1,000,000 random codes, batches of 1,000 ReLU queries, k = 100):
3,949 queries/s at 64 bits with K = 256 (faiss's IndexPQ scan, the path it
replaces: 278; faiss's Hamming scan of 64-bit codes: 1,181), 4,526 with
K = 16 (faiss's fast scan with re-scoring: 2,725; Hamming 1,539), and
9,187 at 48 bits with K = 64 (faiss: 327; Hamming 553). Ratios
depend on the CPU; the README's table records the one it ran on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Iterator

import numpy as np

try:
    from subic_keras.search import _scan  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: faiss's engines search
    _scan = None

TILE = 1024
# Queries per kernel call (the threads split the batch in such chunks).
_QUERY_CHUNK = 256


def available() -> bool:
    """The extension was built and `SUBIC_NATIVE` does not turn it off."""
    return _scan is not None and os.environ.get("SUBIC_NATIVE", "1") != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Searches inside use faiss's engines (e.g. to compare the two)."""
    previous = os.environ.get("SUBIC_NATIVE")
    os.environ["SUBIC_NATIVE"] = "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["SUBIC_NATIVE"]
        else:
            os.environ["SUBIC_NATIVE"] = previous


def kernel(block_size: int) -> str | None:
    """The kernel that scans codes of `block_size` on this CPU; None unbuilt."""
    if _scan is None:
        return None
    return _scan.kernel_name(Layout.for_block_size(1, block_size).bits, TILE)


class Layout:
    """How `M` blocks of `K` values become the kernel's sub-codes."""

    def __init__(self, num_blocks: int, block_size: int, nbits: int, bits: int):
        self.num_blocks, self.block_size, self.nbits = num_blocks, block_size, nbits
        self.bits = bits  # 4: two sub-codes per byte; 8: one; 16: one per uint16
        self.per_group = max(1, bits // nbits) if bits != 16 else 1
        self.groups = -(-num_blocks // self.per_group)
        self.columns = -(-self.groups // 2) if bits == 4 else self.groups
        self.entries = 1 << (self.per_group * nbits)
        self.table = {4: 16, 8: max(64, self.entries), 16: self.entries}[bits]
        self.dtype = np.uint16 if bits == 16 else np.uint8

    @classmethod
    def for_block_size(cls, num_blocks: int, block_size: int) -> Layout:
        """The fastest layout on this CPU for blocks of `block_size` values."""
        nbits = block_size.bit_length() - 1
        if nbits > 8:
            return cls(num_blocks, block_size, nbits, 16)
        bytes_kernel = _scan is not None and _scan.kernel_name(8, TILE) == "avx512vbmi"
        bits = 4 if 4 % nbits == 0 and not bytes_kernel else 8
        return cls(num_blocks, block_size, nbits, bits)

    @property
    def raw_bytes(self) -> bool:
        """Whether bit-packed codes (LSB first) already are the byte columns."""
        return self.bits != 16 and 8 % self.nbits == 0

    def columns_of(self, codes: np.ndarray) -> np.ndarray:
        """Integer codes `(n, M)` to the kernel's columns `(n, columns)`."""
        n = len(codes)
        if self.bits == 16:
            return np.asarray(codes, dtype=np.uint16)
        padded = np.zeros((n, self.groups * self.per_group), dtype=np.uint16)
        padded[:, : self.num_blocks] = codes
        shifts = (np.arange(self.per_group) * self.nbits).astype(np.uint16)
        grouped = padded.reshape(n, self.groups, self.per_group) << shifts
        sub = np.bitwise_or.reduce(grouped, axis=-1).astype(np.uint8)
        if self.bits == 8:
            return sub
        if self.groups % 2:
            sub = np.concatenate([sub, np.zeros((n, 1), np.uint8)], axis=1)
        return sub[:, 0::2] | (sub[:, 1::2] << 4)

    def tiles(self, columns: np.ndarray) -> np.ndarray:
        """Columns `(n, columns)` to tiles, flat."""
        n = len(columns)
        num_tiles = -(-n // TILE)
        padded = np.zeros((num_tiles * TILE, self.columns), dtype=self.dtype)
        padded[:n] = columns
        tiled = padded.reshape(num_tiles, TILE, self.columns).transpose(0, 2, 1)
        return np.ascontiguousarray(tiled).ravel()


def search(
    layout: Layout,
    tiles: np.ndarray,
    n: int,
    queries: np.ndarray,
    k: int,
    threads: int,
    simd: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-`k` scores (float64) and positions, best first, `k <= n`.

    `simd=False` runs the portable kernel (the tests compare the two).
    """
    nq = len(queries)
    scores = np.empty((nq, k), dtype=np.float64)
    positions = np.empty((nq, k), dtype=np.int64)
    if not nq:
        return scores, positions
    chunk = min(_QUERY_CHUNK, -(-nq // max(1, threads)))

    queries = np.ascontiguousarray(queries, dtype=np.float32)

    def run(start: int) -> None:
        stop = min(nq, start + chunk)
        _scan.scan(
            tiles,
            n,
            TILE,
            layout.columns,
            layout.bits,
            layout.table,
            layout.groups,
            layout.num_blocks,
            layout.block_size,
            layout.per_group,
            k,
            queries[start:stop],
            stop - start,
            scores[start:stop],
            positions[start:stop],
            simd,
        )

    starts = range(0, nq, chunk)
    if len(starts) == 1 or threads <= 1:
        for start in starts:
            run(start)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, starts))
    return scores, positions
