"""Tests for subic_keras.search.subic_index.SubicIndex."""

import subprocess
import sys
import threading

import numpy as np
import pytest
from limits import with_memory_limit
from search_reference import (
    brute_search,
    distinct_codes,
    random_codes,
)

from subic_keras.search import SubicIndex, faiss_scanners, store

# add ----------------------------------------------------------------------


def test_add_accepts_per_block_vectors_and_one_hot(rng):
    index = SubicIndex(3, 4)
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


def test_failed_add_is_rolled_back(rng, monkeypatch):
    index = SubicIndex(4, 64, add_chunk_size=2)
    codes = random_codes(rng, 3, 4, 64)
    index.add(codes)
    queries = rng.random((2, 4 * 64)).astype(np.float32)
    before = index.search(queries, 3)  # the scanner's layout is built
    append = store.CodeStore.append
    calls = []

    def flaky(self, packed, ids):
        calls.append(len(packed))
        if len(calls) == 2:
            raise MemoryError("simulated")
        append(self, packed, ids)

    monkeypatch.setattr(store.CodeStore, "append", flaky)
    with pytest.raises(MemoryError):
        index.add(random_codes(rng, 5, 4, 64))
    assert len(index) == 3
    np.testing.assert_array_equal(index.get_codes(), codes)
    after = index.search(queries, 10)
    np.testing.assert_array_equal(before[1], after[1])


def test_fast_scan_item_limit(rng, monkeypatch):
    monkeypatch.setattr(faiss_scanners, "FAST_SCAN_MAX_ITEMS", 10)
    index = SubicIndex(4, 16, "faiss-fastscan")
    index.add(random_codes(rng, 6, 4, 16))
    index.search(np.ones((1, 64)), 1)
    index.add(random_codes(rng, 4, 4, 16))
    with pytest.raises(ValueError, match="fewer than 10 items"):
        index.search(np.ones((1, 64)), 1)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"block_size": 12}, ValueError, "power of two"),
        ({"block_size": 2048}, ValueError, "power of two"),
        ({"block_size": 1}, ValueError, "block_size must be >= 2"),
        ({"num_blocks": 0, "block_size": 16}, ValueError, "num_blocks must be >= 1"),
        ({"block_size": 64, "scanner": "faiss-fastscan"}, ValueError, "block_size 16"),
        ({"block_size": 16, "scanner": "fast"}, ValueError, "one of auto, native"),
        ({"block_size": 16, "scanner": True}, TypeError, "scanner must be a string"),
        ({"block_size": 64, "shortlist": 10}, ValueError, "shortlist"),
        ({"block_size": 16, "shortlist": 0}, ValueError, "shortlist must be >= 1"),
        ({"block_size": 16, "add_chunk_size": 0}, ValueError, "add_chunk_size"),
        (
            {"num_blocks": 200, "block_size": 1024, "scanner": "faiss"},
            ValueError,
            "too large",
        ),
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
    assert SubicIndex(5, 64).code_size == 4  # 30 bits


# search -----------------------------------------------------------------


@pytest.mark.parametrize(
    "queries, k, error, message",
    [
        (np.zeros((2, 64)), 0, ValueError, "k must be >= 1"),
        (np.zeros((2, 64)), 2.5, TypeError, "k must be an integer"),
        (np.full((2, 64), np.nan), 3, ValueError, "finite"),
        (np.full((2, 64), -np.inf), 3, ValueError, "finite"),
        (np.full((2, 64), 1e39), 3, ValueError, "float32's range"),  # too large
        (np.zeros((2, 63)), 3, ValueError, "width"),
        (np.zeros(64), 3, ValueError, "2-D"),
        (np.zeros((2, 64), dtype=complex), 3, ValueError, "real numbers"),
    ],
)
def test_bad_search_input(rng, queries, k, error, message):
    index = SubicIndex(4, 16)
    index.add(random_codes(rng, 10, 4, 16))
    with pytest.raises(error, match=message):
        index.search(queries, k)


def test_k_larger_than_index_returns_every_item(rng):
    index = SubicIndex(4, 16)
    codes = random_codes(rng, 5, 4, 16)
    index.add(codes, ids=[10, 11, 12, 13, 14])
    queries = rng.random((3, 64)).astype(np.float32)
    ref_scores, ref_ids = brute_search(queries, codes, np.arange(10, 15), 5, 16)
    for k in (5, 8, 10**12):  # no padding is allocated, whatever k is
        scores, ids = index.search(queries, k)
        assert scores.shape == ids.shape == (3, 5)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
        code_scores, code_ids = index.search_codes(codes[:2], k)
        assert code_scores.shape == code_ids.shape == (2, 5)
        assert code_scores.dtype == np.int32 and (code_scores[:, 0] == 4).all()
    empty_scores, empty_ids = SubicIndex(4, 16).search(queries, 2)
    assert empty_scores.shape == empty_ids.shape == (3, 0)
    assert empty_scores.dtype == np.float32 and empty_ids.dtype == np.int64


def test_equal_scores_are_in_insertion_order(rng):
    index = SubicIndex(4, 16)
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


def test_remove_then_search(rng):
    codes = distinct_codes(rng, 400, 6, 16)
    index = SubicIndex(6, 16)
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
    assert index.search(np.ones((1, 256)), 3)[1].shape == (1, 0)


def test_get_codes_by_id(rng):
    codes = random_codes(rng, 20, 4, 256)
    index = SubicIndex(4, 256)
    index.add(codes, ids=np.arange(20)[::-1] * 7)
    np.testing.assert_array_equal(index.get_codes([0, 133, 70]), codes[[19, 0, 9]])
    with pytest.raises(KeyError, match=r"\[1\]"):
        index.get_codes([1])


@pytest.mark.parametrize("block_size", [16, 64])
def test_search_codes_counts_equal_blocks(rng, block_size):
    codes = random_codes(rng, 300, 6, block_size)
    codes[7] = codes[3]
    index = SubicIndex(6, block_size)
    index.add(codes)
    scores, ids = index.search_codes(codes[:5], 10)
    assert scores.dtype == np.int32
    counts = (codes[:5, None, :] == codes[None, :, :]).sum(-1)
    np.testing.assert_array_equal(scores, -np.sort(-counts, axis=1)[:, :10])
    np.testing.assert_array_equal(np.take_along_axis(counts, ids, 1), scores)
    np.testing.assert_array_equal(ids[3, :2], [3, 7])  # ties: insertion order
    small = SubicIndex(6, block_size)
    small.add(codes[:2])
    scores, ids = small.search_codes(codes[:1], 4)  # k beyond the index: both
    np.testing.assert_array_equal(ids, [[0, 1]])
    assert scores[0, 0] == 6


# Concurrency ------------------------------------------------------------


def test_concurrent_searches_match_sequential(rng):
    index = SubicIndex(8, 16)
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


_HUGE_K_SCRIPT = """
import numpy as np
from subic_keras.search import ShardedSubicIndex, SubicIndex, merge_results

rng = np.random.default_rng(0)
index = SubicIndex(8, 64)
index.add(rng.integers(0, 64, size=(5000, 8)))
queries = rng.random((200, 512), dtype=np.float32)
scores, ids = index.search(queries, 10**12)
assert scores.shape == (200, 5000), scores.shape
codes = index.search_codes(index.get_codes()[:200], 10**12)
sharded = ShardedSubicIndex(index.shard(3)).search(queries, 10**12)
merged = merge_results([index.search(queries, 10)] * 2, 10**12)
print(codes[0].shape, sharded[0].shape, merged[0].shape)
"""


def test_huge_k_fits_in_4_gb():
    """200 queries with k = 10**12 would need 2.4 PB if padded to k."""

    done = subprocess.run(
        with_memory_limit([sys.executable, "-c", _HUGE_K_SCRIPT], 4 * 2**30),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "(200, 5000) (200, 5000) (200, 20)"
