"""Tests for subic_keras.search, against brute-force NumPy references."""

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading

import faiss
import numpy as np
import pytest

from subic_keras import search as search_module
from subic_keras.search import ShardedSubicIndex, SubicIndex, merge_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def brute_scores(queries, codes, block_size):
    """Reference: score[q, j] = sum_m queries[q, m*K + codes[j, m]]."""
    columns = np.arange(codes.shape[1]) * block_size + codes
    return queries.astype(np.float64)[:, columns].sum(axis=-1)


def brute_search(queries, codes, ids, k, block_size):
    scores = brute_scores(queries, codes, block_size)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def random_codes(rng, n, num_blocks, block_size):
    return rng.integers(0, block_size, (n, num_blocks))


def distinct_codes(rng, n, num_blocks, block_size):
    """Random codes without repeats, so continuous queries give no ties."""
    codes = np.unique(random_codes(rng, 2 * n, num_blocks, block_size), axis=0)
    assert len(codes) >= n
    return rng.permutation(codes)[:n]


def relu_queries(rng, nq, num_blocks, block_size):
    return np.maximum(rng.standard_normal((nq, num_blocks * block_size)), 0).astype(
        np.float32
    )


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


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
    monkeypatch.setattr(search_module, "_BYTE_SCAN_CHUNK", 700)
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
    index = search_module._FlatEngine(8, 64, 6)
    index.add_packed(faiss.pack_bitstrings(codes.astype(np.int32), 6))
    queries = rng.random((5, 8 * 64)).astype(np.float32)
    scores, positions = index.search(queries, 500)
    ref = brute_scores(queries, codes, 64)
    np.testing.assert_allclose(
        scores, np.take_along_axis(ref, positions, 1), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("nbits", range(1, 11))
def test_bit_packing_matches_faiss(rng, nbits):
    codes = rng.integers(0, 1 << nbits, (50, 7))
    packed = search_module._pack_codes(codes, nbits)
    expected = faiss.pack_bitstrings(codes.astype(np.int32), nbits)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(search_module._unpack_codes(packed, 7, nbits), codes)


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
    monkeypatch.setattr(search_module, "_RESCORE_BUDGET", 100)
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


# add ----------------------------------------------------------------------


def test_add_accepts_per_block_vectors_and_one_hot(rng):
    index = SubicIndex(3, 4, exact=True)
    z = rng.random((5, 12))
    z[0] = [1, 1, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0]  # ties: lowest index wins
    one_hot = np.eye(4)[[[3, 0, 2]]].reshape(1, 12)
    index.add(z)
    index.add(one_hot.astype(bool))
    expected = np.vstack([z.reshape(5, 3, 4).argmax(-1), [[3, 0, 2]]])
    np.testing.assert_array_equal(index.get_codes(), expected)
    np.testing.assert_array_equal(index.get_codes()[0], [0, 1, 0])


def test_default_and_explicit_ids(rng):
    index = SubicIndex(4, 16)
    np.testing.assert_array_equal(index.add(random_codes(rng, 3, 4, 16)), [0, 1, 2])
    index.add(random_codes(rng, 2, 4, 16), ids=[100, 50])
    np.testing.assert_array_equal(index.add(random_codes(rng, 2, 4, 16)), [101, 102])
    np.testing.assert_array_equal(index.get_ids(), [0, 1, 2, 100, 50, 101, 102])
    index.add(np.zeros((0, 4), dtype=np.int64))
    assert len(index) == 7


def _state(index):
    return len(index), index.get_ids(), index.get_codes()


@pytest.mark.parametrize(
    "codes, ids, message",
    [
        (np.full((2, 4), 16), None, r"\[0, 16\)"),
        (np.full((2, 4), -1), None, r"\[0, 16\)"),
        (np.zeros((2, 5), dtype=int), None, "width"),
        (np.zeros((2, 4)), None, "integer codes"),
        (np.full((2, 64), np.nan), None, "finite"),
        (np.full((2, 64), np.inf), None, "finite"),
        (np.zeros(4, dtype=int), None, "2-D"),
        (np.zeros((1, 2, 4), dtype=int), None, "2-D"),
        (np.array([["a"] * 4]), None, "real numbers"),
        (np.zeros((2, 4), dtype=int), [1], "one id per code"),
        (np.zeros((2, 4), dtype=int), [-3, 1], r">= 0.*\[-3\]"),
        (np.zeros((2, 4), dtype=int), [1.0, 2.0], "integers"),
        (np.zeros((3, 4), dtype=int), [9, 8, 9], r"repeated: \[9\]"),
        (np.zeros((2, 4), dtype=int), [5, 2], r"already in the index: \[2\]"),
    ],
)
def test_bad_add_raises_and_leaves_index_unchanged(rng, codes, ids, message):
    index = SubicIndex(4, 16)
    index.add(random_codes(rng, 3, 4, 16))
    before = _state(index)
    with pytest.raises(ValueError, match=message):
        index.add(codes, ids=ids)
    after = _state(index)
    assert before[0] == after[0]
    np.testing.assert_array_equal(before[1], after[1])
    np.testing.assert_array_equal(before[2], after[2])


def test_failed_faiss_add_is_rolled_back(rng, monkeypatch):
    index = SubicIndex(4, 64, add_chunk_size=2)
    index.add(random_codes(rng, 3, 4, 64))
    engine_add = index._engine.add_packed
    calls = []

    def flaky(packed):
        calls.append(len(packed))
        if len(calls) == 2:
            raise MemoryError("simulated")
        engine_add(packed)

    monkeypatch.setattr(index._engine, "add_packed", flaky)
    with pytest.raises(MemoryError):
        index.add(random_codes(rng, 5, 4, 64))
    assert len(index) == 3 and index._engine.ntotal == 3


def test_fast_scan_item_limit(rng, monkeypatch):
    monkeypatch.setattr(search_module, "_FAST_SCAN_MAX_ITEMS", 10)
    index = SubicIndex(4, 16)
    index.add(random_codes(rng, 6, 4, 16))
    with pytest.raises(ValueError, match="fewer than 10 items"):
        index.add(random_codes(rng, 4, 4, 16))
    assert len(index) == 6


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"block_size": 12}, ValueError, "power of two"),
        ({"block_size": 2048}, ValueError, "power of two"),
        ({"block_size": 1}, ValueError, "block_size must be >= 2"),
        ({"num_blocks": 0, "block_size": 16}, ValueError, "num_blocks must be >= 1"),
        ({"block_size": 64, "exact": False}, ValueError, "fast-scan"),
        ({"block_size": 16, "exact": "yes"}, TypeError, "exact"),
        ({"block_size": 64, "shortlist": 10}, ValueError, "shortlist"),
        ({"block_size": 16, "shortlist": 0}, ValueError, "shortlist must be >= 1"),
        ({"block_size": 16, "add_chunk_size": 0}, ValueError, "add_chunk_size"),
        ({"num_blocks": 200, "block_size": 1024}, ValueError, "too large"),
    ],
)
def test_constructor_validation(kwargs, error, message):
    kwargs = {"num_blocks": 4, **kwargs}
    with pytest.raises(error, match=message):
        SubicIndex(**kwargs)


def test_storage_sizes():
    assert SubicIndex(8, 256).code_size == 8
    assert SubicIndex(8, 256).bytes_per_item == 16
    assert SubicIndex(16, 16).code_size == 8
    assert SubicIndex(16, 16).bytes_per_item == 16
    assert SubicIndex(12, 16).bytes_per_item == 14
    assert SubicIndex(8, 64).code_size == 6
    assert SubicIndex(5, 16).code_size == 3  # 20 bits -> 3 bytes
    assert SubicIndex(5, 64, exact=True).code_size == 4  # 30 bits


# search -----------------------------------------------------------------


@pytest.mark.parametrize(
    "queries, k, error, message",
    [
        (np.zeros((2, 64)), 0, ValueError, "k must be >= 1"),
        (np.zeros((2, 64)), 2.5, TypeError, "k must be an integer"),
        (np.full((2, 64), np.nan), 3, ValueError, "finite"),
        (np.full((2, 64), -np.inf), 3, ValueError, "finite"),
        (np.full((2, 64), 1e39), 3, ValueError, "finite"),  # float32 overflow
        (np.zeros((2, 63)), 3, ValueError, "width"),
        (np.zeros(64), 3, ValueError, "2-D"),
        (np.zeros((2, 64), dtype=complex), 3, ValueError, "real numbers"),
    ],
)
@pytest.mark.parametrize("exact", [True, False])
def test_bad_search_input(rng, queries, k, error, message, exact):
    index = SubicIndex(4, 16, exact=exact)
    index.add(random_codes(rng, 10, 4, 16))
    with pytest.raises(error, match=message):
        index.search(queries, k)


@pytest.mark.parametrize("exact", [True, False])
def test_k_larger_than_index_pads_with_minus_one(rng, exact):
    index = SubicIndex(4, 16, exact=exact)
    codes = random_codes(rng, 5, 4, 16)
    index.add(codes, ids=[10, 11, 12, 13, 14])
    queries = rng.random((3, 64)).astype(np.float32)
    scores, ids = index.search(queries, 8)
    assert scores.shape == ids.shape == (3, 8)
    assert np.all(ids[:, 5:] == -1) and np.all(scores[:, 5:] == -np.inf)
    ref_scores, ref_ids = brute_search(queries, codes, np.arange(10, 15), 5, 16)
    np.testing.assert_array_equal(ids[:, :5], ref_ids)
    np.testing.assert_allclose(scores[:, :5], ref_scores, atol=1e-5)
    empty_scores, empty_ids = SubicIndex(4, 16, exact=exact).search(queries, 2)
    assert np.all(empty_ids == -1) and np.all(empty_scores == -np.inf)


@pytest.mark.parametrize("exact", [True, False])
def test_equal_scores_are_in_insertion_order(rng, exact):
    index = SubicIndex(4, 16, exact=exact)
    base = random_codes(rng, 6, 4, 16)
    # Each code is stored three times, under decreasing ids.
    index.add(np.repeat(base, 3, axis=0), ids=np.arange(18)[::-1])
    queries = rng.random((4, 64)).astype(np.float32)
    scores, ids = index.search(queries, 18)
    positions = 17 - ids
    for row_scores, row_positions in zip(scores, positions):
        for value in np.unique(row_scores):
            assert np.all(np.diff(row_positions[row_scores == value]) > 0)
    assert len(np.unique(ids)) == 18


@pytest.mark.parametrize("exact", [True, False])
def test_remove_then_search(rng, exact):
    codes = distinct_codes(rng, 400, 6, 16)
    index = SubicIndex(6, 16, exact=exact)
    index.add(codes, ids=np.arange(1000, 1400))
    assert index.remove(np.arange(1000, 1400, 3)) == 134
    kept = np.setdiff1d(np.arange(400), np.arange(0, 400, 3))
    np.testing.assert_array_equal(index.get_ids(), 1000 + kept)
    np.testing.assert_array_equal(index.get_codes(), codes[kept])
    queries = rng.random((6, 96)).astype(np.float32)
    scores, ids = index.search(queries, 20)
    ref_scores, ref_ids = brute_search(queries, codes[kept], 1000 + kept, 20, 16)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    # Removed ids can be added again; default ids continue after the largest
    # id present (1399 was removed, so 1399 is next).
    index.add(codes[:1], ids=[1000])
    np.testing.assert_array_equal(index.add(codes[:1]), [1399])


def test_remove_unknown_ids_removes_nothing(rng):
    index = SubicIndex(4, 64)
    index.add(random_codes(rng, 10, 4, 64))
    with pytest.raises(KeyError, match=r"\[10, 42\]"):
        index.remove([3, 42, 10])
    assert len(index) == 10
    with pytest.raises(KeyError, match=r"\[107\]"):
        index.get_codes([1, 107])
    assert index.remove([]) == 0
    assert index.remove(np.arange(10)) == 10
    assert len(index) == 0
    assert np.all(index.search(np.ones((1, 256)), 3)[1] == -1)


def test_get_codes_by_id(rng):
    codes = random_codes(rng, 20, 4, 256)
    index = SubicIndex(4, 256)
    index.add(codes, ids=np.arange(20)[::-1] * 7)
    np.testing.assert_array_equal(index.get_codes([0, 133, 70]), codes[[19, 0, 9]])
    with pytest.raises(KeyError, match=r"\[1\]"):
        index.get_codes([1])


@pytest.mark.parametrize("block_size, exact", [(16, False), (16, True), (64, True)])
def test_search_codes_counts_equal_blocks(rng, block_size, exact):
    codes = random_codes(rng, 300, 6, block_size)
    codes[7] = codes[3]
    index = SubicIndex(6, block_size, exact=exact)
    index.add(codes)
    scores, ids = index.search_codes(codes[:5], 10)
    assert scores.dtype == np.int32
    counts = (codes[:5, None, :] == codes[None, :, :]).sum(-1)
    np.testing.assert_array_equal(scores, -np.sort(-counts, axis=1)[:, :10])
    np.testing.assert_array_equal(np.take_along_axis(counts, ids, 1), scores)
    np.testing.assert_array_equal(ids[3, :2], [3, 7])  # ties: insertion order
    small = SubicIndex(6, block_size, exact=exact)
    small.add(codes[:2])
    scores, ids = small.search_codes(codes[:1], 4)
    np.testing.assert_array_equal(ids[0, 2:], [-1, -1])
    np.testing.assert_array_equal(scores[0, 2:], [-1, -1])


# Persistence -------------------------------------------------------------


@pytest.mark.parametrize(
    "num_blocks, block_size, kwargs",
    [(8, 256, {}), (5, 16, {"shortlist": 90}), (5, 16, {"exact": True}), (3, 64, {})],
)
def test_save_load_round_trip(rng, tmp_path, num_blocks, block_size, kwargs):
    codes = random_codes(rng, 700, num_blocks, block_size)
    index = SubicIndex(num_blocks, block_size, add_chunk_size=64, **kwargs)
    index.add(codes, ids=rng.permutation(10_000)[:700])
    index.remove(index.get_ids()[::5])
    path = tmp_path / "index.subic"
    index.save(path)
    assert path.stat().st_size == 40 + len(index) * (index.code_size + 8) + 32
    with open(path, "rb") as f:
        assert f.read(8) == b"SUBICIDX"
    loaded = SubicIndex.load(str(path), add_chunk_size=50)
    assert (loaded.exact, loaded.shortlist) == (index.exact, index.shortlist)
    np.testing.assert_array_equal(loaded.get_ids(), index.get_ids())
    np.testing.assert_array_equal(loaded.get_codes(), index.get_codes())
    queries = rng.random((5, num_blocks * block_size)).astype(np.float32)
    for a, b in zip(loaded.search(queries, 12), index.search(queries, 12)):
        np.testing.assert_array_equal(a, b)
    assert not [p for p in os.listdir(tmp_path) if p != "index.subic"]
    new_id = loaded.add(codes[:1])
    np.testing.assert_array_equal(new_id, [index.get_ids().max() + 1])


def test_save_load_empty_index(tmp_path):
    SubicIndex(4, 16).save(tmp_path / "empty")
    loaded = SubicIndex.load(tmp_path / "empty")
    assert len(loaded) == 0 and not loaded.exact


@pytest.fixture
def saved(rng, tmp_path):
    index = SubicIndex(4, 64)
    index.add(random_codes(rng, 50, 4, 64))
    path = tmp_path / "good.subic"
    index.save(path)
    return index, path, path.read_bytes()


def _rewrite(path, data):
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("cut", [0, 5, 39, 40, 200, -33, -1])
def test_truncated_file_raises_naming_path(saved, cut):
    _, path, data = saved
    _rewrite(path, data[:cut] if cut else b"")
    with pytest.raises(ValueError, match=r"good\.subic"):
        SubicIndex.load(path)


@pytest.mark.parametrize("offset", [45, 300, -40, -3])
def test_bit_flip_fails_checksum(saved, offset):
    _, path, data = saved
    data = bytearray(data)
    data[offset] ^= 0x10
    _rewrite(path, data)
    with pytest.raises(ValueError, match="checksum"):
        SubicIndex.load(path)


def test_header_problems_raise(saved, tmp_path):
    index, path, data = saved
    bad = bytearray(data)
    bad[:8] = b"NOTANIDX"
    with pytest.raises(ValueError, match="magic"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[8:12] = struct.pack("<I", 2)
    with pytest.raises(ValueError, match="version 2 is not supported"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[16:20] = struct.pack("<I", 48)
    with pytest.raises(ValueError, match="block shape"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[24:32] = struct.pack("<Q", 10**15)  # huge n: rejected before reading
    with pytest.raises(ValueError, match="truncated"):
        SubicIndex.load(_rewrite(path, bad))
    # A well-formed file (valid checksum) announcing an absurd block shape.
    header = struct.pack("<8sIIIIQII", b"SUBICIDX", 1, 10**6, 256, 1, 0, 10**6, 0)
    crafted = header + hashlib.sha256(header).digest()
    with pytest.raises(ValueError, match=r"good\.subic.*too large"):
        SubicIndex.load(_rewrite(path, crafted))
    text = tmp_path / "notes.txt"
    text.write_text("not an index at all, just some text " * 5)
    with pytest.raises(ValueError, match=r"notes\.txt"):
        SubicIndex.load(text)
    with pytest.raises(ValueError, match="trailing"):
        SubicIndex.load(_rewrite(path, data + b"\0"))
    # The in-memory index is untouched by failed loads.
    assert len(index) == 50


def test_failed_save_keeps_previous_file(saved, monkeypatch):
    index, path, data = saved
    index.add(np.zeros((1, 4), dtype=int))

    def broken(positions):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(index._engine, "packed", broken)
    with pytest.raises(OSError, match="disk full"):
        index.save(path)
    assert path.read_bytes() == data
    assert os.listdir(path.parent) == ["good.subic"]


# Concurrency ------------------------------------------------------------


@pytest.mark.parametrize("exact", [True, False])
def test_concurrent_searches_match_sequential(rng, exact):
    index = SubicIndex(8, 16, exact=exact)
    index.add(random_codes(rng, 5000, 8, 16))
    batches = [rng.random((20, 128)).astype(np.float32) for _ in range(8)]
    expected = [index.search(b, 10) for b in batches]
    results = [None] * len(batches)

    def work(i):
        for _ in range(3):
            results[i] = index.search(batches[i], 10)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_add_while_searching_is_consistent(rng):
    index = SubicIndex(8, 64)
    codes = distinct_codes(rng, 2000, 8, 64)
    index.add(codes[:1000])
    queries = rng.random((10, 512)).astype(np.float32)
    seen, errors = [], []

    def reader():
        try:
            for _ in range(20):
                seen.append(index.search(queries, 5)[1])
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    for start in range(1000, 2000, 100):
        index.add(codes[start : start + 100])
    for t in readers:
        t.join()
    assert not errors and len(index) == 2000
    assert all(((ids >= 0) & (ids < 2000)).all() for ids in seen)
    _, ref_ids = brute_search(queries, codes, np.arange(2000), 5, 64)
    np.testing.assert_array_equal(index.search(queries, 5)[1], ref_ids)


# Sharding ---------------------------------------------------------------


@pytest.mark.parametrize(
    "block_size, num_queries", [(16, 15), (256, 15), (64, 15), (64, 40)]
)
def test_sharded_search_equals_unsharded(rng, monkeypatch, block_size, num_queries):
    # K=16: fast-scan shortlists merged by IndexShards, then re-scored from the
    # shards' codes; K=256 and K=64 (15 queries): IndexPQ shards; K=64 with 40
    # queries: the byte-aligned batch scan over codes read from every shard.
    made = []
    original = faiss.IndexShards

    def spy(*args):
        made.append(original(*args))
        return made[-1]

    monkeypatch.setattr(faiss, "IndexShards", spy)
    codes = distinct_codes(rng, 1000, 6, block_size)
    index = SubicIndex(6, block_size)
    index.add(codes, ids=rng.permutation(5000)[:1000])
    shards = index.shard(3)
    assert [len(s) for s in shards] == [333, 333, 334]
    np.testing.assert_array_equal(
        np.concatenate([s.get_ids() for s in shards]), index.get_ids()
    )
    sharded = ShardedSubicIndex(shards)
    assert len(sharded) == 1000
    queries = rng.random((num_queries, 6 * block_size)).astype(np.float32)
    for k in (1, 25, 1200):
        want = index.search(queries, k)
        got = sharded.search(queries, k)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], atol=1e-6)
        manual = merge_results([s.search(queries, k) for s in shards], k)
        np.testing.assert_array_equal(manual[1], want[1])
    assert made and all(m.ntotal == 1000 and m.count() == 3 for m in made)
    want = index.search_codes(codes[:4], 7)
    got = sharded.search_codes(codes[:4], 7)
    # Integer scores tie a lot; which tied items make the cut is faiss's choice.
    np.testing.assert_array_equal(got[0], want[0])
    assert len(index.shard(5)[4]) == 200
    empty = SubicIndex(6, block_size).shard(2)
    assert [len(s) for s in empty] == [0, 0]
    scores, ids = ShardedSubicIndex(empty).search(queries, 3)
    assert (ids == -1).all() and np.isneginf(scores).all()


def test_sharded_search_sees_later_changes_to_shards(rng):
    codes = distinct_codes(rng, 600, 4, 64)
    index = SubicIndex(4, 64)
    index.add(codes[:400])
    shards = [*index.shard(2), SubicIndex(4, 64)]
    sharded = ShardedSubicIndex(shards)
    shards[2].add(codes[400:], ids=np.arange(400, 600))
    shards[0].remove(np.arange(50))
    index.add(codes[400:], ids=np.arange(400, 600))
    index.remove(np.arange(50))
    queries = rng.random((5, 4 * 64)).astype(np.float32)
    np.testing.assert_array_equal(
        sharded.search(queries, 30)[1], index.search(queries, 30)[1]
    )


def test_sharded_index_rejects_bad_shards(rng):
    a = SubicIndex(4, 16)
    a.add(random_codes(rng, 3, 4, 16))
    b = SubicIndex(4, 16)
    b.add(random_codes(rng, 3, 4, 16), ids=[2, 3, 4])
    with pytest.raises(ValueError, match=r"share ids: \[2\]"):
        ShardedSubicIndex([a, b])
    with pytest.raises(ValueError, match="shards.1. has block_size=64"):
        ShardedSubicIndex([a, SubicIndex(4, 64)])
    with pytest.raises(ValueError, match="shards.1. has exact=True"):
        ShardedSubicIndex([a, SubicIndex(4, 16, exact=True)])
    with pytest.raises(ValueError, match="at least one"):
        ShardedSubicIndex([])
    with pytest.raises(TypeError, match="SubicIndex"):
        ShardedSubicIndex([a, "b"])


def test_merge_results():
    first = (np.array([[5.0, 1.0, -np.inf]]), np.array([[10, 11, -1]]))
    second = (np.array([[5.0, 3.0]]), np.array([[20, 21]]))
    scores, ids = merge_results([first, second], 3)
    np.testing.assert_array_equal(ids, [[10, 20, 21]])  # tie: list order
    np.testing.assert_array_equal(scores, [[5.0, 5.0, 3.0]])
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    scores, ids = merge_results([first, second], 6)
    np.testing.assert_array_equal(ids, [[10, 20, 21, 11, -1, -1]])
    assert np.all(scores[0, 4:] == -np.inf)
    with pytest.raises(ValueError, match="at least one"):
        merge_results([], 3)
    with pytest.raises(ValueError, match="same 2-D shape"):
        merge_results([(np.zeros((1, 2)), np.zeros((1, 3), dtype=int))], 3)
    with pytest.raises(ValueError, match="number of queries"):
        merge_results([first, (np.zeros((2, 2)), np.zeros((2, 2), dtype=int))], 3)
    with pytest.raises(ValueError, match="NaN"):
        merge_results([(np.array([[np.nan]]), np.array([[1]]))], 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        merge_results([first], 0)


# Benchmark smoke test -----------------------------------------------------


def test_benchmark_quick_runs_and_writes_json(tmp_path):
    output = tmp_path / "results" / "speed.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    script = os.path.join(REPO, "benchmarks", "search_speed.py")
    args = ["--quick", "--num-items", "1500", "--threads", "1", "--output", output]
    completed = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "qps@1000" in completed.stdout
    report = json.loads(output.read_text())
    assert report["command"][1:3] == ["--quick", "--num-items"]
    assert report["settings"]["num_items"] == 1500
    assert {"faiss", "numpy"} <= set(report["versions"])
    assert report["machine"]["cpu_count"] == os.cpu_count()
    assert len(report["results"]) == 4 * 6 * 3
    for row in report["results"]:
        assert row["qps"] > 0
        if row["method"] == "hamming":
            assert row["recall_at_100"] is None
        else:  # ReLU queries allow rare exact ties between distinct codes
            assert row["recall_at_100"] >= 0.99
    assert {t["target"].split(":")[0] for t in report["targets"]} == {
        "64 bits, K=256",
        "64 bits, K=16",
        "48 bits, K=64",
        "48 bits, K=16",
    }
