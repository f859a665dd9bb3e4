"""Tests for subic_keras.search.engines: exactness of both scans against NumPy."""

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

from subic_keras.search import SubicIndex, engines

# Exactness --------------------------------------------------------------


@pytest.mark.parametrize(
    "num_blocks, block_size, exact",
    [
        (8, 64, None),
        (8, 256, None),
        (16, 16, True),
        (5, 16, True),  # odd M: padded 8-bit groups
        (5, 64, None),  # odd M: padded 12-bit groups
        (8, 8, None),  # 3-bit blocks in 12-bit groups
        (6, 32, None),
        (3, 1024, None),
    ],
)
def test_exact_search_matches_brute_force(rng, num_blocks, block_size, exact):
    codes = distinct_codes(rng, 3000, num_blocks, block_size)
    index = SubicIndex(
        num_blocks, block_size, exact=exact, add_chunk_size=500, search_chunk_size=7
    )
    assert index.exact
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
    monkeypatch.setattr(engines, "_BYTE_SCAN_CHUNK", 700)
    codes = distinct_codes(rng, 3000, num_blocks, block_size)
    index = SubicIndex(num_blocks, block_size, exact=True)
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
    # The engine's premise: IndexPQ with identity centroids scores exactly.
    codes = random_codes(rng, 500, 8, 64)
    index = engines.FlatEngine(8, 64, 6)
    index.add_packed(faiss.pack_bitstrings(codes.astype(np.int32), 6))
    queries = rng.random((5, 8 * 64)).astype(np.float32)
    scores, positions = index.search(queries, 500)
    ref = brute_scores(queries, codes, 64)
    np.testing.assert_allclose(
        scores, np.take_along_axis(ref, positions, 1), rtol=0, atol=1e-5
    )


# Fast scan (K = 16) -----------------------------------------------------


@pytest.mark.parametrize("num_blocks", [16, 12, 5])
def test_fast_scan_recall_and_exact_scores(rng, num_blocks):
    codes = distinct_codes(rng, 20_000, num_blocks, 16)
    fast = SubicIndex(num_blocks, 16)
    exact = SubicIndex(num_blocks, 16, exact=True)
    assert not fast.exact and exact.exact
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
    monkeypatch.setattr(engines, "_RESCORE_BUDGET", 100)
    codes = distinct_codes(rng, 2000, 6, 16)
    index = SubicIndex(6, 16, shortlist=300, search_chunk_size=4)
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
    index = SubicIndex(4, 16, shortlist=100)
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
def test_fast_scan_layout_decodes_to_the_added_codes(rng, num_blocks, n):
    codes = random_codes(rng, n, num_blocks, 16)
    index = SubicIndex(num_blocks, 16, add_chunk_size=10)
    index.add(codes[: n // 2])
    index.add(codes[n // 2 :])
    np.testing.assert_array_equal(index.get_codes(), codes)
    # Cross-check one element with faiss's own reconstruction.
    recon = index._engine.index.reconstruct(n - 1).reshape(num_blocks, 16)
    np.testing.assert_array_equal(recon.argmax(axis=1), codes[n - 1])
