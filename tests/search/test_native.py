"""The native exact scan: equal to a NumPy brute force, on every kernel."""

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


@pytest.fixture(autouse=True)
def engine():
    """The native scan only (overrides the fixture that also runs faiss's)."""
    return "native"


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
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_blocks", [1, 3, 8, 13])
def test_matches_brute_force(rng, num_blocks, block_size):
    for n in (1, 50, native.TILE + 3):
        codes = random_codes(rng, n, num_blocks, block_size)
        index = SubicIndex(num_blocks, block_size)
        ids = index.add(codes)
        queries = adversarial_queries(rng, num_blocks, block_size)
        for k in (1, 100, n + 5):
            check(index, queries, codes, ids, k)


@needs_native
@pytest.mark.parametrize("block_size", [16, 64, 256])
def test_batch_sizes(rng, block_size):
    codes = random_codes(rng, 3000, 8, block_size)
    index = SubicIndex(8, block_size)
    ids = index.add(codes)
    queries = relu_queries(rng, 2000, 8, block_size)
    want_scores, want_ids = brute_search(queries, codes, ids, 100, block_size)
    for batch in (1, 2, 9, 100, 2000):
        scores, found = index.search(queries[:batch], 100)
        np.testing.assert_array_equal(found, want_ids[:batch])
        np.testing.assert_allclose(scores, want_scores[:batch], rtol=1e-6)


@needs_native
@pytest.mark.parametrize("block_size", [4, 16, 64, 256])
def test_portable_kernel_equals_simd(rng, block_size):
    layout = native.Layout.for_block_size(5, block_size)
    codes = random_codes(rng, 3000, 5, block_size)
    tiles = layout.tiles(layout.columns_of(codes))
    queries = adversarial_queries(rng, 5, block_size)
    fast = native.search(layout, tiles, len(codes), queries, 50, 2)
    portable = native.search(layout, tiles, len(codes), queries, 50, 1, simd=False)
    np.testing.assert_array_equal(fast[1], portable[1])
    np.testing.assert_array_equal(fast[0], portable[0])
    _want_scores, want_ids = brute_search(
        queries, codes, np.arange(3000), 50, block_size
    )
    np.testing.assert_array_equal(fast[1], want_ids)


@needs_native
def test_nibble_layout_where_there_is_no_vbmi(rng):
    """The AVX2 (or portable) 4-bit kernel, whatever this CPU prefers."""
    layout = native.Layout(6, 16, 4, 4)
    codes = random_codes(rng, 2500, 6, 16)
    tiles = layout.tiles(layout.columns_of(codes))
    queries = adversarial_queries(rng, 6, 16)
    for simd in (True, False):
        _scores, found = native.search(layout, tiles, 2500, queries, 30, 2, simd)
        _want_scores, want_ids = brute_search(queries, codes, np.arange(2500), 30, 16)
        np.testing.assert_array_equal(found, want_ids)


@needs_native
@pytest.mark.parametrize("exact", [True, False])
def test_after_remove_and_add(rng, exact):
    codes = random_codes(rng, 4000, 16, 16)
    index = SubicIndex(16, 16, exact=exact)
    index.add(codes, ids=np.arange(4000) * 3)
    queries = relu_queries(rng, 20, 16, 16)
    index.search(queries, 10)  # builds the tiled copy, which changes below
    index.remove(np.arange(0, 12000, 9))
    more = random_codes(rng, 300, 16, 16)
    index.add(more, ids=np.arange(300) + 100_000)
    check(index, queries, index.get_codes(), index.get_ids(), 100)


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
def test_off_switch_gives_the_same_results(rng, monkeypatch):
    codes = random_codes(rng, 3000, 8, 256)
    index = SubicIndex(8, 256)
    index.add(codes)
    queries = relu_queries(rng, 30, 8, 256)
    on = index.search(queries, 100)
    monkeypatch.setenv("SUBIC_NATIVE", "0")
    assert not index._engine.native
    off = index.search(queries, 100)
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
def test_kernel_names():
    assert native.kernel(1024) == "scalar"  # 16-bit sub-codes: portable C
    assert native.kernel(256) in ("avx512vbmi", "scalar")
    assert native.kernel(16) in ("avx512vbmi", "avx2", "scalar")


@needs_native
def test_rejects_inconsistent_buffers():
    layout = native.Layout.for_block_size(4, 256)
    tiles = np.zeros(native.TILE * 4 - 1, np.uint8)
    with pytest.raises(ValueError, match="tiles buffer has the wrong size"):
        native.search(layout, tiles, 10, np.zeros((1, 1024), np.float32), 5, 1)


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
    layout = native.Layout.for_block_size(4, 256)
    empty = np.zeros(0, np.uint8)
    arguments = (
        empty, n, native.TILE, layout.columns, layout.bits, layout.table,
        layout.groups, layout.num_blocks, layout.block_size, layout.per_group, k,
        np.zeros(0, np.float32), nq, np.zeros(0), np.zeros(0, np.int64), True,
    )  # fmt: skip
    if nq == 0 and n == 0:
        assert native._scan.scan(*arguments) is None
        return
    with pytest.raises(ValueError, match="sizes overflow"):
        native._scan.scan(*arguments)
