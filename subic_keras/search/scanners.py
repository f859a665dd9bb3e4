"""The scanners: which ranks a `CodeStore`, by name (the registry).

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
  (default `max(2k, k + 64)`), re-scored exactly from the store: recall
  against the exact scan is high but not guaranteed
  (`benchmarks/search_speed.py` measures it).
- `"auto"` (default): the fastest native kernel this CPU runs
  (`available()` lists them, best first), else faiss's fast scan for
  `K = 16` and its exact scan otherwise.

Each is a `scanner.Scanner` (`native_scanner`, `faiss_scanners`). A
scanner keeps its own layout of the codes (tiles of the distinct codes for
the native kernels, a faiss index for faiss's), made on the first search
after the store changed: faiss's indexes are extended after appends, the
native tiles are made anew (equal codes may be anywhere). Every scanner
takes a filter (`keep`), and returns the exact top `k` of the items kept.
"""

from __future__ import annotations

from subic_keras.search import native
from subic_keras.search.faiss_scanners import (
    FAST_SCAN_MAX_BLOCKS,
    FaissScanner,
    FastScanScanner,
    _faiss,
)
from subic_keras.search.native_scanner import NativeScanner
from subic_keras.search.scanner import Scanner

NATIVE_SCANNERS = {
    "native-vbmi": "vbmi",
    "native-avx512bw": "avx512bw",
    "native-avx2": "avx2",
    "native-neon": "neon",
    "native-portable": "portable",
}
SCANNERS = (*NATIVE_SCANNERS, "faiss", "faiss-fastscan")


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
