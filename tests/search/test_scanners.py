"""Tests for subic_keras.search.scanners: every scanner against NumPy, and
the choice of scanner (the conftest runs each test on every scanner)."""

import faiss
import numpy as np
import pytest
from search_reference import (
    brute_scores,
    brute_search,
    distinct_codes,
    random_codes,
    relu_queries,
)

from subic_keras.search import SubicIndex, faiss_scanners, scanners, store

# Exactness --------------------------------------------------------------


@pytest.mark.parametrize(
    "num_blocks, block_size",
    [
        (8, 64),
        (8, 256),
        (16, 16),
        (5, 16),  # odd M: padded 8-bit groups
        (5, 64),  # odd M: padded 12-bit groups
        (8, 8),  # 3-bit blocks in 12-bit groups
        (6, 32),
        (3, 1024),
    ],
)
def test_search_matches_brute_force(rng, num_blocks, block_size, scanner):
    codes = distinct_codes(rng, 3000, num_blocks, block_size)
    index = SubicIndex(num_blocks, block_size, add_chunk_size=500, search_chunk_size=7)
    index.add(codes)
    queries = rng.random((20, num_blocks * block_size)).astype(np.float32)
    scores, ids = index.search(queries, 10)
    ref_scores, ref_ids = brute_search(queries, codes, np.arange(3000), 10, block_size)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("num_blocks, block_size", [(8, 64), (5, 64), (7, 8), (3, 128)])
def test_byte_scan_of_batches_matches_brute_force(
    rng, monkeypatch, num_blocks, block_size
):
    # Batches of >= 32 queries scan codes unpacked to bytes, chunk by chunk;
    # the last chunk here holds fewer items than k.
    monkeypatch.setattr(faiss_scanners, "_CHUNK", 700)
    codes = distinct_codes(rng, 3000, num_blocks, block_size)
    index = SubicIndex(num_blocks, block_size, "faiss")
    index.add(codes)
    queries = rng.random((40, num_blocks * block_size)).astype(np.float32)
    all_scores = brute_scores(queries, codes, block_size)
    for k in (10, 250):
        scores, ids = index.search(queries, k)
        ref_scores, ref_ids = brute_search(
            queries, codes, np.arange(3000), k, block_size
        )
        np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-5)
        # Deep in the list float32 sums may swap near-ties: check the ids
        # through their own scores, and exactly at the top.
        np.testing.assert_allclose(
            np.take_along_axis(all_scores, ids, 1), scores, rtol=0, atol=1e-5
        )
        np.testing.assert_array_equal(ids[:, :10], ref_ids[:, :10])
        # Same ranking as the bit-by-bit scan used for small batches.
        np.testing.assert_array_equal(
            index.search(queries[:5], 10)[1], ref_ids[:5, :10]
        )


def test_identity_pq_on_faiss_packing_is_exact(rng):
    # The faiss scanner's premise: IndexPQ with identity centroids scores
    # exactly, on faiss's own bit packing.
    codes = random_codes(rng, 500, 8, 64)
    codes_store = store.CodeStore(8, 64)
    codes_store.append(faiss.pack_bitstrings(codes.astype(np.int32), 6), np.arange(500))
    queries = rng.random((5, 8 * 64)).astype(np.float32)
    scores, positions = faiss_scanners.FaissScanner(8, 64).search(
        codes_store, queries, 500
    )
    ref = brute_scores(queries, codes, 64)
    np.testing.assert_allclose(
        scores, np.take_along_axis(ref, positions, 1), rtol=0, atol=1e-5
    )


# Fast scan (K = 16) -----------------------------------------------------


@pytest.mark.parametrize("num_blocks", [16, 12, 5])
def test_fast_scan_recall_and_exact_scores(rng, num_blocks):
    codes = distinct_codes(rng, 20_000, num_blocks, 16)
    fast = SubicIndex(num_blocks, 16, "faiss-fastscan")
    exact = SubicIndex(num_blocks, 16, "faiss")
    fast.add(codes)
    exact.add(codes)
    queries = relu_queries(rng, 200, num_blocks, 16)
    for k in (10, 100):
        scores, ids = fast.search(queries, k)
        exact_scores, _ = exact.search(queries, k)
        # Returned scores are exact scores of the returned codes, best first.
        ref = np.take_along_axis(brute_scores(queries, codes, 16), ids, axis=1)
        np.testing.assert_allclose(scores, ref, rtol=0, atol=1e-5)
        assert np.all(np.diff(scores, axis=1) <= 0)
        # Recall@k; ReLU queries (many zeros) tie distinct codes, so an item
        # scoring as high as the exact k-th is a correct answer too.
        recall = np.mean(ref >= exact_scores[:, -1:] - 1e-5)
        assert recall >= 0.999


def test_fast_scan_rescoring_in_small_steps(rng, monkeypatch):
    monkeypatch.setattr(faiss_scanners, "_RESCORE_BUDGET", 100)
    codes = distinct_codes(rng, 2000, 6, 16)
    index = SubicIndex(6, 16, "faiss-fastscan", shortlist=300, search_chunk_size=4)
    index.add(codes)
    queries = rng.random((9, 6 * 16)).astype(np.float32)
    scores, ids = index.search(queries, 10)
    ref_scores, ref_ids = brute_search(queries, codes, np.arange(2000), 10, 16)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


def test_fast_scan_sparse_queries_fall_back_to_exact_scan(rng):
    # faiss's fast scan drops items at the lowest quantised score; rows with
    # too few candidates are answered by an exact scan instead.
    codes = distinct_codes(rng, 300, 4, 16)
    index = SubicIndex(4, 16, "faiss-fastscan", shortlist=100)
    index.add(codes)
    queries = np.zeros((3, 64), dtype=np.float32)
    queries[1, 3] = 1.0  # only items with code 3 in block 0 score above 0
    queries[2, :16] = rng.random(16)
    scores, ids = index.search(queries, 50)
    ref_scores, ref_ids = brute_search(queries, codes, np.arange(300), 50, 16)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-6)
    np.testing.assert_array_equal(ids[:2], ref_ids[:2])  # ties: insertion order
    np.testing.assert_array_equal(ids[0], np.arange(50))


@pytest.mark.parametrize("num_blocks, n", [(5, 77), (16, 64), (3, 1)])
def test_codes_round_trip_through_every_scanner(rng, num_blocks, n):
    codes = random_codes(rng, n, num_blocks, 16)
    index = SubicIndex(num_blocks, 16, add_chunk_size=10)
    index.add(codes[: n // 2])
    index.search(np.ones((1, num_blocks * 16)), 1)  # lays the first half out
    index.add(codes[n // 2 :])
    np.testing.assert_array_equal(index.get_codes(), codes)
    _, ids = index.search(np.eye(num_blocks * 16)[[3]], n)
    want = np.argsort(codes[:, 0] != 3, kind="stable")
    np.testing.assert_array_equal(ids[0], want)


# Choosing a scanner -----------------------------------------------------


@pytest.fixture
def unforced(monkeypatch):
    """`scanners.resolve` as users get it (the conftest forces "auto")."""
    monkeypatch.undo()


def test_auto_prefers_the_native_scan(unforced):
    native = [n for n in scanners.available(8, 16) if n.startswith("native-")]
    assert not native or native[-1] == "native-portable"
    want = native[0] if native else "faiss-fastscan"
    assert SubicIndex(8, 16).scanner == want
    assert SubicIndex(8, 64).scanner == (native[0] if native else "faiss")


def test_auto_without_the_native_scan(unforced, monkeypatch):
    monkeypatch.setattr(scanners.native, "kernels", lambda: ())
    assert SubicIndex(8, 16).scanner == "faiss-fastscan"
    assert SubicIndex(8, 64).scanner == "faiss"
    with pytest.raises(ValueError, match="can run: auto, faiss, faiss-fastscan"):
        SubicIndex(8, 16, "native-portable")


def test_without_faiss_the_native_scan_searches(unforced, monkeypatch, rng):
    monkeypatch.setattr(scanners, "_faiss", lambda: None)
    if not scanners.native.kernels():
        pytest.skip("the native scan was not built")
    assert "faiss" not in scanners.available(8, 16)
    index = SubicIndex(8, 16)
    codes = random_codes(rng, 300, 8, 16)
    index.add(codes)
    queries = relu_queries(rng, 3, 8, 16)
    _, ids = index.search(queries, 5)
    np.testing.assert_array_equal(
        ids, brute_search(queries, codes, np.arange(300), 5, 16)[1]
    )
    with pytest.raises(ValueError, match="'faiss'"):
        SubicIndex(8, 16, "faiss")


# Filters inside the scan ------------------------------------------------


def _clustered_codes(rng, n, num_blocks, block_size):
    """Codes drawn from few distinct ones (a trained model's ties and the
    native scan's groups of equal codes), in random order."""
    distinct = random_codes(rng, max(2, n // 20), num_blocks, block_size)
    return distinct[rng.integers(0, len(distinct), n)]


@pytest.mark.parametrize(
    "num_blocks, block_size, clustered",
    [(8, 16, True), (8, 64, True), (8, 64, False), (5, 256, True), (3, 1024, False)],
)
@pytest.mark.parametrize("share", [1.0, 0.5, 0.1, 0.003, 0.0])
def test_filtered_search_is_the_exact_top_k_of_the_kept_items(
    rng, scanner, num_blocks, block_size, clustered, share
):
    n = 5000
    draw = _clustered_codes if clustered else random_codes
    codes = draw(rng, n, num_blocks, block_size)
    ids = rng.permutation(n * 3)[:n]  # ids are not positions
    index = SubicIndex(num_blocks, block_size)
    index.add(codes, ids=ids)
    kept = rng.random(n) < share
    # Queries of few levels: many exact ties among the kept items too.
    queries = rng.integers(0, 4, (12, num_blocks * block_size)).astype(np.float32)
    for k in (1, 10, 300):
        scores, found = index.search(queries, k, where=ids[kept])
        width = min(k, int(kept.sum()))
        assert found.shape == scores.shape == (12, width)
        all_scores = brute_scores(queries, codes[kept], block_size)
        order = np.argsort(-all_scores, axis=1, kind="stable")[:, :width]
        ref_scores = np.take_along_axis(all_scores, order, axis=1)
        np.testing.assert_array_equal(scores, ref_scores)  # exact, in float32
        if scanner.startswith("native") or width == kept.sum():
            # Ties in insertion order; faiss may keep other equals at the cut.
            np.testing.assert_array_equal(found, ids[kept][order])
        else:
            assert np.isin(found, ids[kept]).all()
            position = {item: p for p, item in enumerate(ids)}
            for row in range(12):
                got = np.array([position[item] for item in found[row]])
                exact = brute_scores(queries[row : row + 1], codes[got], block_size)
                np.testing.assert_array_equal(exact[0], scores[row])


def test_filters_gather_and_bitmap_paths_agree(rng, scanner):
    # A filter below `GATHER_BELOW` scans gathered tiles, above it the bitmap.
    from subic_keras.search import native_scanner

    codes = _clustered_codes(rng, 6000, 8, 64)
    index = SubicIndex(8, 64)
    index.add(codes)
    queries = relu_queries(rng, 9, 8, 64)
    where = "id < 1200 or id >= 5900"  # 21 %
    results = []
    for share in (0.0, 1.0):
        native_scanner.GATHER_BELOW = native_scanner.GATHER_PER_QUERY = share
        try:
            results.append(index.search(queries, 50, where=where))
        finally:
            native_scanner.GATHER_BELOW, native_scanner.GATHER_PER_QUERY = 0.25, 1 / 64
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0], results[1][0])
