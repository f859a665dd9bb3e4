"""`index_folder_on_ray` and `subic index build --output X.shards.json` on a
simulated Ray cluster: the codes of the single-process build, shards that a
`RayIndex` opens and `subic serve` serves as one index, and a resumed build
that encodes only what was left."""

import contextlib
import io
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from PIL import Image
from served import (
    ThreadServer,
    picture_folder,
    request,
    request_json,
    ruled_instance,
    save_model,
)
from swapping import outside_folder

from subic_keras.cli import main
from subic_keras.instance import folder_rules
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.search import SubicIndex
from subic_keras.search import open as open_index
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.manifests import read_manifest, save_shards, write_manifest
from subic_keras.search.ray_index import RayIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.ray_folders import (
    _finished_shard,
    _paths_digest,
    _read_progress,
    index_folder_on_ray,
)
from subic_keras.serving.server import SearchService

pytest.importorskip("ray", reason="the [ray] extra")

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
# One worker runs them all (the README's `--dist loadgroup`): one cluster.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def built(ray_cluster, tmp_path_factory):
    """A model; a folder of 30 pictures and two files that are not; the
    folder's index file (one process); and its 3 shards, built on Ray by a
    build interrupted after two shards (the second with a file it skipped),
    then resumed from the command line (what it printed, and the progress
    file between them)."""
    base = tmp_path_factory.mktemp("ray_folders")
    model = save_model(base / "model.keras")
    root = base / "photos"
    paths = picture_folder(root, n=30)
    (root / "notes.txt").write_text("not a picture")
    (root / "b" / "empty.jpg").write_bytes(b"")
    # Both codes, as the command line builds them (the shipped instance code,
    # with copy rules).
    ruled = ruled_instance(base / "ruled.keras")
    instance = {"instance": InstanceSubic.load(ruled), "instance_path": ruled}
    subic = load_subic(model)
    single, _ = retrieval.index_folder(subic, root, model_path=model, **instance)
    # Its copy rules chosen on the folder, as `subic index build` chooses them.
    retrieval.choose_copy_rules(single, subic, instance["instance"], batch_size=8)
    single.save(base / "photos.subic")
    manifest = base / "photos.shards.json"
    saved = []
    real_save = ImageIndex.save

    def interrupted(self, path):
        if len(saved) == 2:
            raise KeyboardInterrupt  # the third shard is never written
        saved.append(path)
        real_save(self, path)

    ImageIndex.save = interrupted
    with _NativeStderr() as native:
        try:
            with pytest.raises(KeyboardInterrupt):
                index_folder_on_ray(
                    model, root, manifest, 3, batch_size=8, instance_model=ruled
                )
        finally:
            ImageIndex.save = real_save
        progress = json.loads((base / "photos.progress.json").read_text())
        first = sum(len(ImageIndex.load(path)) for path in saved)
        out, err = io.StringIO(), io.StringIO()
        build = ["index", "build", model, str(root), "--output", str(manifest)]
        build += ["--instance-model", ruled]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # One encoder actor, where the interrupted build had the default two.
            status = main(
                [*build, "--shards", "3", "--batch-size", "8", "--encoders", "1"]
            )
    return {
        "base": base,
        "model": model,
        "ruled": ruled,
        "root": root,
        "paths": paths,
        "single": single,
        "manifest": manifest,
        "build": build,
        "interrupted": {"first": first, "progress": progress},
        "resumed": (status, out.getvalue(), err.getvalue()),
        "native_stderr": native.text,
    }


class _NativeStderr:
    """What this process writes to its standard error below Python (file
    descriptor 2: Ray's C++ core logs there), as `text` once it ends."""

    def __enter__(self):
        self.raw = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.raw.fileno(), 2)
        return self

    def __exit__(self, *_):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.raw.seek(0)
        self.text = self.raw.read().decode(errors="replace")
        self.raw.close()


def _codes_by_path(files, instance=False):
    found = {}
    for file in files:
        shard = ImageIndex.load(file)
        shard = shard.by_instance() if instance else shard
        ids = shard.get_ids()
        found.update(zip(shard.paths(ids), shard.get_codes(ids).tolist()))
    return found


def test_shards_hold_the_single_process_codes(built):
    single, manifest = built["single"], built["manifest"]
    files = _shard_files(manifest)
    build = json.loads(manifest.read_text())["build"]
    assert [os.path.basename(f) for f in files] == [
        f"photos-{build}-{s}.subic" for s in range(3)
    ]
    want = dict(zip(single.get_paths(), single.get_codes().tolist()))
    assert _codes_by_path(files) == want
    # And the instance codes beside them, of the same instance code.
    alone = single.by_instance()
    want = dict(zip(alone.get_paths(), alone.get_codes().tolist()))
    assert _codes_by_path(files, instance=True) == want
    # Every shard records the model; ids are the files' places in the folder.
    sharded = open_index(manifest)
    assert len(sharded) == 30 and sharded.model["digest"] == single.model["digest"]
    assert len(set(sharded.get_ids().tolist())) == 30


def test_a_finished_shard_is_reused_only_where_its_file_is_that_shard(built):
    files = _shard_files(built["manifest"])
    build = json.loads(built["manifest"].read_text())["build"]
    run = ["a/one.png"]
    done = {"paths": _paths_digest(run), "added": 1, "skipped": []}
    assert _finished_shard(done, run, files[1], (build, 1)) == (1, [])
    # Another shard's file in its place (or an unlabelled one): encoded again.
    assert _finished_shard(done, run, files[0], (build, 1)) is None
    assert _finished_shard(done, run, files[1], ("0123abcd", 1)) is None


def test_an_interrupted_build_resumes_from_the_command_line(built, tmp_path, capsys):
    model, root, manifest = built["model"], built["root"], built["manifest"]
    # Interrupted: two shards written and recorded, no manifest yet.
    interrupted = built["interrupted"]
    assert len(interrupted["progress"]["shards"]) == 2  # any two: batches race
    # Resumed: only the third shard encoded; the skipped files listed (one
    # at least recorded by the interrupted build: each of shards 1 and 2
    # has one), and nothing of Ray's own logging; the progress file gone.
    status, out, err = built["resumed"]
    first = interrupted["first"]
    assert status == 0
    assert (
        f"indexed {30 - first} pictures of {os.path.realpath(root)}, {first} already "
        "in finished shards; skipped 2 files; 3 shards listed in" in out
    )
    assert [line.split(":")[0] for line in err.splitlines()] == [
        "skipped b/empty.jpg",
        "skipped notes.txt",
    ]
    assert not os.path.exists(built["base"] / "photos.progress.json")
    # Nor of Ray's C++ core (an error-level line on every build, once).
    assert "core_worker" not in built["native_stderr"], built["native_stderr"]
    # Progress of another model, or another folder, is not trusted.
    progress = interrupted["progress"]
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(progress))
    digest, folder = progress["model"], progress["root"]
    resumed = (progress["build"], progress["shards"])
    assert _read_progress(str(path), digest, folder) == resumed
    assert _read_progress(str(path), "0" * 64, folder) == (None, {})
    assert _read_progress(str(path), digest, "/elsewhere") == (None, {})
    path.write_text("{not json")
    assert _read_progress(str(path), digest, folder) == (None, {})
    # The resumed build wrote its files under the interrupted build's name.
    build = json.loads(manifest.read_text())["build"]
    assert build == progress["build"]
    # Searched from the command line: paths, the query itself first.
    query = str(root / built["paths"][4])
    assert main(["search", model, str(manifest), query, "-k", "2"]) == 0
    assert "(the query itself)" in capsys.readouterr().out.splitlines()[1]
    for argv, message in [
        (["index", "build", model, "--output", str(manifest)], "give FOLDER"),
        (
            ["index", "build", model, str(root), "--output", str(tmp_path / "x.subic"),
             "--shards", "2"],
            "--shards, --encoders and --ray-address build shards",
        ),
        ([*built["build"], "--shards", "0"], "--shards must be >= 1"),
        ([*built["build"], "--encoders", "0"], "--encoders must be >= 1"),
        (
            [*built["build"], "--encoders", "9"],
            "encoders must be at most the Ray cluster's CPUs (3), received 9",
        ),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2
        assert message in err and len(err.strip().splitlines()) == 1, err


def _shard_files(manifest):
    folder = os.path.dirname(manifest)
    with open(manifest) as handle:
        shards = json.load(handle)["shards"]
    return [os.path.join(folder, shard) for shard in shards]


def test_serve_answers_from_shards_as_from_one_index(built):
    """The HTTP API and page over a manifest of picture shards: the same
    answers (paths, scores, exact copies, filters) as over one index file
    of the folder."""
    root, paths, model = built["root"], built["paths"], built["model"]
    answers = []
    for index_file in (built["manifest"], built["base"] / "photos.subic"):
        service = SearchService(model, str(index_file))
        with ThreadServer(service) as port:
            found = []
            for path, where in [(paths[0], None), (paths[7], "path under 'b'")]:
                query = "/search?k=12" + (
                    "" if where is None else "&where=" + where.replace(" ", "%20")
                )
                status, answer = request_json(
                    port, "POST", query, (root / path).read_bytes(),
                    {"Content-Type": "image/png"},
                )  # fmt: skip
                assert status == 200, answer
                found.append(
                    [
                        (r["path"], r["score"], r["exact"], r["copy"])
                        for r in answer["results"]
                    ]
                )
            # A copy of picture 3, a little brighter: found first, marked as
            # the folder's rules say (on its 30 noise pictures, none reached
            # 99 %: exact copies alone are marked).
            copy = io.BytesIO()
            pixels = np.asarray(Image.open(root / paths[3]), np.int16) + 3
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(copy, "PNG")
            status, copied = request_json(
                port, "POST", "/search?k=5", copy.getvalue(),
                {"Content-Type": "image/png"},
            )  # fmt: skip
            found.append([(r["path"], r["copy"]) for r in copied["results"]])
            status, stats = request_json(port, "GET", "/stats")
            found.append((stats["items"], stats["instance_codes"], stats["folders"]))
            first_id = answer["results"][0]["id"]
            status, _, data = request(port, "GET", f"/items/{first_id}")
            assert status == 200 and data == (root / paths[7]).read_bytes()
            status, _, page = request(port, "GET", "/")
            assert status == 200 and b"<html" in page.lower()
            answers.append(found)
    sharded, one = answers
    assert sharded == one
    assert sharded[0][0] == (paths[0], one[0][0][1], True, True)  # the query itself
    assert all(path.startswith("b/") for path, *_ in sharded[1])
    assert sharded[2][0] == (paths[3], False)  # the copy's original, first
    assert sharded[3][1] is True  # instance codes


def test_picture_shards_refuse_what_one_index_refuses(built, tmp_path, capsys):
    model = built["model"]
    files = [shutil.copy(file, tmp_path) for file in _shard_files(built["manifest"])]
    manifest = tmp_path / "photos.shards.json"
    digest = ImageIndex.load(files[0]).model["digest"]
    write_manifest(manifest, 4, 16, files, "0123abcd", digest)
    sharded = open_index(manifest)
    with pytest.raises(ValueError, match="hold pictures of a folder"):
        sharded.add(np.zeros((1, 4), int))
    gone = sharded.get_ids()[[0, -1]]  # one in the first shard, one in the last
    assert sharded.remove(gone) == 2 and len(open_index(manifest)) == 28
    # Shards of two folders, or of pictures and codes, are not one index.
    other = tmp_path / "other"
    picture_folder(other, n=6)
    single, _ = retrieval.index_folder(load_subic(model), other, model_path=model)
    single.save(tmp_path / "other.subic")
    codes = SubicIndex(4, 16)
    codes.add(np.zeros((3, 4), int), ids=[900, 901, 902])
    codes.save(tmp_path / "codes.subic")
    for second in ("other.subic", "codes.subic"):
        mixed = tmp_path / "mixed.shards.json"
        # (Version 1, which records no model: the shards' own fields say.)
        names = [os.path.basename(files[0]), second]
        mixed.write_text(
            json.dumps(
                {"format": "subic.shards", "version": 1, "num_blocks": 4,
                 "block_size": 16, "shards": names}
            )
        )  # fmt: skip
        with pytest.raises(ValueError, match="differ in root"):
            RayIndex(mixed)
    # More encoders than CPUs would wait for ever: refused.
    with pytest.raises(ValueError, match=r"encoders must be at most .* \(3\)"):
        index_folder_on_ray(
            model, built["root"], tmp_path / "x.shards.json", 2, encoders=4
        )
    # A manifest of codes is searched, not served: one line, exit 2.
    save_shards(codes, tmp_path / "codes.shards.json", 2)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["serve", model, str(tmp_path / "codes.shards.json"), "--port", "0"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "lists shards of codes without image paths" in err
    assert len(err.strip().splitlines()) == 1


def test_shards_are_searched_by_their_instance_codes_as_one_index(built, capsys):
    """`subic search instance MANIFEST` (`RayIndex.by_instance`) answers as
    the one file's instance codes do, and the view is for reading."""
    single, manifest = built["single"], built["manifest"]
    queries = [str(built["root"] / built["paths"][i]) for i in (0, 7, 19)]
    answers = []
    for index in (str(built["base"] / "photos.subic"), str(manifest)):
        capsys.readouterr()
        argv = ["search", built["ruled"], index, *queries, "-k", "8", "--json"]
        assert main(argv) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        answers.append([(r["query"], r["path"], r["score"], r["copy"]) for r in rows])
    assert answers[0] == answers[1] and len(answers[0]) == 24
    assert [a[1] for a in answers[1][::8]] == [built["paths"][i] for i in (0, 7, 19)]
    sharded = open_index(manifest)
    view = sharded.by_instance()
    alone = single.by_instance()
    assert (view.num_blocks, view.block_size) == (alone.num_blocks, alone.block_size)
    assert view.model["digest"] == alone.model["digest"] and not view.instance_model
    ids = view.get_ids()[[2, 11, 25]]  # the shards' ids: matched by path
    paths = view.paths(ids)
    np.testing.assert_array_equal(
        view.get_codes(ids), alone.get_codes(alone.ids(paths))
    )
    with pytest.raises(ValueError, match="instance codes is for reading"):
        view.remove(ids[:1])
    assert len(sharded) == 30  # the view removed nothing
    # Served by the instance code alone, as the one file is.
    picture = (built["root"] / built["paths"][7]).read_bytes()
    served = []
    for index in (str(built["base"] / "photos.subic"), str(manifest)):
        service = SearchService(built["ruled"], index)
        rows = service.search_image(picture, 5)["results"]
        served.append([(r["path"], r["score"], r["exact"]) for r in rows])
    assert served[0] == served[1] and served[1][0][0] == built["paths"][7]


def test_shards_list_the_copies_one_index_lists(built, capsys):
    """`subic duplicates MANIFEST` (`RayIndex.duplicates`: each shard scans
    its own instance codes for every picture's) groups as the one file."""
    single, manifest = built["single"], str(built["manifest"])
    # Noise pictures are no copies of each other: fewer equal blocks than the
    # recorded count make groups to compare.
    alone = single.by_instance()
    counts = range(alone.num_blocks, 0, -1)
    blocks = next(b for b in counts if len(single.duplicates(b)) >= 2)
    want = single.duplicates(blocks)
    assert 0 < sum(map(len, want)) < 30
    sharded = open_index(manifest)
    assert sharded.duplicates(blocks) == want
    assert sharded.by_instance().duplicates(blocks) == want
    assert sharded.duplicates() == single.duplicates()
    capsys.readouterr()
    argv = ["duplicates", manifest, "--copy-blocks", str(blocks), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["paths"] for line in out.splitlines()] == want
    assert f"among 30 pictures of {manifest}" in err


def test_a_build_records_in_every_shard_the_copy_rules_one_index_chooses(built):
    """The rules are chosen on the whole folder once (its own altered
    copies, as `index build` of one file chooses them), said in one line,
    and kept by each shard, so the shards mark copies as the one file does."""
    rules = ImageIndex.load(built["base"] / "photos.subic").copy_record["copies"]
    assert rules["pictures"] == 30 and rules["num_blocks"] == 64
    status, out, _ = built["resumed"]
    assert status == 0 and folder_rules.rules_line(rules) in out.splitlines()
    for shard in read_manifest(built["manifest"]).shards:
        assert ImageIndex.load(shard).copy_record["copies"] == rules
    sharded = open_index(built["manifest"])
    assert sharded.instance_model["copies"] == rules


def test_a_planted_progress_file_or_manifest_is_refused_before_any_work(tmp_path):
    # A link (to a file outside, or to nowhere) or a FIFO where the build
    # writes its manifest or progress file: refused before the model is
    # read or Ray started, and nothing is written through.
    outside = outside_folder(tmp_path)
    root = tmp_path / "photos"
    root.mkdir()
    manifest = tmp_path / "photos.shards.json"
    progress = tmp_path / "photos.progress.json"
    for planted, make, error in (
        (progress, lambda p: p.symlink_to(outside / "victim"), FileExistsError),
        (progress, lambda p: p.symlink_to(outside / "new"), FileExistsError),
        (progress, os.mkfifo, ValueError),
        (manifest, lambda p: p.symlink_to(outside / "victim"), FileExistsError),
    ):
        make(planted)
        with pytest.raises(error, match="link|not a regular file"):
            index_folder_on_ray("missing.keras", root, manifest, 2)
        planted.unlink()
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_text() == "the user's"
