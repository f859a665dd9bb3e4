"""The Milvus backend on Milvus Lite: SubicIndex's results, through Milvus."""

import os

import numpy as np
import pytest
from search_reference import distinct_codes, relu_queries

from subic_keras.search import SubicIndex, milvus_client

pymilvus = pytest.importorskip("pymilvus", reason="the [milvus] extra")
milvus = pytest.importorskip("subic_keras.search.milvus")
MilvusIndex = milvus.MilvusIndex


@pytest.fixture(autouse=True)
def scanner():
    """One run (the native/faiss choice does not apply to Milvus)."""
    return "milvus"


@pytest.fixture
def uri(tmp_path):
    return str(tmp_path / "codes.db")


def both(uri, name, codes, ids, block_size):
    index = SubicIndex(codes.shape[1], block_size)
    index.add(codes, ids=ids)
    remote = MilvusIndex(uri, name, codes.shape[1], block_size)
    remote.add(codes, ids=ids)
    return index, remote


@pytest.mark.parametrize("block_size", [16, 64, 256])
def test_same_top_k_as_subic_index(rng, uri, block_size):
    # Distinct codes and continuous queries: no exact ties to order.
    codes = distinct_codes(rng, 2000, 6, block_size)
    ids = rng.permutation(100_000)[:2000]
    index, remote = both(uri, f"k{block_size}", codes, ids, block_size)
    queries = relu_queries(rng, 8, 6, block_size)
    for k in (1, 10, 100):
        want, got = index.search(queries, k), remote.search(queries, k)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    index.remove(ids[:500])
    remote.remove(ids[:500])
    assert len(remote) == len(index) == 1500
    np.testing.assert_array_equal(
        remote.search(queries, 50)[1], index.search(queries, 50)[1]
    )
    remote.close()
    reopened = MilvusIndex(uri, f"k{block_size}")
    assert (reopened.num_blocks, reopened.block_size) == (6, block_size)
    np.testing.assert_array_equal(reopened.get_ids(), index.get_ids())
    np.testing.assert_array_equal(reopened.get_codes(), index.get_codes())
    np.testing.assert_array_equal(
        reopened.search(queries, 20)[1], index.search(queries, 20)[1]
    )
    more = reopened.add(distinct_codes(rng, 3, 6, block_size))
    assert more.tolist() == [int(ids.max()) + 1 + i for i in range(3)]
    reopened.close()


def test_queries_with_negative_entries_rank_as_subic_index(rng, uri):
    # The class-posterior query `W1 s` has negative entries, which Milvus's
    # sparse vectors refuse: shifted per block, it must rank the same.
    codes = distinct_codes(rng, 1500, 8, 64)
    index, remote = both(uri, "signed", codes, np.arange(1500), 64)
    queries = rng.normal(size=(6, 8 * 64)).astype(np.float32)
    queries[0] -= 5.0  # every entry negative
    for k in (1, 10, 100):
        want, got = index.search(queries, k), remote.search(queries, k)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-4)
    remote.close()


def test_width_and_missing_results(rng, uri):
    remote = MilvusIndex(uri, "small", 2, 4)
    remote.add(np.array([[0, 1], [2, 3]]), ids=[10, 11])
    z_star = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    scores, ids = remote.search(z_star, 3)  # k > len: both items
    assert ids.tolist() == [[11, -1]]  # item 10 meets no non-zero entry
    assert scores[0, 0] == 6.0 and scores[0, 1] == -np.inf
    assert remote.search(np.zeros((1, 8)), 2)[1].tolist() == [[-1, -1]]
    scores, ids = remote.search_codes(np.array([[0, 1]]), 5)
    assert ids[0, 0] == 10 and scores[0, 0] == 2
    with pytest.raises(ValueError, match="k must be <= 16384"):
        remote.search(z_star, 20_000)
    remote.close()


def test_bad_input(rng, uri, tmp_path):
    remote = MilvusIndex(uri, "codes", 4, 16)
    remote.add(rng.integers(0, 16, (20, 4)), ids=np.arange(20))
    with pytest.raises(ValueError, match="codes"):
        remote.add(np.full((2, 4), 16))
    with pytest.raises(ValueError, match=r"repeated: \[3\]"):
        remote.add(np.zeros((2, 4), int), ids=[3, 3])
    with pytest.raises(ValueError, match=r"already in collection 'codes': \[5\]"):
        remote.add(np.zeros((2, 4), int), ids=[5, 100])
    with pytest.raises(KeyError, match=r"\[99\]"):
        remote.remove([1, 99])
    assert len(remote) == 20
    with pytest.raises(ValueError, match="width"):
        remote.search(np.ones((1, 63)), 3)
    for size in (0, 1):  # powers of two, but not block sizes
        with pytest.raises(
            ValueError, match=f"block_size must be >= 2, received {size}"
        ):
            MilvusIndex(uri, "other", 4, size)
    with pytest.raises(ValueError, match="num_blocks=4, received num_blocks=5"):
        MilvusIndex(uri, "codes", 5, 16)
    with pytest.raises(ValueError, match="does not exist"):
        MilvusIndex(uri, "absent")
    with pytest.raises(ValueError, match="ending in .db"):
        MilvusIndex(str(tmp_path / "codes.sqlite"), "codes")
    # Opening, not creating: a missing database is refused, and not made.
    with pytest.raises(ValueError, match="no Milvus Lite database at that path$"):
        MilvusIndex(str(tmp_path / "nothere.db"), "codes")
    assert not (tmp_path / "nothere.db").exists()
    # A link where the database goes: never written through.
    (tmp_path / "link.db").symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(FileExistsError, match="never written through"):
        MilvusIndex(str(tmp_path / "link.db"), "codes", 4, 16)
    assert not (tmp_path / "elsewhere.db").exists()
    remote.close()
    client = pymilvus.MilvusClient(uri=uri)
    client.create_collection("plain", dimension=8)
    client.close()
    with pytest.raises(ValueError, match="not a SuBiC collection"):
        MilvusIndex(uri, "plain")


def test_unreachable_server():
    with pytest.raises(ConnectionError, match="cannot reach Milvus at uri="):
        MilvusIndex("http://127.0.0.1:9", "codes", 4, 16, timeout=2)


def test_failed_insert_leaves_the_collection_as_it_was(rng, uri, monkeypatch):
    remote = MilvusIndex(uri, "codes", 4, 16)
    remote.add(rng.integers(0, 16, (10, 4)))
    monkeypatch.setattr(milvus_client, "BATCH", 7)
    calls = []
    insert = remote._client.insert

    def failing(name, rows):
        calls.append(len(rows))
        if len(calls) == 3:
            raise RuntimeError("disk full")
        return insert(name, rows)

    monkeypatch.setattr(remote._client, "insert", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        remote.add(rng.integers(0, 16, (30, 4)))
    assert calls == [7, 7, 7] and len(remote) == 10
    np.testing.assert_array_equal(remote.get_ids(), np.arange(10))
    remote.close()


@pytest.mark.slow
def test_a_kill_between_insert_and_counters_loses_nothing(rng, uri):
    """A process killed (SIGKILL) after its rows are in and before it records
    its counters: a reopened collection counts, lists and keeps their ids.
    (Milvus Lite locks its data for one process at a time, so the writers
    are child processes.)"""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from subic_keras.search.milvus import MilvusIndex

        index = MilvusIndex({uri!r}, "killed", 4, 16)
        index.add(np.random.default_rng(0).integers(0, 16, (1000, 4)))
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        index._client.alter_collection_properties = die
        index.add(np.random.default_rng(1).integers(0, 16, (10_000, 4)))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=300)
    assert done.returncode == -9
    reopened = MilvusIndex(uri, "killed")
    assert len(reopened) == len(reopened.get_ids()) == 11_000
    new = reopened.add(rng.integers(0, 16, (5, 4)))
    assert new.tolist() == list(range(11_000, 11_005))  # no id reused
    again = reopened.add(rng.integers(0, 16, (5, 4)))
    assert again.tolist() == list(range(11_005, 11_010))
    assert len(set(reopened.get_ids().tolist())) == len(reopened) == 11_010
    reopened.close()


def test_two_writers_in_one_process_take_turns(rng, uri):
    import threading

    one = MilvusIndex(uri, "shared", 4, 16)
    two = MilvusIndex(uri, "shared")
    added = []

    def write(index):
        for _ in range(3):
            added.append(index.add(rng.integers(0, 16, (500, 4))))

    threads = [threading.Thread(target=write, args=(i,)) for i in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = np.concatenate(added)
    assert len(np.unique(ids)) == len(ids) == 3000
    assert len(one) == 3000 and sorted(one.get_ids().tolist()) == sorted(ids.tolist())
    one.close()
    two.close()


def test_forged_collections_and_milvus_errors_are_named(uri):
    client = pymilvus.MilvusClient(uri=uri)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", pymilvus.DataType.INT64, is_primary=True)
    schema.add_field("seq", pymilvus.DataType.INT64)
    schema.add_field("code", pymilvus.DataType.SPARSE_FLOAT_VECTOR)
    index = client.prepare_index_params()
    index.add_index(
        field_name="code", index_type="SPARSE_INVERTED_INDEX", metric_type="IP"
    )
    for name, m, k in (
        ("zero_blocks", "0", "16"),
        ("odd_size", "4", "3"),
        ("unit_size", "4", "1"),
    ):
        client.create_collection(
            name,
            schema=schema,
            index_params=index,
            properties={
                "subic.format": "1",
                "subic.num_blocks": m,
                "subic.block_size": k,
            },
        )
        with pytest.raises(ValueError, match=f"collection '{name}' .* invalid shape"):
            MilvusIndex(uri, name)
    client.close()
    good = MilvusIndex(uri, "good", 4, 16)
    good._client.drop_collection("good")  # gone behind its back
    with pytest.raises(milvus.MilvusError, match="collection 'good'"):
        good.search(np.ones((1, 64), np.float32), 3)
    good.close()


def test_filters_become_milvus_expressions_with_the_same_answers(rng, uri):
    codes = distinct_codes(rng, 1500, 6, 16)
    ids = rng.permutation(10_000)[:1500]
    index, remote = both(uri, "filtered", codes, ids, 16)
    queries = relu_queries(rng, 5, 6, 16)
    for where in (
        "id < 3000",
        "id >= 500 and not (id in [{}])".format(", ".join(map(str, ids[:40]))),
        f"id == {ids[7]} or id > 9000",
        ids[100:160],
    ):
        want, got = (
            index.search(queries, 30, where=where),
            remote.search(queries, 30, where=where),
        )
        found = got[1] >= 0
        assert (found.sum(axis=1) == want[1].shape[1]).all()
        np.testing.assert_array_equal(got[1][:, : want[1].shape[1]], want[1])
    with pytest.raises(
        ValueError, match="filtered on id alone, received a test on 'path'"
    ):
        remote.search(queries, 5, where="path under 'cats'")
    remote.close()


def test_a_collection_records_the_model_that_wrote_it(rng, uri):
    from subic_keras.search.uri import add_codes
    from subic_keras.search.uri import open as open_index

    record = {"digest": "a" * 64, "file": "best.keras", "num_blocks": 4}
    codes = rng.integers(0, 16, (20, 4))
    add_codes(uri, codes, None, num_blocks=4, block_size=16, model=record)
    with open_index(uri, collection="subic") as reopened:
        assert reopened.model == record
    other = {**record, "digest": "b" * 64, "file": "again.keras"}
    with pytest.raises(ValueError, match=r"holds codes of best.keras.*not of again"):
        add_codes(uri, codes, None, num_blocks=4, block_size=16, model=other)
    with MilvusIndex(uri, "subic") as database:
        assert len(database) == 20  # nothing was added
    with MilvusIndex(uri, "unrecorded", 4, 16) as database:
        assert database.model is None


def test_a_server_without_sparse_vectors_is_named(uri, monkeypatch):
    # Milvus 2.3's answer to SuBiC's collection, raised by create_collection.
    def refuse(self, *args, **kwargs):
        raise pymilvus.exceptions.MilvusException(
            code=1100, message="create index on 104 field is not supported"
        )

    monkeypatch.setattr(pymilvus.MilvusClient, "create_collection", refuse)
    with pytest.raises(milvus.MilvusError, match="cannot index sparse vectors") as info:
        MilvusIndex(uri, "old_server", 4, 16)
    assert "\n" not in str(info.value)


def test_a_second_vector_field_keeps_the_instance_codes(rng, uri):
    # One collection, both codes: the class code searched as before, the
    # instance code through by_instance(), each as SubicIndex ranks it.
    codes = distinct_codes(rng, 1200, 6, 16)
    instance_codes = distinct_codes(rng, 1200, 8, 32)
    ids = rng.permutation(50_000)[:1200]
    record = {"digest": "c" * 64, "file": "instance", "num_blocks": 8}
    remote = MilvusIndex(uri, "both", 6, 16, instance=(8, 32), instance_model=record)
    remote.add(codes, ids=ids, instance_codes=instance_codes)
    classes, instances = SubicIndex(6, 16), SubicIndex(8, 32)
    classes.add(codes, ids=ids)
    instances.add(instance_codes, ids=ids)
    view = remote.by_instance()
    assert (view.num_blocks, view.block_size) == (8, 32)
    assert view.model == record and remote.model is None
    queries, instance_queries = (
        relu_queries(rng, 5, 6, 16),
        relu_queries(rng, 5, 8, 32),
    )
    for k in (1, 10, 100):
        np.testing.assert_array_equal(
            remote.search(queries, k)[1], classes.search(queries, k)[1]
        )
        np.testing.assert_array_equal(
            view.search(instance_queries, k)[1],
            instances.search(instance_queries, k)[1],
        )
    np.testing.assert_array_equal(view.get_codes(ids[:7]), instance_codes[:7])
    np.testing.assert_array_equal(remote.get_codes(ids[:7]), codes[:7])
    with pytest.raises(ValueError, match="view of a collection's instance codes"):
        view.add(instance_codes[:1])
    with pytest.raises(ValueError, match="view of a collection's instance codes"):
        view.remove(ids[:1])
    view.close()  # the view leaves its collection open
    remote.remove(ids[:200])
    instances.remove(ids[:200])
    np.testing.assert_array_equal(
        view.search(instance_queries, 30)[1], instances.search(instance_queries, 30)[1]
    )
    remote.close()
    with MilvusIndex(uri, "both") as reopened:
        assert reopened.instance == (8, 32)
        assert reopened.instance_model == record and reopened.model is None
        np.testing.assert_array_equal(
            reopened.by_instance().search(instance_queries, 30)[1],
            instances.search(instance_queries, 30)[1],
        )
        more = reopened.add(codes[:2], instance_codes=instance_codes[:2])
        assert len(reopened) == 1002 and len(more) == 2


def test_instance_codes_are_checked_before_anything_is_written(rng, uri):
    both = MilvusIndex(uri, "both", 4, 16, instance=(8, 16))
    codes = rng.integers(0, 16, (3, 4))
    with pytest.raises(ValueError, match="instance_codes must be given"):
        both.add(codes)
    with pytest.raises(ValueError, match="instance_codes"):
        both.add(codes, instance_codes=np.full((3, 8), 16))
    with pytest.raises(ValueError, match=r"one code per item \(3\), received 2"):
        both.add(codes, instance_codes=np.zeros((2, 8), int))
    assert len(both) == 0
    with pytest.raises(ValueError, match=r"instance=\(8, 16\), received instance"):
        MilvusIndex(uri, "both", instance=(4, 16))
    both.close()
    plain = MilvusIndex(uri, "plain", 4, 16)
    with pytest.raises(ValueError, match="keeps none"):
        plain.add(codes, instance_codes=np.zeros((3, 8), int))
    with pytest.raises(ValueError, match="keeps no instance codes"):
        plain.by_instance()
    for bad, match in (
        ((8,), r"instance must be \(num_blocks, block_size\), received \(8,\)"),
        ((8, 12), "block_size"),
        ((8, 1), r"instance\[1\] must be >= 2, received 1"),
        ((0, 16), "instance"),
        ("8x16", "received '8x16'"),
    ):
        with pytest.raises(ValueError, match=match):
            MilvusIndex(uri, "other", 4, 16, instance=bad)
    plain.close()


def test_a_forged_instance_shape_is_named(uri):
    from subic_keras.search import milvus_schema

    base = {"subic.format": "2", "subic.num_blocks": "4", "subic.block_size": "16"}
    with pytest.raises(ValueError, match=r"format 2 needs \['subic.instance"):
        milvus_schema.read(base, "collection 'x'")
    forged = {
        **base,
        "subic.instance_num_blocks": "8",
        "subic.instance_block_size": "many",
    }
    with pytest.raises(ValueError, match="collection 'x' records an invalid shape"):
        milvus_schema.read(forged, "collection 'x'")
    with pytest.raises(ValueError, match="reads versions 1, 2, 3"):
        milvus_schema.read({**base, "subic.format": "4"}, "collection 'x'")
    # Format 3, a folder's: its folder and pictures' shape, checked.
    folder = {**base, "subic.format": "3"}
    with pytest.raises(ValueError, match="format 3 needs subic.root, the folder"):
        milvus_schema.read(folder, "collection 'x'")
    with pytest.raises(ValueError, match="'photos' is not an absolute path"):
        milvus_schema.read({**folder, "subic.root": "photos"}, "collection 'x'")
    shape = {**folder, "subic.root": "/photos", "subic.image_shape": "[32, 32]"}
    with pytest.raises(ValueError, match=r"image_shape \[32, 32\] is not"):
        milvus_schema.read(shape, "collection 'x'")
    read = milvus_schema.read({**shape, "subic.image_shape": "[8, 8, 1]"}, "x")
    assert (read.root, read.image_shape, read.instance) == ("/photos", (8, 8, 1), None)
    version_1 = milvus_schema.read({**base, "subic.format": "1"}, "collection 'x'")
    assert version_1.instance is None


def test_answers_by_both_codes_as_an_image_index_does(rng, uri):
    # Copies first by the instance code's copy rule, then the class ranking,
    # equal class scores by instance score: as `ImageIndex` answers, which
    # `shard_part` and `merge_parts` make here from the same codes.
    from subic_keras.search.instance_codes import (
        InstanceCodes,
        merge_parts,
        shard_part,
    )

    n = 400
    codes = rng.integers(0, 4, (n, 2))  # 16 class codes: many ties
    instance_codes = distinct_codes(rng, n, 8, 32)
    ids = rng.permutation(10_000)[:n]
    record = {"digest": "d" * 64, "file": "instance", "copy_margin": -0.5}
    remote = MilvusIndex(uri, "answer", 2, 4, instance=(8, 32), instance_model=record)
    remote.add(codes, ids=ids, instance_codes=instance_codes)
    classes = SubicIndex(2, 4)
    classes.add(codes, ids=ids)
    instance = InstanceCodes(8, 32, record)
    instance.codes.add(instance_codes, ids=ids)
    # Entries of a few exact binary values: class scores tie exactly.
    queries = rng.choice([0.25, 0.5, 1.0], size=(6, 8)).astype(np.float32)
    instance_queries = relu_queries(rng, 6, 8, 32)
    for row, item in enumerate([5, 77, 300]):  # copies of three items
        instance_queries[row] *= 0.05
        instance_queries[row, np.arange(8) * 32 + instance_codes[item]] += 3.0
    position = {int(item): at for at, item in enumerate(ids)}

    def rows_of(found):
        return np.array([position.get(int(i), -1) for i in found])

    part = shard_part(classes, instance, queries, instance_queries, n, None, rows_of)
    want_scores, want_ids, want_copy = merge_parts([part], n)
    answers = remote.answer(queries, n, instance_queries=instance_queries)
    got_ids = np.array([[match["id"] for match in rows] for rows in answers])
    got_copy = np.array([[match["copy"] for match in rows] for rows in answers])
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_copy, want_copy)
    assert got_copy[:3, 0].all() and got_copy.sum() == 3  # the planted copies
    assert [rows[0]["id"] for rows in answers[:3]] == [ids[5], ids[77], ids[300]]
    np.testing.assert_allclose(
        [[match["score"] for match in rows] for rows in answers],
        want_scores,
        rtol=1e-5,
    )
    # The class scores' ties were ordered by instance score, not as stored.
    plain = remote.search(queries, n)[1]
    assert (plain[3:] != got_ids[3:]).any()
    # Without instance queries: the class code's answer alone.
    alone = remote.search(queries, 5)[1]
    assert [[m["id"] for m in rows] for rows in remote.answer(queries, 5)] == (
        alone.tolist()
    )
    with pytest.raises(ValueError, match="instance_queries"):
        remote.answer(queries, 5, instance_queries=instance_queries[:2])
    remote.close()


@pytest.mark.parametrize(
    "name", ["../x", "é", "a\x00b", "x" * 256, "a b", "a;drop", "1abc"]
)
def test_collection_names_milvus_refuses_are_refused_before_it_sees_them(
    name, tmp_path
):
    from subic_keras.search.addresses import check_location

    with pytest.raises(ValueError, match="a name Milvus takes: a letter or _ first"):
        check_location(str(tmp_path / "codes.db"), name)
    assert not os.path.exists(tmp_path / "codes.db")
    check_location(str(tmp_path / "codes.db"), "_photos_" + "x" * 247)  # 255
