"""A folder's pictures in Milvus (`MilvusPictures`): the answers, paths,
filters and copies of an `ImageIndex` of the same pictures."""

import numpy as np
import pytest
from search_reference import distinct_codes, relu_queries

from subic_keras.search import open as search_open
from subic_keras.search.image_index import ImageIndex

pymilvus = pytest.importorskip("pymilvus", reason="the [milvus] extra")
milvus_pictures = pytest.importorskip("subic_keras.search.milvus_pictures")
MilvusPictures = milvus_pictures.MilvusPictures

# Paths a filter expression must quote: quotes, backslashes, line breaks,
# a tab, a control character, accents and a character beyond the BMP.
ODD = ['b/say "hi".png', "b/back\\slash.png", "b/line\nbreak.png", "b/tab\t.png",
       "b/bell\x07.png", "b/é/ü.png", "b/🙂.png"]  # fmt: skip
RECORD = {"digest": "ab" * 32, "copy_margin": -0.5, "copy_blocks": 4}


@pytest.fixture(autouse=True)
def scanner():
    """One run (the native/faiss choice does not apply to Milvus)."""
    return "milvus"


def _pictures(rng, n=60):
    paths = [f"a/{i}.png" if i % 3 else f"a/x/{i}.png" for i in range(n - len(ODD))]
    paths += ODD
    fingerprints = rng.integers(1, 2**64, n, dtype=np.uint64)
    fingerprints[5] = fingerprints[40] = 2**63 + 11  # two exact copies, top bit set
    fingerprints[7] = 0  # unknown
    # Attributes of every kind, the same name holding several kinds.
    kinds = [None, {"n": 1}, {"n": 0.5, "s": "x"}, {"n": "9"}, {"n": True, "s": "é"},
             {"n": 2**60 + 1}]  # fmt: skip
    attributes = [kinds[i % 6] and {**kinds[i % 6], "i": i} for i in range(n)]
    return paths, fingerprints, attributes


def _both(rng, tmp_path, n=60):
    """The same pictures in an `ImageIndex` and in a Milvus collection, each
    with a class code (6 blocks of 16) and an instance code (4 of 8)."""
    paths, fingerprints, attributes = _pictures(rng, n)
    codes = distinct_codes(rng, n, 6, 16)
    near = rng.integers(0, 8, (n, 4))
    near[41] = near[3]  # a copy by the instance code
    root = tmp_path / "photos"
    index = ImageIndex(6, 16, root, (8, 8, 3), instance=(4, 8))
    index.instance.model = RECORD
    index.add(codes, paths, fingerprints, attributes, instance_codes=near)
    remote = MilvusPictures(
        str(tmp_path / "photos.db"), "photos", 6, 16, root=root,
        image_shape=(8, 8, 3), instance=(4, 8), instance_model=RECORD,
    )  # fmt: skip
    remote.add(codes, paths, fingerprints, attributes, instance_codes=near)
    return index, remote


def _rows(answers):
    keys = ("id", "path", "class", "exact", "copy", "attributes")
    return [[tuple(row.get(key) for key in keys) for row in rows] for rows in answers]


def test_answers_are_an_image_index_answers(rng, tmp_path):
    index, remote = _both(rng, tmp_path)
    queries = relu_queries(rng, 6, 6, 16) + 0.01  # every item scores above 0
    instance_queries = relu_queries(rng, 6, 4, 8)
    instance_queries[2] = 0
    instance_queries[2, np.arange(4) * 8 + index.by_instance().get_codes([3])[0]] = 1
    fingerprints = np.array([2**63 + 11, 0, 123, 0, 0, 0], np.uint64)
    for where in (None, "class == 'b'", "path under 'a/x'", "path under 'a'",
                  "added > 0 and not (class in ['a'])", 'path >= "b/b"',
                  f"path == {ODD[0]!r} or path in [{ODD[2]!r}, {ODD[5]!r}]",
                  "id < 20 or id == 40", "attrs.n > 0.5", "attrs.s != 'x'",
                  "not (attrs.n == 1) and not (attrs.s in ['é'])",
                  "attrs.n in [1, '9', true] or attrs.i >= 50",
                  f"attrs.n >= {2**60} or not (attrs.n != true)"):  # fmt: skip
        for more in ({}, {"instance_queries": instance_queries}):
            want = index.answer(
                queries, 60, where=where, fingerprints=fingerprints, **more
            )
            got = remote.answer(
                queries, 60, where=where, fingerprints=fingerprints, **more
            )
            assert _rows(got) == _rows(want), (where, more)
            for mine, theirs in zip(got, want):
                np.testing.assert_allclose(
                    [row["score"] for row in mine],
                    [row["score"] for row in theirs],
                    rtol=1e-5,
                )
    # `search` ranks as `answer` does, as an ImageIndex's.
    both = {"fingerprints": fingerprints, "instance_queries": instance_queries}
    for given in ({}, {"fingerprints": fingerprints}, both):
        want = index.search(queries, 12, **given)
        got = remote.search(queries, 12, **given)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    # The exact copies first, the query's copy by the instance code marked.
    first = remote.answer(queries, 3, **both)
    assert [row["id"] for row in first[0][:2]] == [5, 40]
    assert first[0][0]["exact"] and first[0][1]["exact"]
    assert [row["id"] for row in first[2] if row["copy"]] == [3, 41]
    remote.close()


def test_paths_fields_and_copies_as_an_image_index(rng, tmp_path):
    index, remote = _both(rng, tmp_path)
    ids = index.get_ids()
    assert remote.get_paths() == index.get_paths()
    assert remote.paths(ids[::-1]) == index.paths(ids[::-1])
    assert remote.ids(ODD).tolist() == index.ids(ODD).tolist()
    assert all(path in remote for path in ODD) and "b/none.png" not in remote
    assert 3 not in remote
    assert remote.folders() == index.folders()
    assert remote.describe(ids[:9]) == [
        {**row, "added": pytest.approx(row["added"], abs=5)}
        for row in index.describe(ids[:9])
    ]
    # By their codes, and pictures 5 and 40, of the same pixels, always.
    assert (
        remote.duplicates()
        == index.duplicates()
        == [
            ["a/x/3.png", "a/41.png"],
            ["a/5.png", "a/40.png"],
        ]
    )
    assert remote.duplicates(copy_blocks=1) == index.duplicates(copy_blocks=1)
    with pytest.raises(KeyError, match="paths not in the index"):
        remote.ids(["a/1.png", "b/none.png"])
    with pytest.raises(KeyError, match="ids not in the index"):
        remote.paths([1, 10_000])
    # Reopened by its address: the folder, the pictures' shape, the models.
    remote.close()
    opened = search_open(str(tmp_path / "photos.db"), collection="photos")
    assert isinstance(opened, MilvusPictures)
    assert (opened.root, opened.image_shape) == (index.root, (8, 8, 3))
    assert opened.instance_model == RECORD and len(opened) == 60
    assert opened.holds_pictures and not opened.written_with_looks
    assert opened.by_instance().get_paths() == index.get_paths()
    # Removing by path, all or nothing; ids are never reused.
    with pytest.raises(KeyError, match="b/none.png"):
        opened.remove([ODD[0], "b/none.png"])
    assert len(opened) == 60
    assert opened.remove([ODD[0], ODD[1], ODD[0]]) == 2
    assert ODD[0] not in opened and len(opened) == 58
    again = opened.add(
        [[1] * 6], [ODD[0]], instance_codes=[[0] * 4], attributes=[{"k": True}]
    )
    assert again.tolist() == [60]
    with pytest.raises(ValueError, match=r"ids must be >= 61 \(ids are never reused\)"):
        opened.add([[1] * 6], [ODD[1]], ids=[3], instance_codes=[[0] * 4])
    assert opened.describe(again)[0]["attributes"] == {"k": True}
    # The folders, read again after each change.
    assert "z" not in opened.folders()
    opened.add([[2] * 6], ["z/new.png"], instance_codes=[[0] * 4])
    assert opened.folders() == ["a", "a/x", "b", "b/é", "z"]
    opened.remove(["z/new.png"])
    assert "z" not in opened.folders()
    opened.close()


def test_mistakes_are_refused_whole(rng, tmp_path):
    _, remote = _both(rng, tmp_path)
    one = {"instance_codes": [[0] * 4]}
    with pytest.raises(ValueError, match=r"paths already in the index: \['a/1.png'\]"):
        remote.add(
            [[0] * 6, [1] * 6], ["c/new.png", "a/1.png"], instance_codes=[[0] * 4] * 2
        )
    assert len(remote) == 60 and "c/new.png" not in remote
    with pytest.raises(ValueError, match="paths must be relative POSIX paths"):
        remote.add([[0] * 6], ["../up.png"], **one)
    with pytest.raises(ValueError, match="at most 65535 bytes in Milvus"):
        remote.add([[0] * 6], ["c/" + "x" * 70_000], **one)
    with pytest.raises(ValueError, match="codes and paths must have the same length"):
        remote.add([[0] * 6] * 2, ["c/new.png"], **one)
    with pytest.raises(ValueError, match="instance_codes must be given"):
        remote.add([[0] * 6], ["c/new.png"])
    with pytest.raises(ValueError, match="fingerprints must be 1 unsigned integers"):
        remote.add([[0] * 6], ["c/new.png"], fingerprints=[1.5], **one)
    with pytest.raises(ValueError, match="compare with == and != only"):
        remote.answer(relu_queries(rng, 1, 6, 16), 3, where="attrs.n < true")
    with pytest.raises(ValueError, match="path is a string, received 3"):
        remote.answer(relu_queries(rng, 1, 6, 16), 3, where="path == 3")
    with pytest.raises(TypeError, match="received one string"):
        remote.remove("a/1.png")
    assert len(remote) == 60
    uri = str(tmp_path / "photos.db")
    with pytest.raises(ValueError, match="holds pictures of .*photos, received root"):
        MilvusPictures(uri, "photos", root=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="root must be given with num_blocks"):
        MilvusPictures(uri, "other", 6, 16)
    with pytest.raises(ValueError, match=r"image_shape \[32, 32\] is not \(H, W, C\)"):
        MilvusPictures(uri, "other", 6, 16, root=tmp_path, image_shape=(32, 32))
    shape = np.array([8, 8, 3])  # NumPy integers are integers
    other = MilvusPictures(uri, "other", 6, 16, root=tmp_path, image_shape=shape)
    assert other.image_shape == (8, 8, 3)
    # A collection of codes alone is not a folder's.
    from subic_keras.search.milvus import MilvusIndex

    codes = MilvusIndex(uri, "codes", 6, 16)
    codes.add(distinct_codes(rng, 5, 6, 16))
    with pytest.raises(ValueError, match="holds codes without image paths"):
        MilvusPictures(uri, "codes")
    assert type(search_open(uri, collection="codes")) is MilvusIndex
    # ... and a folder's is written through its paths.
    with pytest.raises(ValueError, match="add them with their paths"):
        MilvusIndex(uri, "photos").add(distinct_codes(rng, 1, 6, 16))
    remote.close()


def test_attribute_tests_keep_what_an_image_index_keeps(rng, tmp_path):
    """Every comparison of attributes of every kind (numbers, integers past
    2**53, strings, booleans, missing), negated too, keeps the pictures an
    `ImageIndex` keeps: Milvus reads the values of the test's kind alone."""
    n = 45
    kinds = [None, 3, 3.0, 2.5, 2**60 + 1, 2**60, "3", True, False]
    attributes = []
    for i in range(n):
        values = {"n": kinds[i % 9], "s": ["apple", "Zed", "é"][i % 3]}
        attributes.append({k: v for k, v in values.items() if v is not None})
    codes, paths = rng.integers(0, 16, (n, 4)), [f"p/{i}.png" for i in range(n)]
    index = ImageIndex(4, 16, tmp_path)
    index.add(codes, paths, attributes=attributes)
    remote = MilvusPictures(str(tmp_path / "a.db"), "a", 4, 16, root=tmp_path)
    remote.add(codes, paths, attributes=attributes)
    queries = 1 + rng.random((1, 64), dtype=np.float32)  # every picture scores
    values = ["3", "2.5", str(2**60), str(2**60 + 1), "'3'", "'apple'", "'b'", "-1"]
    tests = [f"attrs.{name} {op} {value}" for name in "ns" for value in values
             for op in ("==", "!=", "<", "<=", ">", ">=")]  # fmt: skip
    tests += [
        f"attrs.n {op} {value}" for op in ("==", "!=") for value in ("true", "false")
    ]
    tests += [f"not ({test})" for test in tests[::5]]
    tests += ["attrs.n in [3, '3', true]", "not (attrs.missing == 1)"]
    for test in tests:
        want = [row["id"] for row in index.answer(queries, n, where=test)[0]]
        got = [row["id"] for row in remote.answer(queries, n, where=test)[0]]
        assert sorted(got) == sorted(want), test
    remote.close()
