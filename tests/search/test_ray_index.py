"""RayIndex on a simulated Ray cluster (`ray.cluster_utils.Cluster`): exact
results, actor kills, node loss, adds and removes across shards."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
from search_reference import relu_queries

from subic_keras.search import SubicIndex
from subic_keras.search import open as open_index
from subic_keras.search.manifests import (
    check_shard_files,
    read_manifest,
    save_shards,
)
from subic_keras.search.ray_cluster import ray_module
from subic_keras.search.ray_index import RayIndex, ShardUnavailableError

ray = pytest.importorskip("ray", reason="the [ray] extra")

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
# One worker runs them all (the README's `--dist loadgroup`): one cluster.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(autouse=True)
def scanner():
    """One run: the shards choose their own scanner."""
    return "ray"


@pytest.fixture
def cluster(ray_cluster):
    return ray_cluster


def _trained_like(rng, n):
    centres = rng.integers(0, 64, (n // 40, 8))
    return centres[rng.integers(0, len(centres), n)]


@pytest.fixture
def sharded(cluster, tmp_path, rng):
    index = SubicIndex(8, 64)
    index.add(_trained_like(rng, 6000))
    save_shards(index, tmp_path / "codes.shards.json", 3)
    return index, open_index(tmp_path / "codes.shards.json")


def test_results_equal_one_index_ties_included(sharded, rng):
    index, remote = sharded
    assert isinstance(remote, RayIndex) and len(remote) == 6000
    queries = relu_queries(rng, 20, 8, 64)
    for k in (1, 10, 500):
        for got, want in zip(remote.search(queries, k), index.search(queries, k)):
            np.testing.assert_array_equal(got, want)
    where = "id < 2500 or id >= 5900"
    for got, want in zip(
        remote.search(queries, 50, where=where), index.search(queries, 50, where=where)
    ):
        np.testing.assert_array_equal(got, want)


def test_a_killed_shard_fails_no_search(sharded, rng):
    index, remote = sharded
    queries = relu_queries(rng, 5, 8, 64)
    expected = index.search(queries, 20)
    failures, stalls = [], []

    def searches():
        for _ in range(40):
            start = time.perf_counter()
            try:
                got = remote.search(queries, 20)
                assert all(np.array_equal(a, b) for a, b in zip(got, expected))
            except Exception as error:  # counted, then asserted
                failures.append(error)
            stalls.append(time.perf_counter() - start)

    thread = threading.Thread(target=searches)
    thread.start()
    time.sleep(0.3)
    ray.kill(remote.actors[1], no_restart=False)  # its process dies
    thread.join(timeout=120)
    assert not thread.is_alive() and not failures, failures
    assert max(stalls) < 30


def test_a_lost_node_fails_no_search(cluster, tmp_path, rng):
    cluster_, workers = cluster
    index = SubicIndex(8, 64)
    index.add(_trained_like(rng, 3000))
    save_shards(index, tmp_path / "lost.shards.json", 3)
    queries = relu_queries(rng, 3, 8, 64)
    expected = index.search(queries, 10)
    cluster_.wait_for_nodes()
    # SPREAD is Ray's best effort: on a busy machine every shard may start
    # on the head node, so the index is opened again until one is elsewhere.
    for _ in range(5):
        remote = RayIndex(tmp_path / "lost.shards.json")
        nodes = set(ray.get([actor.node_id.remote() for actor in remote.actors]))
        lost = [w for w in workers if w.node_id in nodes]
        if lost:
            break
        remote._stop()
    assert lost, "no shard was placed on a worker node in 5 openings"
    cluster_.remove_node(lost[0])
    start = time.perf_counter()
    for _ in range(5):
        got = remote.search(queries, 10)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert time.perf_counter() - start < 90  # the shards restarted elsewhere
    workers.append(cluster_.add_node(num_cpus=1))  # the next test's node


def test_adds_and_removes_across_shards(sharded, rng, tmp_path):
    index, remote = sharded
    added = remote.add(_trained_like(rng, 50))
    assert added.tolist() == list(range(6000, 6050)) and len(remote) == 6050
    with pytest.raises(ValueError, match="ids already in the index"):
        remote.add(rng.integers(0, 64, (2, 8)), ids=[3, 7000])
    index.add(remote.get_codes(added), ids=added)
    queries = relu_queries(rng, 8, 8, 64)
    for got, want in zip(remote.search(queries, 30), index.search(queries, 30)):
        np.testing.assert_array_equal(got, want)
    gone = [0, 2999, 6049]  # one in the first, the second and the last shard
    assert remote.remove(gone) == 3 and len(remote) == 6047
    with pytest.raises(KeyError, match="12345"):
        remote.remove([1, 12345])
    assert len(remote) == 6047  # all or nothing
    ids = remote.get_ids()
    assert len(set(ids.tolist())) == len(ids) and not np.isin(gone, ids).any()
    # Every change is in the shards' files: a new index of the manifest has it.
    reopened = open_index(tmp_path / "codes.shards.json")
    np.testing.assert_array_equal(reopened.get_ids(), ids)


def test_a_filter_of_10000_tests_reaches_every_shard(sharded, rng):
    index, remote = sharded
    where = " or ".join(f"id == {i}" for i in range(0, 20_000, 2))
    queries = relu_queries(rng, 3, 8, 64)
    for got, want in zip(
        remote.search(queries, 20, where=where), index.search(queries, 20, where=where)
    ):
        np.testing.assert_array_equal(got, want)


def test_manifest_mistakes_are_named(tmp_path):
    path = tmp_path / "bad.shards.json"
    cases = [
        ("not JSON", "{"),
        ("format", json.dumps({"format": "other"})),
        (
            "outside the manifest's folder",
            json.dumps(
                {
                    "format": "subic.shards",
                    "version": 1,
                    "num_blocks": 2,
                    "block_size": 4,
                    "shards": ["../x.subic"],
                }
            ),
        ),
        (
            "list of 1 to",
            json.dumps(
                {
                    "format": "subic.shards",
                    "version": 1,
                    "num_blocks": 2,
                    "block_size": 4,
                    "shards": [],
                }
            ),
        ),
    ]
    for message, text in cases:
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_manifest(path)
    with pytest.raises(ValueError, match="must end in '.shards.json'"):
        save_shards(SubicIndex(2, 4), tmp_path / "x.json", 2)


def _manifest(path, shards) -> None:
    manifest = {
        "format": "subic.shards",
        "version": 1,
        "num_blocks": 4,
        "block_size": 16,
        "shards": shards,
    }
    path.write_text(json.dumps(manifest))


def test_a_manifest_names_only_index_files_of_its_folder(tmp_path, rng):
    index = SubicIndex(4, 16)
    index.add(rng.integers(0, 16, (40, 4)))
    outside = tmp_path / "outside"
    outside.mkdir()
    tmp_path = tmp_path / "shards"
    tmp_path.mkdir()
    path = tmp_path / "codes.shards.json"
    files = save_shards(index, path, 2)
    first = os.path.basename(files[0])
    # Itself, another manifest, a name that is not an index file, a NUL:
    # refused from the names, before any file is opened or actor started.
    other = tmp_path / "other.shards.json"
    _manifest(other, [first])
    for shards, message in (
        (["codes.shards.json"], "never a manifest"),
        (["other.shards.json", first], "never a manifest"),
        ([first, "notes.txt"], "not a .subic index file"),
        (["a\0.subic"], "not a file name"),
        (["\ud800.subic"], "not a file name"),
        ([f"./{first}"], "outside the manifest's folder"),
        ([f"/etc/{first}"], "outside the manifest's folder"),
    ):
        bad = tmp_path / "bad.shards.json"
        _manifest(bad, shards)
        with pytest.raises(ValueError, match=message):
            open_index(bad)
    # On disk: a link out of the folder, a FIFO, a file that is no index,
    # a missing file; each named before any actor starts.
    os.replace(files[1], outside / "codes-1.subic")
    (tmp_path / "out.subic").symlink_to(outside / "codes-1.subic")
    os.mkfifo(tmp_path / "fifo.subic")
    (tmp_path / "text.subic").write_text("not an index")
    for name, message in (
        ("out.subic", "leads out of the manifest's folder"),
        ("fifo.subic", "not a regular file"),
        ("text.subic", "is not a SuBiC index file"),
        ("gone.subic", "1 shard files not found"),
    ):
        bad = tmp_path / "bad.shards.json"
        _manifest(bad, [first, name])
        start = time.perf_counter()
        with pytest.raises(OSError if name == "gone.subic" else ValueError) as error:
            check_shard_files(read_manifest(bad), bad)
        assert message in str(error.value) and time.perf_counter() - start < 1
        with pytest.raises(type(error.value), match=message):
            RayIndex(bad)
    # A link inside the folder is read where it leads.
    (tmp_path / "inside.subic").symlink_to(files[0])
    _manifest(tmp_path / "good.shards.json", ["inside.subic"])
    good = read_manifest(tmp_path / "good.shards.json")
    check_shard_files(good, tmp_path / "good.shards.json")


def test_a_manifest_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "x.shards.json"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(OSError, match="not a regular file"):
        read_manifest(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        open_index(fifo)
    assert time.perf_counter() - start < 1


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_rebuild_keeps_the_build_before_and_removes_older_ones(tmp_path, rng):
    index = SubicIndex(4, 16)
    index.add(rng.integers(0, 16, (90, 4)))
    path = tmp_path / "codes.shards.json"
    first = save_shards(index, path, 3)
    (tmp_path / "mine.subic").write_bytes(b"a user's own file")
    second = save_shards(index, path, 2)
    # New names for every build: the first build's files stay whole for
    # the readers that opened it.
    assert not set(first) & set(second)
    assert all(os.path.basename(f).startswith("codes-") for f in first + second)
    manifest = json.loads(path.read_text())
    assert manifest["previous"] == [os.path.basename(f) for f in first]
    assert manifest["version"] == 3 and manifest["model"] is None
    assert _files(tmp_path) == sorted(
        [*map(os.path.basename, first + second), "codes.shards.json", "mine.subic"]
    )
    shards = read_manifest(path).shards
    assert sum(len(SubicIndex.load(shard)) for shard in shards) == 90
    # A manifest written by hand may list files that are not ours: a
    # rebuild never removes them. The build before the last goes.
    manifest["shards"].append("mine.subic")
    path.write_text(json.dumps(manifest))
    third = save_shards(index, path, 1)
    assert _files(tmp_path) == sorted(
        [*map(os.path.basename, second + third), "codes.shards.json", "mine.subic"]
    )
    assert read_manifest(path).shards == tuple(third)


def test_an_interrupted_rebuild_leaves_the_manifest_whole(tmp_path, rng, monkeypatch):
    codes = rng.integers(0, 16, (90, 4))
    before, after = SubicIndex(4, 16), SubicIndex(4, 16)
    before.add(codes)
    after.add(codes[::-1])
    path = tmp_path / "codes.shards.json"
    first = save_shards(before, path, 3)
    save = SubicIndex.save
    saved = []

    def save_twice(self, file):
        if len(saved) == 2:
            # Opened now, during the rebuild: the first build, whole.
            shards = [SubicIndex.load(shard) for shard in read_manifest(path).shards]
            assert np.array_equal(
                np.concatenate([s.get_codes() for s in shards]), codes
            )
            raise KeyboardInterrupt
        saved.append(file)
        save(self, file)

    monkeypatch.setattr(SubicIndex, "save", save_twice)
    with pytest.raises(KeyboardInterrupt):
        save_shards(after, path, 3)
    monkeypatch.setattr(SubicIndex, "save", save)
    assert len(saved) == 2 and not set(saved) & set(first)
    # A reader of the first build's manifest opens its files after the
    # next build has replaced the manifest: they are all there.
    opened = read_manifest(path).shards
    last = save_shards(after, path, 3)
    shards = [SubicIndex.load(shard) for shard in opened]
    assert np.array_equal(np.concatenate([s.get_codes() for s in shards]), codes)
    shards = [SubicIndex.load(shard) for shard in read_manifest(path).shards]
    assert np.array_equal(np.concatenate([s.get_codes() for s in shards]), codes[::-1])
    # The interrupted build's files are gone; the first build's stay.
    assert _files(tmp_path) == sorted(
        [*map(os.path.basename, first + last), "codes.shards.json"]
    )


def test_a_restarted_shard_reopens_its_own_build_or_fails_naming_it(
    cluster, tmp_path, rng
):
    """An index opened before two rebuilds: after one, a killed shard comes
    back with its own file (same answers); after two, its file is gone and
    it says so, never loading the new build; the server's health says
    degraded. (A file replaced by another model's codes is refused by the
    same check on every start: `test_shards_of_two_models_are_refused...`.)"""
    path = tmp_path / "codes.shards.json"
    first, second = SubicIndex(8, 64), SubicIndex(8, 64)
    first.add(_trained_like(rng, 3000))
    second.add(_trained_like(rng, 3000))
    save_shards(first, path, 3)
    remote = RayIndex(path)
    queries = relu_queries(rng, 4, 8, 64)
    expected = first.search(queries, 10)

    save_shards(second, path, 3)
    ray.kill(remote.actors[1], no_restart=False)
    time.sleep(1.0)
    for _ in range(3):  # before and after its restart: the first build
        got = remote.search(queries, 10)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    save_shards(second, path, 3)  # the first build's files are removed
    ray.kill(remote.actors[1], no_restart=False)
    deadline = time.perf_counter() + 60  # (a kill takes effect in its time)
    with pytest.raises(ShardUnavailableError) as error:
        while time.perf_counter() < deadline:
            got = remote.search(queries, 10)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected))
            time.sleep(0.2)
    message = str(error.value)
    assert message.startswith(f"shard {remote._manifest.shards[1]!r} is unavailable")
    assert "degraded until it is opened again" in message and "\n" not in message
    assert list(remote.unavailable) == [remote._manifest.shards[1]]
    from subic_keras.serving.server import SearchService

    health = SearchService.health(_Served(remote))
    assert health["status"] == "degraded" and health["items"] is None
    assert list(health["shards"]) == [remote._manifest.shards[1]]

    reopened = RayIndex(path)  # the newest build, whole
    want = second.search(queries, 10)
    assert all(np.array_equal(a, b) for a, b in zip(reopened.search(queries, 10), want))


def test_a_shard_copied_over_another_is_refused_even_after_a_restart(
    cluster, tmp_path, rng
):
    """Each file of a build records which shard it is: a copy of shard 0 in
    shard 1's place (its ids listed twice) or a file of another build is
    refused on opening and on an actor's restart, never served."""
    path = tmp_path / "codes.shards.json"
    index = SubicIndex(4, 16)
    index.add(rng.integers(0, 16, (90, 4)))
    files = save_shards(index, path, 3)
    build = read_manifest(path).build
    assert [SubicIndex.load(f).shard_label for f in files] == [
        (build, n) for n in range(3)
    ]
    original = open(files[1], "rb").read()
    shutil.copyfile(files[0], files[1])
    with pytest.raises(ValueError) as error:
        RayIndex(path)
    assert (
        f"its file is shard 0 of build {build}, not shard 1 of its manifest's "
        f"build {build}: the file was replaced; build the index again"
    ) in str(error.value)
    open(files[1], "wb").write(original)
    remote = RayIndex(path)
    queries = relu_queries(rng, 3, 4, 16)
    # Its own writes keep the label: an add to the last shard, a remove.
    remote.add(rng.integers(0, 16, (5, 4)))
    assert remote.remove(np.arange(5)) == 5
    assert SubicIndex.load(files[2]).shard_label == (build, 2)
    shutil.copyfile(files[0], files[1])
    ray.kill(remote.actors[1], no_restart=False)
    deadline = time.perf_counter() + 60  # (a kill takes effect in its time)
    with pytest.raises(ShardUnavailableError) as error:
        while time.perf_counter() < deadline:
            _, ids = remote.search(queries, 90)  # (before the kill takes effect)
            assert all(len(np.unique(row)) == len(row) for row in ids)  # no id twice
            time.sleep(0.2)
    assert "shard 0 of build" in str(error.value)


class _Served:
    """What `SearchService.health` reads of a service."""

    reload_seconds = 60.0
    _reload = None
    _reload_error = None

    def __init__(self, index):
        self.index = index


def test_tie_groups_across_shards_merge_as_one_index(cluster, tmp_path, rng):
    """Trained-like codes, whose tie groups span every shard: the merged
    answer is one index's, ties in manifest then insertion order, with
    filters and a `k` beyond what a filter keeps."""
    codes = _trained_like(rng, 3000)
    index = SubicIndex(8, 64)
    index.add(codes)
    save_shards(index, tmp_path / "ties.shards.json", 3)
    remote = open_index(tmp_path / "ties.shards.json")
    assert not remote.written_with_looks
    queries = relu_queries(rng, 6, 8, 64)
    for k, where in [(1, None), (10, None), (60, "id >= 1000"), (400, None)]:
        got = remote.search(queries, k, where=where)
        want = index.search(queries, k, where=where)
        assert np.unique(want[0][0]).size < want[0].shape[1] or k == 1
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    few = remote.search(queries, 50, where="id >= 2990")
    assert few[1].shape == (6, 10) and (few[1] >= 2990).all()
    assert remote.search(queries, 5, where="id > 5000")[1].shape == (6, 0)


def test_the_command_line_searches_and_evaluates_a_manifest(cluster, tmp_path, capsys):
    """`subic search` and `subic evaluate --index` on codes shards answer as
    on the one file they were split from."""
    from subic_keras.cli import main

    model = str(tmp_path / "run" / "best.keras")
    train = ["train", "--pretrain-epochs", "1", "--epochs", "1", "--bits", "16",
             "--block-size", "16", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(train) == 0
    one, manifest = str(tmp_path / "db.subic"), str(tmp_path / "db.shards.json")
    build = ["index", "build", model, "--dataset", "digits", "--output", one]
    assert main(build) == 0
    save_shards(SubicIndex.load(one), manifest, 3)
    from subic_keras.data.datasets import load_images

    np.save(tmp_path / "queries.npy", load_images("digits")[1][0][:3])
    found = []
    for index in (one, manifest):
        capsys.readouterr()
        search = ["search", model, index, str(tmp_path / "queries.npy"), "-k", "5"]
        assert main([*search, "--json"]) == 0
        evaluate = ["evaluate", model, "--dataset", "digits", "--protocol", "dsh"]
        output = str(tmp_path / f"{os.path.basename(index)}.json")
        assert main([*evaluate, "--index", index, "--output", output]) == 0
        with open(output) as handle:
            found.append(
                (capsys.readouterr().out.splitlines()[:15], json.load(handle)["map"])
            )
    assert found[0] == found[1]


def test_the_cluster_s_messages_stay_off_a_command_s_output(cluster, capsys):
    """Ray's driver prints the raylet's warnings to stdout whatever
    `log_to_driver` says ("4 PYTHON worker processes have been started on
    node ..."); once joined, they go to stderr, off the `--json` lines."""
    import ray

    ray_module()
    ray_module()  # wrapped once
    message = {"lines": ["4 PYTHON worker processes"], "pid": "raylet", "is_err": False}
    ray._private.worker.print_to_stdstream(message, ignore_prefix=False)
    out, err = capsys.readouterr()
    assert out == "" and "4 PYTHON worker processes" in err


def test_a_shard_that_fails_to_load_is_named_in_one_line(cluster, tmp_path, rng):
    index = SubicIndex(4, 16)
    index.add(rng.integers(0, 16, (60, 4)))
    files = save_shards(index, tmp_path / "codes.shards.json", 2)
    data = bytearray(open(files[1], "rb").read())
    data[-1] ^= 0xFF  # its checksum fails: the actor cannot load it
    open(files[1], "wb").write(bytes(data))
    with pytest.raises(ValueError) as error:
        RayIndex(tmp_path / "codes.shards.json")
    message = str(error.value)
    assert message.startswith(f"shard {files[1]!r} cannot be loaded: ")
    assert "\n" not in message and "checksum" in message, message


_JOIN = """
import sys, time
from subic_keras.search.ray_cluster import ray_module
start = time.perf_counter()
try:
    ray_module(sys.argv[1] if len(sys.argv) > 1 else None)
except ConnectionError as error:
    print(f"{time.perf_counter() - start:.1f}", error)
"""


def test_a_cluster_that_does_not_answer_is_one_line_at_once(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(dead)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for extra, argv, named in (
        ({"RAY_TMPDIR": str(tmp_path)}, [], "the cluster file"),
        ({"RAY_ADDRESS": dead}, [], "RAY_ADDRESS"),
        ({}, [dead], f"--ray-address {dead}"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", _JOIN, *argv],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=60,
        )
        seconds, _, message = done.stdout.strip().partition(" ")
        assert float(seconds) < 10, done
        assert message.startswith(f"the Ray cluster at {dead} ({named}")
        assert "give --ray-address local to start one" in message


def test_shards_of_two_models_are_refused_naming_the_shard(cluster, tmp_path, rng):
    index = SubicIndex(4, 16)
    index.add(rng.integers(0, 16, (60, 4)))
    index.model = {"digest": "a" * 64, "file": "one.keras", "path": "/m/one.keras"}
    files = save_shards(index, tmp_path / "codes.shards.json", 3)
    path = tmp_path / "codes.shards.json"
    versions = {2: json.loads(path.read_text())}  # (version 3: also labelled)
    versions[1] = {**versions[2], "version": 1}
    for key in ("build", "model", "previous"):
        del versions[1][key]
    cases = (
        ({"digest": "b" * 64, "file": "two.keras"}, f"two.keras (digest {'b' * 64})"),
        (None, "no recorded model"),
    )
    for (model, named), version in ((cases[0], 2), (cases[0], 1), (cases[1], 1)):
        shard = SubicIndex.load(files[2])
        shard.model = model
        shard.save(files[2])
        path.write_text(json.dumps(versions[version]))
        with pytest.raises(ValueError) as error:
            RayIndex(tmp_path / "codes.shards.json")
        if version == 2:  # the manifest records its model: the shard says
            assert str(error.value).startswith(
                f"shard {files[2]!r} cannot be loaded: ValueError: its codes are "
                f"of {'no recorded model' if model is None else 'model ' + 'b' * 64}"
                f", its manifest's build {versions[2]['build']} of model {'a' * 64}"
            ), str(error.value)
            continue
        assert str(error.value) == (
            f"shard {files[2]!r} holds codes of {named}, the first shard "
            f"{files[0]!r} codes of /m/one.keras (digest {'a' * 64}): a manifest "
            "lists shards of one model"
        )
