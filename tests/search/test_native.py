"""The native exact scan: equal to a NumPy brute force, on every kernel
this CPU runs (the NEON kernel under an emulator: `test_native_neon.py`)."""

import os

import numpy as np
import pytest
from search_reference import brute_search, random_codes, relu_queries

from subic_keras.search import ShardedSubicIndex, SubicIndex, native


def test_built_where_required():
    """CI sets SUBIC_REQUIRE_NATIVE=1: there, a failed build must not pass
    silently as skipped tests."""
    if os.environ.get("SUBIC_REQUIRE_NATIVE") == "1":
        assert native._scan is not None, "the native scan was not built"


needs_native = pytest.mark.skipif(
    native._scan is None, reason="the native scan was not built (no C compiler)"
)

BLOCK_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 1024)


KERNELS = native.kernels()


@pytest.fixture(autouse=True)
def scanner():
    """One run: these tests name their kernels (overrides the fixture)."""
    return None


def adversarial_queries(rng, num_blocks, block_size):
    """ReLU queries, then the cases that stress the bounds."""
    queries = relu_queries(rng, 8, num_blocks, block_size)
    queries[1] = 0.0  # every item ties: insertion order decides
    queries[2, 0] = 1e6  # one huge entry: coarse tables
    queries[3] -= 0.5  # negative entries
    queries[4] = rng.standard_normal(num_blocks * block_size) * 1e-30  # tiny
    queries[5, ::3] = -1e4
    return queries


def check(index, queries, codes, ids, k):
    scores, found = index.search(queries, k)
    want_scores, want_ids = brute_search(queries, codes, ids, k, index.block_size)
    np.testing.assert_array_equal(found, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6, atol=1e-30)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_blocks", [1, 3, 8, 13])
def test_matches_brute_force(rng, num_blocks, block_size, kernel):
    for n in (1, 50, native.TILE + 3):
        codes = random_codes(rng, n, num_blocks, block_size)
        index = SubicIndex(num_blocks, block_size, f"native-{kernel}")
        ids = index.add(codes)
        queries = adversarial_queries(rng, num_blocks, block_size)
        for k in (1, 100, n + 5):
            check(index, queries, codes, ids, k)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [16, 64, 256])
def test_batch_sizes(rng, block_size, kernel):
    codes = random_codes(rng, 3000, 8, block_size)
    index = SubicIndex(8, block_size, f"native-{kernel}")
    ids = index.add(codes)
    queries = relu_queries(rng, 2000, 8, block_size)
    want_scores, want_ids = brute_search(queries, codes, ids, 100, block_size)
    for batch in (1, 2, 9, 100, 2000):
        scores, found = index.search(queries[:batch], 100)
        np.testing.assert_array_equal(found, want_ids[:batch])
        np.testing.assert_allclose(scores, want_scores[:batch], rtol=1e-6)


def layouts(block_size):
    """Every layout of such blocks: nibbles where they fit, and bytes."""
    nbits = block_size.bit_length() - 1
    if nbits > 8:
        return [native.Layout(5, block_size, nbits, 16)]
    found = [native.Layout(5, block_size, nbits, 8)]
    if 4 % nbits == 0:
        found.append(native.Layout(5, block_size, nbits, 4))
    return found


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [2, 4, 8, 16, 32, 64, 128, 256, 512])
def test_every_kernel_and_layout_equals_portable(rng, block_size, kernel):
    codes = random_codes(rng, 3000, 5, block_size)
    queries = adversarial_queries(rng, 5, block_size)
    _want_scores, want_ids = brute_search(
        queries, codes, np.arange(3000), 50, block_size
    )
    for layout in layouts(block_size):
        tiles = layout.tiles(layout.columns_of(codes))
        fast = native.search(layout, tiles, len(codes), queries, 50, 2, kernel)
        portable = native.search(layout, tiles, len(codes), queries, 50, 1, "portable")
        np.testing.assert_array_equal(fast[1], portable[1])
        np.testing.assert_array_equal(fast[0], portable[0])
        np.testing.assert_array_equal(fast[1], want_ids)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
def test_queries_per_load_changes_no_result(rng, kernel):
    # 11 queries: the x86 nibble kernels' passes of four, two and one, each
    # forced alone by the cap (as benchmarks/shared_loads.py does).
    codes = random_codes(rng, 3000, 64, 16)
    queries = np.concatenate(
        [adversarial_queries(rng, 64, 16), relu_queries(rng, 3, 64, 16)]
    )
    layout = native.Layout.for_kernel(64, 16, kernel)
    tiles = layout.tiles(layout.columns_of(codes))
    want = native.search(layout, tiles, len(codes), queries, 50, 1, "portable")
    for per_load in (None, 1, 2, 4, 7):
        got = native.search(
            layout, tiles, len(codes), queries, 50, 1, kernel, queries_per_load=per_load
        )
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    for wrong, error in ((0, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="queries_per_load must be"):
            native.search(
                layout, tiles, 3000, queries, 50, 1, kernel, queries_per_load=wrong
            )


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [16, 64])
def test_after_remove_and_add(rng, kernel, block_size):
    codes = random_codes(rng, 4000, 16, block_size)
    index = SubicIndex(16, block_size, f"native-{kernel}")
    index.add(codes, ids=np.arange(4000) * 3)
    queries = relu_queries(rng, 20, 16, block_size)
    index.search(queries, 10)  # builds the tiled copy, which changes below
    index.remove(np.arange(0, 12000, 9))
    more = random_codes(rng, 300, 16, block_size)
    index.add(more, ids=np.arange(300) + 100_000)
    check(index, queries, index.get_codes(), index.get_ids(), 100)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("repeats", [False, True])
def test_fewer_queries_than_threads_split_the_rows(rng, kernel, repeats, monkeypatch):
    """A single query scans ranges of rows on several threads and merges
    their top k: the same answer as one scan, equal codes by position
    across ranges, with a filter and with `k` beyond a range's items."""
    monkeypatch.setattr(native, "_RANGE_BYTES", 512 * 8)  # rows of 8 bytes
    # 9 tiles of codes, or 3 of distinct codes, each about 3 times
    distinct = random_codes(rng, 3000 if repeats else 9000, 16, 16)
    codes = distinct[rng.permutation(9000) % len(distinct)]
    index = SubicIndex(16, 16, f"native-{kernel}")
    ids = index.add(codes)
    queries = adversarial_queries(rng, 16, 16)
    split, merge = [], native.best_first
    monkeypatch.setattr(native, "best_first", lambda *a: split.append(1) or merge(*a))
    monkeypatch.setattr(native.workers, "cores", lambda: 3)
    for k in (1, 100, 5000):
        for query in queries:
            check(index, query[None], codes, ids, k)
    assert len(split) == 3 * len(queries)
    keep = rng.random(len(codes)) < 0.2
    scores, found = index.search_kept(queries[:1], 50, keep)
    want_scores, want_ids = brute_search(queries[:1], codes[keep], ids[keep], 50, 16)
    np.testing.assert_array_equal(found, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6, atol=1e-30)


@needs_native
def test_sharded(rng):
    codes = random_codes(rng, 6000, 8, 64)
    index = SubicIndex(8, 64)
    ids = index.add(codes)
    sharded = ShardedSubicIndex(index.shard(3))
    queries = adversarial_queries(rng, 8, 64)
    for k in (1, 100, 7000):
        _scores, found = sharded.search(queries, k)
        _want_scores, want_ids = brute_search(queries, codes, ids, k, 64)
        np.testing.assert_array_equal(found, want_ids)


@needs_native
def test_faiss_gives_the_same_results(rng):
    codes = random_codes(rng, 3000, 8, 256)
    native_index, faiss_index = SubicIndex(8, 256), SubicIndex(8, 256, "faiss")
    assert native_index.scanner == f"native-{KERNELS[0]}"
    native_index.add(codes)
    faiss_index.add(codes)
    queries = relu_queries(rng, 30, 8, 256)
    on, off = native_index.search(queries, 100), faiss_index.search(queries, 100)
    np.testing.assert_array_equal(on[1], off[1])
    np.testing.assert_allclose(on[0], off[0], rtol=1e-6)


@needs_native
def test_nan_queries_are_rejected(rng):
    index = SubicIndex(4, 64)
    index.add(random_codes(rng, 10, 4, 64))
    queries = relu_queries(rng, 2, 4, 64)
    queries[1, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        index.search(queries, 5)


@needs_native
def test_kernels_follow_the_cpu():
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            flags = {
                f for line in cpuinfo if line.startswith("flags") for f in line.split()
            }
    assert KERNELS[-1] == "portable"
    if flags:  # x86 Linux
        assert ("avx2" in KERNELS) == ("avx2" in flags)
        assert ("vbmi" in KERNELS) == ({"avx512bw", "avx512vbmi"} <= flags)
        assert "neon" not in KERNELS


@needs_native
def test_a_kernel_this_cpu_lacks_is_a_clear_error():
    missing = [k for k in ("vbmi", "avx2", "neon") if k not in KERNELS]
    with pytest.raises(
        ValueError, match=f"can run: auto, .*native-portable.*'native-{missing[0]}'"
    ):
        SubicIndex(4, 64, f"native-{missing[0]}")
    layout = native.Layout.for_kernel(4, 64, "portable")
    tiles = np.zeros(native.TILE * 4, np.uint8)
    with pytest.raises(ValueError, match="this CPU cannot run that kernel"):
        native.search(
            layout, tiles, 10, np.zeros((1, 256), np.float32), 5, 1, missing[0]
        )


@needs_native
def test_rejects_inconsistent_buffers():
    layout = native.Layout.for_kernel(4, 256, "portable")
    tiles = np.zeros(native.TILE * 4 - 1, np.uint8)
    with pytest.raises(ValueError, match="tiles buffer has the wrong size"):
        native.search(
            layout, tiles, 10, np.zeros((1, 1024), np.float32), 5, 1, "portable"
        )


@needs_native
@pytest.mark.parametrize(
    "n, nq, k",
    [
        (2**62, 1, 1),  # tiles: n·columns wraps to 0 bytes
        (2**63 - 1, 1, 1),  # n + tile overflows
        (0, 2**61, 1),  # queries: nq·M·K·4 wraps
        (0, 1, 2**61),  # outputs: nq·k·8 wraps
        (0, 0, 2**62),  # no query: nothing to scan, whatever k
    ],
)
def test_the_binding_checks_its_sizes_against_overflow(n, nq, k):
    layout = native.Layout.for_kernel(4, 256, "portable")
    empty = np.zeros(0, np.uint8)
    arguments = (
        empty, n, native.TILE, layout.columns, layout.bits, layout.table,
        layout.groups, layout.num_blocks, layout.block_size, layout.per_group, k,
        np.zeros(0, np.float32), nq, np.zeros(0), np.zeros(0, np.int64), 0, 0,
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8),
        np.zeros(0, np.uint8),
    )  # fmt: skip
    if nq == 0 and n == 0:
        assert native._scan.scan(*arguments) is None
        return
    with pytest.raises(ValueError, match="sizes overflow"):
        native._scan.scan(*arguments)


@needs_native
def test_the_binding_refuses_more_sub_codes_than_its_sums_hold():
    layout = native.Layout(5000, 256, 8, 8)  # 5,000 sub-codes
    with pytest.raises(ValueError, match="more than 4096 sub-codes"):
        native.search(
            layout,
            np.zeros(native.TILE * 5000, np.uint8),
            1,
            np.zeros((1, 5000 * 256), np.float32),
            1,
            1,
            "portable",
        )


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [4, 16, 64, 256])
def test_equal_codes_are_scanned_once(rng, kernel, block_size):
    """Clustered codes (as a trained model's are) are scanned once per
    distinct code; ties keep insertion order, through removals and adds."""
    distinct = random_codes(rng, 40, 6, block_size)
    codes = distinct[rng.integers(0, 40, 3000)]  # every code about 75 times
    index = SubicIndex(6, block_size, f"native-{kernel}")
    index.add(codes, ids=rng.permutation(10_000)[:3000])
    queries = adversarial_queries(rng, 6, block_size)
    for k in (1, 100, 2999, 3000):
        check(index, queries, codes, index.get_ids(), k)
    index.remove(index.get_ids()[::7])
    index.add(distinct[:5], ids=[20_000 + i for i in range(5)])
    check(index, queries, index.get_codes(), index.get_ids(), 500)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
def test_large_groups_enter_the_heap_at_once(rng, kernel):
    """Groups of hundreds of equal codes fill the heap of the k best many
    members at once; small integer queries make distinct codes tie, so
    members of different groups interleave by position at the k-th place."""
    distinct = random_codes(rng, 60, 4, 16)
    sizes = np.minimum(rng.geometric(0.01, 60), 600)  # from 1 to 600 members
    codes = np.repeat(distinct, sizes, axis=0)[rng.permutation(sizes.sum())]
    index = SubicIndex(4, 16, f"native-{kernel}")
    ids = index.add(codes)
    queries = rng.integers(0, 3, (12, 64)).astype(np.float32)
    queries[:4] = relu_queries(rng, 4, 4, 16)
    for k in (1, 7, 64, 100, 250, 1000, len(codes)):
        check(index, queries, codes, ids, k)


def test_tiles_start_on_a_cache_line(rng):
    """NumPy's arrays start 16, 32 or 48 bytes into a cache line as often as
    not; the kernels' 32- and 64-byte loads would straddle two (measured:
    VBMI 1.24x slower over 1M codes, and its speed varied from run to run)."""
    layout = native.Layout(8, 256, 8, 8)
    for n in (0, 1, 5, 60_000, 300 * native.TILE + 5) * 3:
        columns = rng.integers(0, 256, (n, 8)).astype(np.uint8)
        tiles = layout.tiles(columns)
        assert tiles.size == -(-n // native.TILE) * native.TILE * 8
        if n:
            assert tiles.ctypes.data % 64 == 0
            first = tiles[: 8 * native.TILE].reshape(8, native.TILE)
            np.testing.assert_array_equal(first[:, : min(n, 5)].T, columns[:5])


@needs_native
def test_group_equal():
    rows = np.array([[3, 1], [0, 0], [3, 1], [3, 1], [0, 0], [7, 7]] * 10, np.uint8)
    first, starts, members = native.group_equal(rows)
    np.testing.assert_array_equal(first, [0, 1, 5])
    np.testing.assert_array_equal(starts, [0, 30, 50, 60])
    np.testing.assert_array_equal(members[:4], [0, 2, 3, 6])
    np.testing.assert_array_equal(np.sort(members), np.arange(60))
    wide = np.repeat(np.arange(12, dtype=np.uint8)[None], 5, axis=0)  # > 8 bytes
    assert native.group_equal(wide)[1].tolist() == [0, 5]
    assert native.group_equal(np.eye(20, dtype=np.uint8)) is None  # all distinct


@needs_native
@pytest.mark.parametrize("width", [1, 3, 6, 8, 9, 16])
def test_group_equal_matches_a_sort(rng, width):
    # Rows of few values repeat; past 8 bytes the hash table compares bytes.
    rows = rng.integers(0, 2, (5000, width)).astype(np.uint8)
    rows[:, 4:] = 0  # at most 16 distinct rows, whatever the width
    first, starts, members = native.group_equal(rows)
    keys = rows.view(np.dtype((np.void, width))).ravel()
    _, expected_first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(first, np.sort(expected_first))
    for r, start in enumerate(first):
        items = members[starts[r] : starts[r + 1]]
        assert items[0] == start and np.all(np.diff(items) > 0)
        assert (rows[items] == rows[start]).all()
    np.testing.assert_array_equal(np.sort(members), np.arange(5000))
    # Codes that hardly repeat are told from every code's hash, at once.
    assert native.group_equal(rng.integers(0, 256, (300_000, 8), np.uint8)) is None


@needs_native
def test_whether_codes_repeat_is_told_from_every_code(rng):
    """Neither the codes' order nor a mixture of single and repeated codes
    misleads the estimate: 200,000 codes each five times, laid out so that
    an evenly spaced sample meets each once; a tenth of 300,000 items in
    pairs, the rest single."""
    codes = rng.integers(0, 256, (200_000, 6), np.uint8)
    rows = np.repeat(codes, 5, axis=0)  # a code's five items side by side
    assert len(np.unique(rows[:: len(rows) // 65536], axis=0)) > 0.99 * 65536
    assert abs(native.repeat_estimate(rows) - 0.2) < 0.01
    first, starts, _ = native.group_equal(rows)
    assert len(first) == 200_000 and set(np.diff(starts)) == {5}
    single = rng.integers(0, 2**47, 240_000)
    pairs = rng.integers(2**47, 2**48, 30_000)
    mixed = rng.permutation(np.concatenate([single, pairs, pairs]))
    rows = mixed.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :6]
    assert 0.85 < native.repeat_estimate(rows) < 0.95
    assert native.group_equal(rows) is not None  # 0.9 distinct: grouped


@needs_native
def test_the_binding_checks_the_groups():
    layout = native.Layout.for_kernel(2, 16, "portable")
    tiles = np.zeros(native.TILE, np.uint8)
    queries = np.zeros((1, 32), np.float32)
    for starts, members, message in [
        ([0, 2], [0, 1, 2], "from 0 to every member"),
        ([1, 2], [0, 1], "from 0"),
    ]:
        groups = (np.array(starts, np.int64), np.array(members, np.int64))
        with pytest.raises(ValueError, match=message):
            native.search(
                layout, tiles, len(starts) - 1, queries, 1, 1, "portable", groups
            )
    bad = (np.array([0, 2, 1, 3], np.int64), np.array([0, 1, 2], np.int64))
    with pytest.raises(ValueError, match="must not decrease"):
        native.search(layout, tiles, 3, queries, 1, 1, "portable", bad)
    with pytest.raises(ValueError, match="n \\+ 1 int64"):
        native.search(layout, tiles, 2, queries, 1, 1, "portable", bad)


@pytest.mark.parametrize("count", [5, 1000])  # a block at a time, a byte at a time
@pytest.mark.parametrize("block_size", [2, 4, 16, 64, 256, 1024])
def test_score_rows_equals_a_gather_of_the_codes(rng, block_size, count, monkeypatch):
    from subic_keras.search import packing

    num_blocks = 7
    nbits = block_size.bit_length() - 1
    codes = rng.integers(0, block_size, (300, num_blocks))
    packed = packing.pack(codes, nbits)
    table = rng.normal(size=num_blocks * block_size).astype(np.float32)
    positions = rng.integers(0, 300, count)
    offsets = np.arange(num_blocks) * block_size
    expected = table.astype(np.float64)[codes[positions] + offsets].sum(1)
    got = native.score_rows(packed, positions, table, nbits)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert native.score_rows(packed, positions[:0], table, nbits).shape == (0,)
    if native.kernels():  # the binding refuses what would read out of bounds
        with pytest.raises(ValueError, match="positions out of range"):
            native.score_rows(packed, np.array([300]), table, nbits)
        with pytest.raises(ValueError, match="table must hold"):
            native.score_rows(packed, positions, table[:-1], nbits)
    monkeypatch.setattr(native, "_scan", None)  # NumPy, where C is not built
    got = native.score_rows(packed, positions, table, nbits)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
