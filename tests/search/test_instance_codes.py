"""Tests for subic_keras.search.instance_codes: an index that keeps an
instance code beside its class code, and the answer of the two."""

import hashlib
import itertools

import numpy as np
import pytest

from subic_keras.instance.copies import copy_margins
from subic_keras.search import file_format
from subic_keras.search.image_index import ImageIndex

# Class codes: 4 blocks of 4 with values in {0, 1}, so that hundreds of
# pictures share a code and most answers end inside a tie group.
N, M, K, IM, IK = 600, 4, 4, 8, 16
RULES = {"digest": "a" * 64, "copy_margin": -2.0, "copy_blocks": 7}


def _scores(queries, codes, block_size):
    offsets = np.arange(codes.shape[1]) * block_size
    return np.stack([q[codes + offsets].sum(axis=1) for q in queries])


def _index(rng, n=N):
    index = ImageIndex(M, K, "/photos", (32, 32, 3), instance=(IM, IK))
    index.instance.model = dict(RULES)
    codes = rng.integers(0, 2, (n, M))
    instance = rng.integers(0, IK, (n, IM))
    fingerprints = rng.integers(1, 2**63, size=n).astype(np.uint64)
    paths = [f"f/{i}.png" for i in range(n)]
    index.add(codes, paths, fingerprints, instance_codes=instance)
    return index, codes, instance, fingerprints


def _queries(rng, instance, copies_of=(3, None, 77)):
    """Class queries, and instance queries that point at the codes of
    `copies_of` (None: a random query, whose copies are not held)."""
    queries = rng.normal(size=(len(copies_of), M * K)).astype(np.float32)
    wanted = rng.normal(size=(len(copies_of), IM * IK)).astype(np.float32)
    for row, item in enumerate(copies_of):
        if item is not None:
            wanted[row, np.arange(IM) * IK + instance[item]] += 6.0
    return queries, wanted


def _expected(queries, wanted, codes, instance, k, keep=None):
    """The answer by its definition: copies by the instance rule first (most
    likely first), then class score, instance score, insertion order."""
    class_scores = _scores(queries, codes, K)
    instance_scores = _scores(wanted, instance, IK)
    items = np.arange(len(codes)) if keep is None else np.flatnonzero(keep)
    answers = []
    for row in range(len(queries)):
        near = items[np.lexsort((items, -instance_scores[row][items]))][:k]
        margins = copy_margins(
            wanted[row : row + 1], instance_scores[row][near][None], IK
        )
        copies = near[margins[0] >= RULES["copy_margin"] - 1e-6]
        rest = items[~np.isin(items, copies)]
        rest = rest[
            np.lexsort((rest, -instance_scores[row][rest], -class_scores[row][rest]))
        ]
        answers.append(np.concatenate([copies, rest])[:k])
    return answers


def test_the_answer_lists_copies_first_then_classes_with_ties_by_instance(rng):
    index, codes, instance, _ = _index(rng)
    queries, wanted = _queries(rng, instance)
    for k in (1, 5, 40, N + 10):
        rows = index.answer(queries, k, instance_queries=wanted)
        expected = _expected(queries, wanted, codes, instance, k)
        for row, answer, ids in zip(range(3), rows, expected):
            assert [match["id"] for match in answer] == ids.tolist(), (k, row)
            class_scores = _scores(queries[row : row + 1], codes[ids], K)[0]
            np.testing.assert_allclose([m["score"] for m in answer], class_scores, 1e-5)
        # The copies are marked, and are what the instance codes point at.
        assert rows[0][0]["id"] == 3 and rows[0][0]["copy"]
        assert rows[2][0]["id"] == 77 and rows[2][0]["copy"]
        assert not any(match["copy"] for match in rows[1])
    scores, ids = index.search(queries, 5, instance_queries=wanted)
    assert ids[:, 0].tolist()[::2] == [3, 77] and scores.dtype == np.float32
    # A filter: the exact answer among the pictures it keeps (3 is not).
    rows = index.answer(queries, 12, where="id >= 50", instance_queries=wanted)
    expected = _expected(queries, wanted, codes, instance, 12, np.arange(N) >= 50)
    assert [[m["id"] for m in row] for row in rows] == [e.tolist() for e in expected]


def test_without_instance_queries_the_class_code_answers_alone(rng):
    index, codes, instance, _ = _index(rng)
    queries, _ = _queries(rng, instance)
    rows = index.answer(queries, 10)
    reference = _scores(queries, codes, K)
    for row, answer in enumerate(rows):
        got = [match["score"] for match in answer]
        np.testing.assert_allclose(got, np.sort(reference[row])[::-1][:10], 1e-5)
        assert all("copy" not in match for match in answer)


def test_filters_exact_copies_and_removals_hold_with_both_codes(rng):
    index, codes, instance, fingerprints = _index(rng)
    queries, wanted = _queries(rng, instance)
    keep = np.arange(N) % 3 != 0  # "f/0.png", "f/3.png", ... are left out
    left_out = [f"f/{i}.png" for i in range(0, N, 3)]
    index.remove(left_out)
    rows = index.answer(queries, 8, instance_queries=wanted)
    expected = _expected(queries, wanted, codes, instance, 8, keep)
    assert [[m["id"] for m in row] for row in rows] == [e.tolist() for e in expected]
    assert rows[0][0]["id"] != 3  # removed from both codes
    # An exact copy of the query (by fingerprint) comes first, a copy by the
    # instance code after it, both marked.
    rows = index.answer(
        queries, 4, fingerprints=[fingerprints[10], 0, 0], instance_queries=wanted
    )
    assert rows[0][0]["id"] == 10 and rows[0][0]["exact"] and rows[0][0]["copy"]
    assert rows[2][0]["id"] == 77 and rows[2][0]["copy"]


def test_both_codes_round_trip_a_file_on_every_scanner(rng, tmp_path):
    index, _, instance, _ = _index(rng)
    index.model = {"digest": "0" * 64, "num_blocks": M, "block_size": K}
    queries, wanted = _queries(rng, instance)
    path = tmp_path / "both.subic"
    index.save(path)
    assert path.read_bytes()[8] == file_format.VERSION_WITH_INSTANCE
    again = ImageIndex.load(path)  # by the scanner of the run (`scanner`)
    assert again.instance.num_blocks == IM and again.instance_model == RULES
    np.testing.assert_array_equal(again.instance.codes.get_codes(), instance)
    assert again.answer(queries, 30, instance_queries=wanted) == index.answer(
        queries, 30, instance_queries=wanted
    )
    # Searched by its instance codes alone (`subic search instance`).
    alone = again.by_instance()
    _, ids = alone.search(wanted, 3)
    assert ids[0, 0] == 3 and ids[2, 0] == 77 and alone.model == RULES
    assert alone.paths(ids[0])[0] == "f/3.png" and len(alone) == N


def test_duplicates_come_from_the_instance_codes(rng):
    index, _, instance, _ = _index(rng, 50)
    paths = ["g/a.png", "g/b.png"]
    index.add([[0, 0, 0, 0]] * 2, paths, instance_codes=[instance[7]] * 2)
    groups = index.duplicates()
    assert ["f/7.png", *paths] in groups


def test_bad_instance_codes_and_queries_are_refused_naming_them(rng):
    index, _, instance, _ = _index(rng, 20)
    with pytest.raises(ValueError, match="instance_codes must be given"):
        index.add([[0, 0, 0, 0]], ["h/1.png"])
    with pytest.raises(ValueError, match="instance_codes must hold one code per path"):
        index.add([[0, 0, 0, 0]], ["h/1.png"], instance_codes=instance[:2])
    with pytest.raises(ValueError, match="instance_codes"):
        index.add([[0, 0, 0, 0]], ["h/1.png"], instance_codes=[[99] * IM])
    assert len(index) == 20 and len(index.instance.codes) == 20
    plain = ImageIndex(M, K, "/p")
    with pytest.raises(ValueError, match="keeps none"):
        plain.add([[0, 0, 0, 0]], ["h/1.png"], instance_codes=instance[:1])
    with pytest.raises(ValueError, match="this index keeps no instance codes"):
        plain.by_instance()
    queries, wanted = _queries(rng, instance, (3, None, 7))
    with pytest.raises(ValueError, match="instance_queries"):
        index.answer(queries, 3, instance_queries=wanted[:, :10])
    with pytest.raises(ValueError, match="one query per query"):
        index.answer(queries, 3, instance_queries=wanted[:2])


def _rewrite_tail(path, change):
    """`change` applied to the file's bytes before its checksum, the
    checksum made again: what a crafted file holds."""
    data = bytearray(path.read_bytes()[:-32])
    change(data)
    path.write_bytes(bytes(data) + hashlib.sha256(data).digest())


def test_crafted_instance_sections_are_refused_with_the_reason(rng, tmp_path):
    index, _, _, _ = _index(rng, 40)
    path = tmp_path / "both.subic"
    cases = [
        ("invalid instance code shape", lambda d: d.__setitem__(-1, 3)),
        (
            "overrun",
            lambda d: d.__setitem__(slice(-8, -4), (2**16).to_bytes(4, "little")),
        ),
        ("truncated|overrun", lambda d: d.__delitem__(slice(-48, -8))),
        ("instance_model must be a model record", None),
    ]
    for reason, change in cases:
        if change is None:
            index.instance.codes._model = "nope"  # what no writer writes
            index.save(path)
            index.instance.codes._model = dict(RULES)
        else:
            index.save(path)
            _rewrite_tail(path, change)
        with pytest.raises(ValueError, match=reason):
            ImageIndex.load(path)


def test_the_view_of_the_instance_codes_is_for_reading(rng):
    index, _, instance, _ = _index(rng, 30)
    alone = index.by_instance()
    with pytest.raises(ValueError, match="through the index itself"):
        alone.add(instance[:1], ["n/1.png"])
    with pytest.raises(ValueError, match="through the index itself"):
        alone.remove(["f/1.png"])
    assert len(index) == len(alone) == len(index.instance.codes) == 30
    index.remove(["f/1.png"])  # through the index: the view sees it
    assert len(alone) == 29 and "f/1.png" not in alone


def test_equal_instance_codes_in_a_large_tie_group_keep_insertion_order(rng):
    # Every picture has one class code and one instance code: the answer's
    # tie group is all of them, and equal keys leave insertion order.
    index = ImageIndex(M, K, "/photos", instance=(IM, IK))
    n = 500
    index.add(
        np.zeros((n, M), int), [f"e/{i}.png" for i in range(n)],
        instance_codes=np.ones((n, IM), int),
    )  # fmt: skip
    queries, wanted = _queries(rng, np.ones((n, IM), int), (None,))
    _, ids = index.search(queries, 7, instance_queries=wanted)
    assert ids[0].tolist() == list(range(7))
    # Every third picture's instance code is the query's: those first, in
    # insertion order.
    index = ImageIndex(M, K, "/photos", instance=(IM, IK))
    codes = np.ones((n, IM), int)
    codes[::3] = 5
    paths = [f"e/{i}.png" for i in range(n)]
    index.add(np.zeros((n, M), int), paths, instance_codes=codes)
    queries, wanted = _queries(rng, codes, (0,))
    _, ids = index.search(queries, 7, instance_queries=wanted)
    assert ids[0].tolist() == list(range(0, 21, 3))


def test_shards_parts_merge_into_the_answer_of_one_index(rng):
    """What a `RayIndex` does with its shards' parts (`shard_both`,
    `merge_parts`), without Ray: three shards of one index's items, in
    order, answer as that index does, ties and copies included."""
    from subic_keras.search.instance_codes import merge_parts

    index, _, instance, _ = _index(rng)
    queries, wanted = _queries(rng, instance, (3, None, 77, 450))
    # A picture whose instance code is 77's, in another shard: both copies.
    index.add([[0, 1, 0, 1]], ["g/twin.png"], instance_codes=[instance[77]])
    bounds = [0, 150, 400, N + 1]
    shards = []
    for lo, hi in itertools.pairwise(bounds):
        shard = ImageIndex(M, K, "/photos", instance=(IM, IK))
        shard.instance.model = dict(RULES)
        ids = np.arange(lo, hi)
        shard.add(index.get_codes(ids), index.paths(ids), ids=ids,
                  instance_codes=index.instance.codes.get_codes(ids))  # fmt: skip
        shards.append(shard)
    for k in (1, 4, 30, N + 5):
        for where in (None, "id >= 100 and path under 'f'"):
            parts = [s.shard_both(queries, wanted, k, where=where) for s in shards]
            scores, ids, copy = merge_parts(parts, k)
            rows = index.answer(queries, k, where=where, instance_queries=wanted)
            assert ids.tolist() == [[m["id"] for m in row] for row in rows], (k, where)
            assert copy.tolist() == [[m["copy"] for m in row] for row in rows]
            np.testing.assert_allclose(
                scores, [[m["score"] for m in row] for row in rows], atol=1e-5
            )
    rows = index.answer(queries, 3, instance_queries=wanted)
    assert [m["id"] for m in rows[2][:2]] == [77, N] and rows[2][1]["copy"]
