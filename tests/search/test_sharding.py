"""Tests for subic_keras.search.sharding."""

import numpy as np
import pytest
from search_reference import (
    distinct_codes,
    random_codes,
)

from subic_keras.search import ShardedSubicIndex, SubicIndex, merge_results

# Sharding ---------------------------------------------------------------


@pytest.mark.parametrize(
    "block_size, num_queries", [(16, 15), (256, 15), (64, 15), (64, 40)]
)
def test_sharded_search_equals_unsharded(rng, block_size, num_queries):
    # On every scanner (K=64 with 40 queries: faiss's byte-aligned batch scan).
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
    want = index.search_codes(codes[:4], 7)
    got = sharded.search_codes(codes[:4], 7)
    # Integer scores tie a lot; which tied items make the cut is faiss's choice.
    np.testing.assert_array_equal(got[0], want[0])
    assert len(index.shard(5)[4]) == 200
    empty = SubicIndex(6, block_size).shard(2)
    assert [len(s) for s in empty] == [0, 0]
    scores, ids = ShardedSubicIndex(empty).search(queries, 3)
    assert scores.shape == ids.shape == (len(queries), 0)
    # A k beyond the shards' total returns every item, once.
    scores, ids = sharded.search(queries[:2], 10**9)
    assert (
        ids.shape == (2, 1000)
        and (np.sort(ids, axis=1) == np.sort(index.get_ids())).all()
    )


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
    # float64 scores stay float64 (float32 ones, as SubicIndex gives, stay
    # float32): the merge loses no precision.
    assert scores.dtype == np.float64 and ids.dtype == np.int64
    scores, ids = merge_results([first, second], 6)  # 5 slots, 4 items
    np.testing.assert_array_equal(ids, [[10, 20, 21, 11, -1]])
    assert scores[0, 4] == -np.inf
    assert merge_results([first, second], 10**12)[0].shape == (1, 5)
    # An item scoring -inf (a query beyond float32) still comes before
    # every missing slot, wherever the slot stood.
    lone = (np.array([[-np.inf, -np.inf]]), np.array([[-1, 30]]))
    np.testing.assert_array_equal(
        merge_results([lone, second], 4)[1], [[20, 21, 30, -1]]
    )
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


def test_the_same_shard_twice_is_refused():
    shard = SubicIndex(2, 16)
    with pytest.raises(ValueError, match="same one at positions 0 and 2"):
        ShardedSubicIndex([shard, SubicIndex(2, 16), shard])


def test_shards_may_use_different_scanners(rng):
    codes = random_codes(rng, 900, 4, 16)
    whole = SubicIndex(4, 16, "faiss")
    whole.add(codes)
    first, second = whole.shard(2)
    mixed = SubicIndex(4, 16)  # this run's scanner
    mixed.add(second.get_codes(), ids=second.get_ids())
    queries = rng.random((6, 64)).astype(np.float32)
    found = ShardedSubicIndex([first, mixed]).search(queries, 50)
    want = whole.search(queries, 50)
    np.testing.assert_array_equal(found[1], want[1])
    np.testing.assert_allclose(found[0], want[0], rtol=1e-6)


def test_float64_shard_scores_merge_to_the_unsharded_ranking(scanner):
    # Scores 1 + 2**-30 and 1 are one float32 value: merged from float32,
    # the later shard's better item would come second.
    index = SubicIndex(2, 4)
    index.add([[0, 1], [1, 0]])  # item 1 scores 1 + 2**-30, item 0 scores 1
    query = np.array([[1.0, 1.0, 0, 0, 2.0**-30, 0, 0, 0]], np.float32)
    expected = index.search(query, 2)[1]
    shards = index.shard(2)
    scores, ids = merge_results([shard.search_shard(query, 2) for shard in shards], 2)
    assert ids.tolist() == expected.tolist() and scores.dtype == np.float64
    if scanner.startswith("native"):  # faiss's scans sum in float32 themselves
        assert expected.tolist() == [[1, 0]] and scores[0, 0] == 1 + 2.0**-30
        rounded = merge_results([shard.search(query, 2) for shard in shards], 2)
        assert rounded[1].tolist() == [[0, 1]]  # the float32 tie, in shard order
