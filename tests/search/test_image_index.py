"""Tests for subic_keras.search.image_index: codes with paths, in one file."""

import hashlib
import json

import numpy as np
import pytest
from search_reference import random_codes

from subic_keras.search import SubicIndex, file_format, packing
from subic_keras.search.image_index import FORMAT, ImageIndex
from subic_keras.search.uri import open as load_index


def _paths(n, prefix="p"):
    return [f"{prefix}/{i // 10}/img_{i}.png" for i in range(n)]


def _brute_force(queries, codes, block_size):
    offsets = np.arange(codes.shape[1]) * block_size
    return np.stack([q[codes + offsets].sum(axis=1) for q in queries])


@pytest.fixture
def filled(rng):
    index = ImageIndex(4, 16, "/photos", (32, 32, 3))
    codes = random_codes(rng, 300, 4, 16)
    fingerprints = rng.integers(1, 2**63, size=300).astype(np.uint64)
    ids = index.add(codes, _paths(300), fingerprints)
    return index, codes, fingerprints, ids


def test_ids_and_paths_follow_each_other(filled):
    index, _, _, ids = filled
    assert len(index) == 300 and "p/3/img_31.png" in index
    assert ids.tolist() == list(range(300))
    assert index.paths([31, 0]) == ["p/3/img_31.png", "p/0/img_0.png"]
    assert index.ids(["p/3/img_31.png"]).tolist() == [31]
    assert index.get_paths() == _paths(300)
    with pytest.raises(KeyError, match="999"):
        index.paths([999])
    with pytest.raises(KeyError, match="nope"):
        index.ids(["nope.png"])


def test_search_equals_a_brute_force_with_paths(filled, rng):
    index, codes, _, _ = filled
    queries = rng.random((6, 64)).astype(np.float32)
    scores, ids = index.search(queries, 7)
    reference = _brute_force(queries, codes, 16)
    for row in range(6):
        np.testing.assert_allclose(scores[row], np.sort(reference[row])[::-1][:7], 1e-5)
        np.testing.assert_allclose(reference[row][ids[row]], scores[row], 1e-5)


def test_exact_copies_come_first_with_their_own_score(filled, rng):
    index, codes, fingerprints, _ = filled
    queries = rng.random((2, 64)).astype(np.float32)
    plain_scores, plain = index.search(queries, 5)
    # Item 123 is a copy of query 0: first, whatever its score; query 1 has
    # no copy in the index (fingerprint unknown), and is ranked as before.
    scores, ids = index.search(queries, 5, fingerprints=[fingerprints[123], 7])
    assert ids[0, 0] == 123
    expected = _brute_force(queries[:1], codes[123:124], 16)[0, 0]
    assert scores[0, 0] == pytest.approx(expected, rel=1e-6)
    rest = plain[0][plain[0] != 123][:4]
    np.testing.assert_array_equal(ids[0, 1:], rest)
    np.testing.assert_array_equal(ids[1], plain[1])
    np.testing.assert_array_equal(scores[1], plain_scores[1])
    assert index.exact_copies(fingerprints[123]).tolist() == [123]
    with pytest.raises(ValueError, match="one per query"):
        index.search(queries, 5, fingerprints=[1])


def test_remove_keeps_ids_paths_and_fingerprints_together(filled, rng):
    index, codes, fingerprints, _ = filled
    removed = index.remove(["p/0/img_3.png", "p/29/img_299.png", "p/0/img_3.png"])
    assert removed == 2 and len(index) == 298
    assert "p/0/img_3.png" not in index
    assert index.paths([4, 298]) == ["p/0/img_4.png", "p/29/img_298.png"]
    assert index.exact_copies(fingerprints[3]).size == 0
    np.testing.assert_array_equal(index.get_codes([4]), codes[4:5])
    with pytest.raises(KeyError, match="img_3"):
        index.remove(["p/0/img_3.png", "p/0/img_5.png"])
    assert "p/0/img_5.png" in index  # all or nothing
    new = index.add(codes[:1], ["again/img_3.png"], fingerprints[3:4])
    assert new.tolist() == [300]  # ids are never reused, not even the largest
    assert index.paths(new) == ["again/img_3.png"]
    assert index.exact_copies(fingerprints[3]).tolist() == [300]


@pytest.mark.parametrize(
    "paths, error, message",
    [
        (["a.png", "a.png"], ValueError, "repeated"),
        (["../a.png", "b.png"], ValueError, "relative POSIX paths"),
        (["/etc/a.png", "b.png"], ValueError, "relative POSIX"),
        (["a//b.png", "b.png"], ValueError, "relative POSIX"),
        (["a\0.png", "b.png"], ValueError, "relative POSIX"),
        (["caf\udce9.png", "b.png"], ValueError, "valid UTF-8"),
        ([b"a.png", "b.png"], TypeError, "str paths"),
        ("ab", TypeError, "one string"),
        (["p/0/img_0.png", "new.png"], ValueError, "already in the index"),
        (["one.png"], ValueError, "same length"),
    ],
)
def test_bad_paths_are_refused_and_change_nothing(filled, paths, error, message):
    index = filled[0]
    with pytest.raises(error, match=message):
        index.add(np.zeros((2, 4), int), paths)
    assert len(index) == len(index.get_codes()) == 300


def test_ids_of_your_own_are_new_and_then_continue(filled):
    index = filled[0]
    added = index.add(np.zeros((2, 4), int), ["x/a.png", "x/b.png"], ids=[500, 420])
    assert added.tolist() == [500, 420] and index.paths([420]) == ["x/b.png"]
    assert index.add(np.zeros((1, 4), int), ["x/c.png"]).tolist() == [501]
    for ids, message in [
        ([7], "ids must be >= 502"),  # below the next id: never reused
        ([1, 2], "one id per code"),
    ]:
        with pytest.raises(ValueError, match=message):
            index.add(np.zeros((1, 4), int), ["x/d.png"], ids=ids)
    assert len(index) == 303


def test_bad_fingerprints_are_refused(filled):
    with pytest.raises(ValueError, match="fingerprints must be 1 unsigned"):
        filled[0].add(np.zeros((1, 4), int), ["x.png"], fingerprints=[0.5])


def test_round_trip_through_one_file(filled, tmp_path, rng):
    index, _, fingerprints, _ = filled
    index.remove(["p/1/img_17.png"])
    path = tmp_path / "photos.subic"
    index.save(path)
    loaded = load_index(path)
    assert isinstance(loaded, ImageIndex)
    assert loaded.root == "/photos" and loaded.image_shape == (32, 32, 3)
    assert loaded.get_paths() == index.get_paths()
    np.testing.assert_array_equal(loaded.get_ids(), index.get_ids())
    queries = rng.random((3, 64)).astype(np.float32)
    hints = fingerprints[[5, 6, 7]]
    for a, b in zip(
        loaded.search(queries, 9, fingerprints=hints),
        index.search(queries, 9, fingerprints=hints),
    ):
        np.testing.assert_array_equal(a, b)
    # The codes alone still load as a SubicIndex (evaluate --index reads them).
    codes_only = SubicIndex.load(path)
    np.testing.assert_array_equal(codes_only.get_codes(), index.get_codes())
    # Added to after loading: ids continue after every id ever given (299
    # was removed before saving), paths follow.
    index.remove(["p/29/img_299.png"])
    index.save(path)
    loaded = load_index(path)
    assert loaded.add(np.zeros((1, 4), int), ["late.png"]).tolist() == [300]
    assert loaded.paths([300]) == ["late.png"]


def test_version_one_files_load_as_they_are(tmp_path, rng):
    index = SubicIndex(4, 16)
    index.add(random_codes(rng, 20, 4, 16))
    index.save(tmp_path / "v1.subic")
    assert (tmp_path / "v1.subic").read_bytes()[8] == 1
    assert isinstance(load_index(tmp_path / "v1.subic"), SubicIndex)
    with pytest.raises(ValueError, match="codes without image paths"):
        ImageIndex.load(tmp_path / "v1.subic")


def _rewrite(path, mutate):
    """The file at `path` with its body changed by `mutate` and a fresh
    checksum, as a crafted (not corrupted) file would have."""

    data = bytearray(path.read_bytes()[:-32])
    mutate(data)
    path.write_bytes(bytes(data) + hashlib.sha256(data).digest())


def _write_items(path, items, n=2):
    header = file_format.Header(2, 4, n, None)
    packed = packing.pack(np.zeros((n, 2), np.int64), 2)
    file_format.write(path, header, [packed], np.arange(n), items)


def _items(paths, metadata=None, attributes=None):
    n = len(paths)
    metadata = {"format": FORMAT, "root": "/p"} if metadata is None else metadata
    attributes = [None] * n if attributes is None else attributes
    return file_format.Items(
        metadata, paths, np.zeros(n, np.uint64), np.zeros(n), attributes
    )


def test_crafted_item_tables_are_refused_with_the_reason(filled, tmp_path):
    # Version 3: the item table ends the file.
    _, codes, fingerprints, _ = filled
    index = ImageIndex(4, 16, "/photos", (32, 32, 3))
    index.add(codes, _paths(300), fingerprints)
    path = tmp_path / "photos.subic"
    index.save(path)
    table_start = 40 + 300 * (len(index.get_codes()[0]) // 2 + 8)
    length_at = slice(table_start, table_start + 8)
    size = len(path.read_bytes()) - 32
    attributes_json = len(json.dumps([None] * 300))
    path_table_end = size - attributes_json - 8 - 8 * 300
    cases = [
        ("overruns", lambda d: d.__setitem__(length_at, (2**40).to_bytes(8, "little"))),
        ("not valid JSON", lambda d: d.__setitem__(table_start + 8, ord("[") + 1)),
        ("does not hold 300 paths", lambda d: d.__setitem__(path_table_end - 1, 120)),
        ("attributes are not valid JSON", lambda d: d.__setitem__(len(d) - 1, 120)),
        ("truncated|overruns", lambda d: d.__delitem__(slice(len(d) - 4000, len(d)))),
        ("truncated", lambda d: d.__delitem__(slice(table_start, len(d)))),
    ]
    for message, mutate in cases:
        index.save(path)
        _rewrite(path, mutate)
        with pytest.raises(ValueError, match=message):
            load_index(path)
    index.save(path)
    data = bytearray(path.read_bytes())
    data[path_table_end - 5] ^= 1  # a path byte, without a new checksum
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_index(path)


def test_foreign_item_tables_are_refused(tmp_path):
    path = tmp_path / "x.subic"
    cases = [
        (_items(["a", "a"]), "paths are repeated"),
        (_items(["a", "b"], {"x": 1}), "not an image index"),
        (_items(["a", "b"], attributes=[{"1x": 2}, None]), "names must be letters"),
        (_items(["a", "b"], attributes=[{"x": [1]}, None]), "values must be strings"),
        (_items(["a", "b"], attributes=[None]), "attributes are not a JSON array of 2"),
    ]
    for items, message in cases:
        _write_items(path, items)
        with pytest.raises(ValueError, match=message):
            load_index(path)


def test_version_two_files_load_with_unknown_times_and_no_attributes(tmp_path, rng):
    # Version 2 (written by earlier releases): version 3 without its last
    # two columns.
    path = tmp_path / "v2.subic"
    _write_items(path, _items(["cat/a.png", "b.png"]))
    data = bytearray(path.read_bytes()[:-32])
    attributes = json.dumps([None, None]).encode()
    del data[len(data) - len(attributes) - 8 - 16 :]
    data[8], data[20] = 2, 0  # version 2, which had no item flag
    path.write_bytes(bytes(data) + hashlib.sha256(data).digest())
    index = load_index(path)
    assert isinstance(index, ImageIndex) and index.get_paths() == ["cat/a.png", "b.png"]
    assert [item["added"] for item in index.describe([0, 1])] == [0.0, 0.0]
    queries = rng.random((1, 8)).astype(np.float32)
    assert index.search(queries, 5, where="class == 'cat'")[1].tolist() == [[0]]
    assert index.search(queries, 5, where="added > 0")[1].shape == (1, 0)


def test_a_given_subic_index_must_fit_and_be_empty():
    exact = SubicIndex(4, 16, scanner="faiss")
    assert ImageIndex(4, 16, "/p", index=exact).scanner == "faiss"
    with pytest.raises(ValueError, match="not 8 of 16"):
        ImageIndex(8, 16, "/p", index=exact)
    exact.add(np.zeros((1, 4), int))
    with pytest.raises(ValueError, match="must be empty, received one of 1 items"):
        ImageIndex(4, 16, "/p", index=exact)
