"""The native exact scan: SIMD bounds on quantised tables, exact refinement.

`_scan.c` (built by `pip install .` where a C compiler is present) scores
every item with integer look-up tables of 8 bits, added with SIMD table
look-ups. Rounding the tables down bounds each item's exact score from both
sides, so once `k` items are kept every item whose bound falls below the
k-th exact score is skipped, and every other item is scored exactly in
float64: the result is the exact top-k, equal scores by position (earlier
first). Bounds are tight for typical queries; a query with one huge entry
coarsens them, and more items are then scored exactly (slower, never wrong).

Kernels (`kernels()` lists those this CPU runs, best first):

- `"vbmi"` (AVX-512 VBMI): `vpermb` looks up 64 sub-codes of up to 8 bits
  at once (8, 4 or 2 blocks a byte for `K` = 2, 4, 16; two for `K` = 8;
  one for `K` = 32 ... 256). Below `SMALL_DATABASE` codes, and for codes
  of 256 bits or more, `K` = 2, 4 and 16 take 4-bit sub-codes instead,
  looked up by 512-bit `vpshufb` as `"avx512bw"` does: their tables have 8
  times fewer entries to build per query, which outweighs the slower scan
  in small databases, and four queries share each load of long codes.
- `"avx512bw"` (AVX-512BW without VBMI: Skylake-SP, Cascade Lake): the
  `"avx2"` kernel's look-ups on 512 bits, 64 sub-codes at once, the blend
  tree's choices read into mask registers by `vptestmb`; four queries of
  a batch share each load of 4-bit sub-codes.
- `"avx2"`: `pshufb` on 16-entry tables for 4-bit sub-codes (two per byte,
  for `K` = 2, 4, 16; four queries of a batch share each load of them,
  two where fewer are left), and
  for 5- to 8-bit sub-codes on the table's
  16-entry sub-tables, of which a blend tree on the high bits keeps one
  (the split-table look-up of PQ Fast Scan and Quicker ADC).
- `"neon"` (aarch64): `tbl` on one register for 4-bit sub-codes, on four
  (64 entries, or-ed by quarter) for 5 to 8 bits.
- `"portable"`: C the compiler vectorises; one 8-bit sub-code per byte.

Blocks of 512 or 1024 values are one uint16 sub-code each, bounded in
portable C by every kernel. Each query gets one float64 table per
sub-code, the sum of its blocks' entries of `z*`, and scores are float64.
The database is kept in tiles of `TILE` items, one row of bytes per
sub-code column.

`benchmarks/search_speed.py` runs every kernel this CPU has against
faiss's Hamming scan in one process; its results name the CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search import workers
from subic_keras.search.order import best_first

if TYPE_CHECKING:
    from subic_keras.search.store import CodeStore

try:
    from subic_keras.search import _scan  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: faiss's scanners search
    _scan = None

TILE = 1024
# Fewer codes than this: the VBMI kernel scans 4-bit sub-codes (see above).
SMALL_DATABASE = 1 << 17
# Queries per kernel call (the threads split the batch in such chunks).
_QUERY_CHUNK = 256


# The binding's kernel numbers.
_KERNEL_IDS = {"portable": 0, "avx2": 1, "vbmi": 2, "neon": 3, "avx512bw": 4}


def kernels() -> tuple[str, ...]:
    """The kernels this CPU runs, best first; none where `_scan` is unbuilt."""
    return tuple(_scan.kernels()) if _scan is not None else ()


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
    def for_kernel(
        cls, num_blocks: int, block_size: int, kernel: str, rows: int = 0
    ) -> Layout:
        """The layout `kernel` scans fastest for `rows` codes of blocks of
        `block_size` values.

        Nibbles (two sub-codes per byte) where the kernel looks 16-entry
        tables up in one instruction (for VBMI, in small databases and for
        codes of 256 bits or more, where four queries sharing each load of
        nibbles beat its 256-entry look-ups on bytes), bytes elsewhere (the
        portable kernel makes half as many look-ups on bytes).
        """
        nbits = block_size.bit_length() - 1
        if nbits > 8:
            return cls(num_blocks, block_size, nbits, 16)
        long_codes = num_blocks * nbits >= 256
        nibble_kernels = (
            "avx2",
            "avx512bw",
            "neon",
            *(("vbmi",) if rows < SMALL_DATABASE or long_codes else ()),
        )
        nibbles = kernel in nibble_kernels and 4 % nbits == 0
        return cls(num_blocks, block_size, nbits, 4 if nibbles else 8)

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
        """Columns `(n, columns)` to tiles, flat, starting on a cache line."""
        n = len(columns)
        num_tiles = -(-n // TILE)
        padded = np.zeros((num_tiles * TILE, self.columns), dtype=self.dtype)
        padded[:n] = columns
        tiled = padded.reshape(num_tiles, TILE, self.columns).transpose(0, 2, 1)
        out = aligned_empty(tiled.size, self.dtype)
        out.reshape(tiled.shape)[...] = tiled
        return out


def aligned_empty(size: int, dtype: type) -> np.ndarray:
    """An uninitialised flat array whose data starts on a 64-byte boundary.

    NumPy's arrays may start 16, 32 or 48 bytes into a cache line (it
    varies from call to call), and then the AVX-512 kernels' 64-byte loads,
    and some of the AVX2 ones' 32-byte loads, straddle two lines, which
    slows the scan down.
    """
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(size * itemsize + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + size * itemsize].view(dtype)


def search(
    layout: Layout,
    tiles: np.ndarray,
    n: int,
    queries: np.ndarray,
    k: int,
    threads: int,
    kernel: str,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
    keep_bits: np.ndarray | None = None,
    *,
    queries_per_load: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-`k` scores (float64) and positions, best first.

    `kernel` is one of `kernels()`; `layout` should be `Layout.for_kernel`'s
    for it (any layout gives the same results). `tiles` hold `n` codes: the
    items at positions `0 .. n-1`, or with `groups = (starts, members)` (see
    `group_equal`) the codes of the items `members[starts[r]:starts[r+1]]`.
    `keep_bits`, one bit per item position (`np.packbits(keep,
    bitorder="little")`), is a filter: only the items whose bit is set are
    returned. The kernels skip the others before
    scoring them exactly (without `groups`, a row is an item, and a tile
    without any kept row is not scanned at all). `k` is at most the number
    of items (of kept items, with `keep`).

    The `threads` take chunks of the queries; with fewer chunks than
    threads (a single query), ranges of rows of a large database too, whose
    top `k`s are merged. The x86 kernels of 4-bit sub-codes scan four
    consecutive queries in one pass over the codes (AVX2: two or one where
    fewer are left); `queries_per_load` caps that (1 or 2), so that a
    benchmark measures what sharing gains (the results are the same).
    """
    if queries_per_load is not None:
        queries_per_load = check_int("queries_per_load", queries_per_load, minimum=1)
    nq = len(queries)
    if not nq:
        return np.empty((0, k), np.float64), np.empty((0, k), np.int64)
    chunk = min(_QUERY_CHUNK, -(-nq // max(1, threads)))
    starts = range(0, nq, chunk)
    row_bytes = layout.columns * (2 if layout.bits == 16 else 1)
    ranges = _row_ranges(n, row_bytes, max(1, threads // len(starts)))
    scores = np.empty((len(ranges), nq, k), dtype=np.float64)
    positions = np.empty((len(ranges), nq, k), dtype=np.int64)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    empty = np.zeros(0, np.int64)
    group_starts, members = groups if groups is not None else (empty, empty)
    row_bits = member_bits = np.zeros(0, np.uint8)
    if keep_bits is not None:
        if groups is None:
            row_bits = keep_bits
        else:
            member_bits = keep_bits
    tile_entries = layout.columns * TILE

    def run(part: tuple[int, int]) -> None:
        start, at = part
        stop = min(nq, start + chunk)
        first, last = ranges[at]  # rows, on tile boundaries
        part_starts, part_members = group_starts, members
        if groups is not None and (first, last) != (0, n):
            part_starts = group_starts[first : last + 1] - group_starts[first]
            part_members = members[group_starts[first] : group_starts[last]]
        _scan.scan(
            tiles[first // TILE * tile_entries : -(-last // TILE) * tile_entries],
            last - first,
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
            scores[at, start:stop],
            positions[at, start:stop],
            _KERNEL_IDS[kernel],
            queries_per_load or 0,
            part_starts,
            part_members,
            row_bits[first // 8 : -(-last // 8)],
            member_bits,
        )
        if groups is None and first:
            found = positions[at, start:stop]
            found[found >= 0] += first

    parts = [(start, at) for start in starts for at in range(len(ranges))]
    if threads <= 1 or len(parts) == 1:
        for part in parts:
            run(part)
    else:
        workers.split_run(run, parts, threads)
    if len(ranges) == 1:
        return scores[0], positions[0]
    # Empty slots (-1) score -inf, below every item: they come last.
    return best_first(
        np.concatenate(list(scores), axis=1), np.concatenate(list(positions), axis=1), k
    )


# A single query (or fewer chunks of queries than threads) splits the rows
# among the threads in ranges of at least this many bytes of codes: a
# smaller range scans in less time than handing it to a kept thread takes
# (measured in docs/search.md, "Search").
_RANGE_BYTES = 12 << 20


def _row_ranges(n: int, row_bytes: int, wanted: int) -> list[tuple[int, int]]:
    """Up to `wanted` ranges of rows `[first, last)` covering `0 .. n`, each
    starting on a tile and of at least `_RANGE_BYTES` of codes of
    `row_bytes` each (one range below)."""
    count = max(1, min(wanted, n * row_bytes // _RANGE_BYTES))
    num_tiles = -(-n // TILE)
    bounds = [min(n, (num_tiles * r // count) * TILE) for r in range(count + 1)]
    return list(itertools.pairwise(bounds))


# Above this many items, whether codes repeat is first estimated from
# every row (`sample_repeats`): the rows whose hash falls in a share of the
# hash space that keeps about `_SAMPLED` of them.
_ESTIMATE_ABOVE = 1 << 18
_SAMPLED = 1 << 16
# Sampled distinct rows above this share of the sampled rows: codes that
# hardly repeat, said without grouping them. (The exact rule is 0.9; the
# estimate's error at 65,536 sampled rows is about 0.4 %.)
_DISTINCT_SHARE = 0.98


def score_rows(
    packed: np.ndarray, positions: np.ndarray, table: np.ndarray, nbits: int
) -> np.ndarray:
    """`sum_m table[m * K + c_m]` (float64) of the packed codes `(n,
    code_size)` at `positions` (1-D), `table` one query `(M * K,)`: in C,
    reading each code's blocks where it lies; NumPy where `_scan` is unbuilt.

    Example:

    >>> from subic_keras.search import packing
    >>> packed = packing.pack(np.array([[1, 2], [3, 0]]), 2)
    >>> score_rows(packed, np.array([1, 0]), np.arange(8.0), 2).tolist()
    [7.0, 7.0]
    """
    num_blocks = len(table) >> nbits
    positions = np.ascontiguousarray(positions, np.int64)
    table = np.ascontiguousarray(table, np.float32)
    if _scan is None:
        from subic_keras.search import packing

        codes = packing.unpack(packed[positions], num_blocks, nbits, np.int64)
        offsets = np.arange(num_blocks) << nbits
        return table[codes + offsets].sum(axis=-1, dtype=np.float64)
    packed = np.ascontiguousarray(packed, np.uint8)
    out = np.empty(len(positions), np.float64)
    _scan.score_rows(
        packed, len(packed), packed.shape[1], nbits, num_blocks,
        positions, len(positions), table, out,
    )  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True)
class SecondCode:
    """A second code of a search's items, which orders its equal scores:
    their packed codes `(n, code_size)` at the same positions (blocks of
    `nbits` bits), and one query of it per query, `(nq, M'·K')`. An item's
    key is its score `sum_m l_m[c_m]` (Eq. 10), higher first."""

    packed: np.ndarray
    nbits: int
    queries: np.ndarray

    def scores(self, row: int, positions: np.ndarray) -> np.ndarray:
        """The keys (float64) of query `row` for the items at `positions`."""
        return score_rows(self.packed, positions, self.queries[row], self.nbits)


def order_ties(
    scores: np.ndarray,
    positions: np.ndarray,
    k: int,
    store: CodeStore,
    keep: np.ndarray | None,
    second: SecondCode,
    max_tied: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """`views.tie_ordered_top_k` of a batch after its scan, in C with the
    GIL released: each query's best `k` of its scan's best `wide` (`scores`
    float32 and `positions`, `(nq, wide)`, `wide` of `k` or `k + 1`), the
    `k`-th's tie group completed from `store` (the items `keep` keeps, the
    `max_tied` first), equal scores by `second`'s scores (`SecondCode`),
    then by position. None where `_scan` is unbuilt."""
    if _scan is None:
        return None
    nq, wide = scores.shape
    # The codes sorted by first bytes (once per version of the store) only
    # where a query's `k`-th result's tie group goes on past its scan.
    goes_on = wide > k and bool(np.any(scores[:, k - 1] == scores[:, k]))
    order, sorted_words = store.by_first_bytes() if goes_on else (b"", b"")
    packed, rows = store.packed(), np.ascontiguousarray(second.packed, np.uint8)
    num_blocks = second.queries.shape[1] >> second.nbits
    out_scores = np.empty((nq, k), np.float32)
    out_positions = np.empty((nq, k), np.int64)
    kept = b"" if keep is None else np.ascontiguousarray(keep, np.uint8)
    _scan.order_ties(
        np.ascontiguousarray(scores, np.float32),
        np.ascontiguousarray(positions, np.int64), nq, wide, k,
        np.ascontiguousarray(packed, np.uint8), len(packed), packed.shape[1],
        order, sorted_words, kept, rows, rows.shape[1], second.nbits, num_blocks,
        max_tied, np.ascontiguousarray(second.queries, np.float32),
        out_scores, out_positions,
    )  # fmt: skip
    return out_scores, out_positions


def repeat_estimate(rows: np.ndarray) -> float:
    """The share of `rows` that are distinct, estimated from every row: the
    rows whose hash falls below a threshold are a sample of the distinct
    rows (each kept with all its copies or none), so no order of the rows
    and no mixture of rare and frequent codes misleads it.

    Example:

    >>> codes = np.random.default_rng(0).integers(0, 256, (400_000, 8), np.uint8)
    >>> round(repeat_estimate(codes), 2)   # 400,000 codes, all distinct
    1.0
    >>> round(repeat_estimate(np.repeat(codes[:1000], 400, axis=0)), 4)  # 1,000
    0.0025
    """
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    n = len(rows)
    share = min(1.0, _SAMPLED / max(n, 1))
    threshold = min(int(share * 2.0**64), 2**64 - 1)
    kept, distinct = _scan.sample_repeats(rows, n, rows.shape[1], threshold)
    return distinct / kept if kept else 1.0


def group_equal(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Items with equal codes, for the scan to score each code once.

    A trained model's codes cluster: of CIFAR-10's 60,000 pictures, a 48-bit
    model gave 18,511 distinct codes, a 64-bit one 37,541. Scanning the
    distinct ones is that much less work; an item's rank among equal codes
    is its position, as everywhere. Found with a hash table in C, in time
    linear in the items rather than a sort's (`benchmarks/cold_start.py`
    measures it and the first search after loading an index).

    Args:
        rows: one row of bytes per item (packed codes or columns).

    Returns:
        `(first, starts, members)`: the position of each distinct code's
        first item (distinct codes in order of it), and the items of
        distinct code `r`, `members[starts[r]:starts[r+1]]` in increasing
        positions; None when fewer than a tenth of the items repeat a code.
    """
    n = len(rows)
    if n < 2:
        return None
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    if n > _ESTIMATE_ABOVE and repeat_estimate(rows) > _DISTINCT_SHARE:
        return None  # codes that hardly repeat (random ones), said at once
    first = np.empty(n, np.int64)
    starts = np.empty(n + 1, np.int64)
    members = np.empty(n, np.int64)
    limit = int(0.9 * n)
    distinct = _scan.group(rows, n, rows.shape[1], limit, first, starts, members)
    if distinct < 0:
        return None
    return first[:distinct].copy(), starts[: distinct + 1].copy(), members


def checked_groups(
    packed: np.ndarray, starts: np.ndarray, members: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A file's grouping of equal codes as int64 `(starts, members)`, once
    it is found to be the one `group_equal` gives for `packed`: the scan
    indexes with it, and scores each group by its first item's code
    (`file_format.read` checks a file's grouping with it).

    Raises:
        ValueError: the reason the grouping is not that one.
    """
    n = len(packed)
    starts, members = starts.astype(np.int64), members.astype(np.int64)
    sizes = np.diff(starts)
    if starts[0] != 0 or starts[-1] != n or np.any(sizes <= 0):
        raise ValueError("the grouping of equal codes has groups out of bounds")
    if np.any(members >= n):
        raise ValueError("the grouping of equal codes names items beyond the codes")
    rising = np.diff(members) > 0
    rising[starts[1:-1] - 1] = True  # a group's first item follows another's last
    first = members[starts[:-1]]
    if not rising.all() or np.any(np.diff(first) <= 0):
        raise ValueError("the grouping of equal codes is not in increasing positions")
    # Each item's group, then its code against its group's first: in item
    # order, which reads memory in sequence (a gather by members does not).
    group_of = np.full(n, -1, np.int64)
    group_of[members] = np.repeat(np.arange(len(first)), sizes)
    if np.any(group_of < 0):
        raise ValueError("the grouping of equal codes does not hold every item once")
    width = -(-packed.shape[1] // 8)
    words = np.zeros((n, 8 * width), np.uint8)
    words[:, : packed.shape[1]] = packed
    words = words.view(np.uint64)
    if np.any(words != words[first][group_of]):
        raise ValueError("the grouping of equal codes groups different codes")
    return starts, members
