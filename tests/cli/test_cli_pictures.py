"""`subic index build/add/remove` on a folder of pictures, and `subic search`
answering with paths."""

import json
import os
import struct
import time

import numpy as np
import pytest
from command_line import one_line_error as _error
from served import picture_folder, save_model

from subic_keras.cli import main
from subic_keras.data import images
from subic_keras.instance import copies
from subic_keras.search import SubicIndex
from subic_keras.search import open as search_open
from subic_keras.search.image_index import ImageIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_build_indexes_every_picture_and_lists_the_rest(model, folder, capsys):
    root, paths = folder
    output = root.parent / "photos.subic"
    assert main(["index", "build", model, str(root), "--output", str(output)]) == 0
    out, err = capsys.readouterr()
    assert f"indexed 24 pictures of {root}; skipped 4 files (listed" in out
    for name, reason in [
        ("notes.txt", "not an image"),
        ("c/broken.png", "image file is truncated"),
        ("empty.jpg", "not an image"),
        ("a/link.png", "link out of the folder"),
    ]:
        assert f"skipped {name}: {reason}" in err, err
    index = ImageIndex.load(output)
    assert sorted(index.get_paths()) == sorted(paths)
    assert index.root == str(root) and index.image_shape == (32, 32, 3)


def test_search_answers_with_paths_the_query_first(model, folder, capsys):
    root, paths = folder
    output = str(root.parent / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    query = str(root / paths[5])
    capsys.readouterr()
    assert main(["search", model, output, query, "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == query and len(lines) == 4
    rank, score, path, *note = lines[1].split()
    assert (rank, path, " ".join(note)) == ("1", paths[5], "(the query itself)")
    assert main(["search", model, output, query, "-k", "3", "--json"]) == 0
    matches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["rank"] for m in matches] == [1, 2, 3]
    assert matches[0]["path"] == paths[5] and matches[0]["exact"]
    assert matches[0]["score"] == pytest.approx(float(score), abs=1e-4)
    assert set(matches[0]) == {
        "query", "rank", "score", "id", "path", "class", "added", "attributes",
        "exact", "copy",
    }  # fmt: skip
    # The same rows as the Python API's: one function builds both, and one
    # marks copies and rows listed above better scores.
    index, subic = search_open(output), load_subic(model)
    pixels = images.read_image(query, retrieval.input_shape(subic))
    queries = subic.query(pixels[None])
    instance = retrieval.instance_encoder(index)  # kept beside the class code
    answers = index.answer(
        queries,
        3,
        fingerprints=[images.fingerprint(pixels)],
        instance_queries=instance.query(instance.own_pictures(pixels[None])),
    )
    rows = copies.mark(answers, queries, subic.block_size, None, marked=True)[0]
    for row, match in zip(rows, matches):
        assert {**row, "score": pytest.approx(row["score"], abs=1e-4)} == {
            key: value for key, value in match.items() if key != "query"
        }


def test_a_folder_in_milvus_answers_as_its_index_file(model, folder, tmp_path, capsys):
    """A folder indexed into a Milvus collection (both codes, the shipped
    instance code's beside the class code's) answers `subic search` as an
    index file of it does: each query picture first, copies marked, the
    same ranking, filters and groups of copies; `index add` and `index
    remove` change it in place."""
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    from PIL import Image

    root, paths = folder
    file, uri = str(tmp_path / "photos.subic"), str(tmp_path / "photos.db")
    collection = ["--collection", "photos"]
    assert main(["index", "build", model, str(root), "--output", file]) == 0
    capsys.readouterr()
    assert main(["index", "build", model, str(root), "--output", uri, *collection]) == 0
    out = capsys.readouterr().out
    assert f"indexed 24 pictures of {root}; skipped 4 files" in out
    assert "24 pictures in collection 'photos' at " in out
    # The copy rules chosen on the folder, kept in the collection's record.
    assert out.splitlines()[-1].startswith("copies: "), out
    Image.open(root / paths[2]).resize((40, 40)).save(tmp_path / "copy.jpg", quality=90)
    queries = [str(root / path) for path in paths[:4]] + [str(tmp_path / "copy.jpg")]

    def answers(index, *options):
        capsys.readouterr()
        argv = ["search", model, index, *queries, "-k", "24", "--json", *options]
        assert main(argv) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    def same(options=()):
        want = answers(file, *options)
        got = answers(uri, *collection, *options)
        keys = ("query", "rank", "path", "class", "exact", "copy")
        assert [[row[k] for k in keys] for row in got] == [
            [row[k] for k in keys] for row in want
        ], options
        np.testing.assert_allclose(
            [row["score"] for row in got], [row["score"] for row in want], rtol=1e-5
        )
        return got

    rows = same()
    firsts = [row for row in rows if row["rank"] == 1]
    assert [row["path"] for row in firsts[:4]] == paths[:4]
    assert all(row["exact"] for row in firsts[:4]) and not firsts[4]["exact"]
    same(["--under", "b"])
    same(["--where", f"class == 'c' or path == {paths[1]!r}"])
    # Searched by the instance codes alone, with the code that ships.
    found = []
    for index in (file, uri):
        capsys.readouterr()
        argv = ["search", "instance", index, *queries, "-k", "5", "--json"]
        assert main([*argv, *collection]) == 0
        rows = map(json.loads, capsys.readouterr().out.splitlines())
        found.append([(r["path"], r["exact"], r["copy"]) for r in rows])
    assert found[0] == found[1] and len(found[0]) == 25
    capsys.readouterr()
    assert main(["duplicates", file]) == 0
    want = capsys.readouterr().out
    assert main(["duplicates", uri, *collection]) == 0
    assert capsys.readouterr().out == want
    # Changed in place: a new picture added, two removed.
    (root / "c" / "new.png").write_bytes((root / paths[0]).read_bytes())
    assert main(["index", "add", model, uri, *collection]) == 0
    assert "1 picture of" in capsys.readouterr().out
    assert main(["index", "remove", uri, paths[3], "c/new.png", *collection]) == 0
    assert (
        "removed 2 pictures; 23 left in collection 'photos'" in capsys.readouterr().out
    )
    index = search_open(uri, collection="photos")
    assert sorted(index.get_paths()) == sorted(p for p in paths if p != paths[3])
    assert index.instance_model["file"] == "instance"
    index.close()
    # Another folder's pictures are refused in one line.
    other = tmp_path / "other"
    picture_folder(other, n=3)
    err, _ = _error(
        capsys, "index", "build", model, other, "--output", uri, *collection
    )
    assert f"collection 'photos' holds pictures of {root}" in err
    # A dataset split into a folder's collection, or a folder into one of
    # codes alone, is refused before anything is encoded.
    digits = ["index", "build", model, "--dataset", "digits", "--split", "test"]
    err, seconds = _error(capsys, *digits, "--output", uri, *collection)
    assert "collection 'photos' at" in err and "holds a folder's pictures" in err
    assert seconds < 10, seconds
    from subic_keras.search.milvus import MilvusIndex

    MilvusIndex(uri, "codes", 4, 16).close()
    into_codes = ["--output", uri, "--collection", "codes"]
    err, _ = _error(capsys, "index", "build", model, root, *into_codes)
    assert "holds codes of a dataset split, without paths" in err
    (root / "c" / "new.png").unlink()


def test_search_within_a_folder_or_a_filter(model, folder, capsys):
    root, paths = folder
    output = str(root.parent / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    query = str(root / paths[5])

    def found(*options) -> list[str]:
        capsys.readouterr()
        assert (
            main(["search", model, output, query, "-k", "30", "--json", *options]) == 0
        )
        return [
            json.loads(line)["path"] for line in capsys.readouterr().out.splitlines()
        ]

    everything = found()
    assert len(everything) == 24
    # The exact k best of the kept pictures: the unfiltered order, filtered.
    under_b = found("--under", "b/")
    assert under_b == [p for p in everything if p.startswith("b/")] and under_b
    assert found("--where", "class == 'b'") == under_b
    both = found("--where", f"not path == '{under_b[0]}'", "--under", "b")
    assert both == under_b[1:]
    assert found("--under", "b", "-k", "2") == under_b[:2]
    # A filter that keeps no picture says so on stderr (stdout stays JSON)
    # and exits with 1, as grep does.
    capsys.readouterr()
    none = ["--where", "class == 'nothing'", "--under", "b"]
    assert main(["search", model, output, query, "--json", *none]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"subic search: no item of {output} passes --where and --under: no match\n"
    )
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit:
        main(["search", model, output, query, "--where", "colour == 'red'"])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1, err
    assert "unknown field 'colour'" in err and time.perf_counter() - start < 1
    # The same picture as a uint8 .npy array is recognised too.
    from subic_keras.data.images import read_image

    np.save(root.parent / "q.npy", read_image(root / paths[6], (32, 32, 3)))
    assert main(["search", model, output, str(root.parent / "q.npy"), "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["path"] == paths[6] and first["exact"]


def test_add_and_remove_keep_ids_and_paths_consistent(model, folder, capsys):
    root, paths = folder
    output = str(root.parent / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    before = ImageIndex.load(output)
    ids_before = dict(zip(before.get_paths(), before.get_ids().tolist()))
    new = picture_folder(root / "new", n=6, seed=9)
    capsys.readouterr()
    assert main(["index", "add", model, output]) == 0
    out = capsys.readouterr().out
    assert "indexed 6 pictures" in out and "24 already indexed" in out
    after = ImageIndex.load(output)
    assert len(after) == 30
    # Old pictures keep their ids; new ones get new ids.
    assert all(
        ids_before[p] == i for p, i in zip(after.get_paths()[:24], after.get_ids())
    )
    assert after.paths(after.get_ids()[24:]) == sorted(f"new/{p}" for p in new)

    os.remove(root / "new" / new[0])
    assert main(["index", "remove", output, paths[0], "--missing"]) == 0
    assert "removed 2 pictures; 28 left" in capsys.readouterr().out
    pruned = ImageIndex.load(output)
    assert paths[0] not in pruned and f"new/{new[0]}" not in pruned
    for item, path in zip(pruned.get_ids(), pruned.get_paths()):
        assert after.paths([item]) == [path]  # an id never changes its picture
    # Searching still finds each picture first.
    capsys.readouterr()
    main(["search", model, output, str(root / "new" / new[3]), "-k", "1", "--json"])
    assert json.loads(capsys.readouterr().out)["path"] == f"new/{new[3]}"


def test_an_interrupted_build_leaves_the_previous_index(model, folder, monkeypatch):
    import subic_keras.data.images

    root, _ = folder
    output = root.parent / "photos.subic"
    main(["index", "build", model, str(root), "--output", str(output)])
    previous = output.read_bytes()
    picture_folder(root / "more", n=300, seed=2)
    real = subic_keras.data.images.image_batches

    def interrupted(*args, **kwargs):
        batches = real(*args, **kwargs)
        yield next(batches)
        raise KeyboardInterrupt

    monkeypatch.setattr(subic_keras.data.images, "image_batches", interrupted)
    with pytest.raises(SystemExit) as stop:
        main(["index", "build", model, str(root), "--output", str(output)])
    assert stop.value.code == 130
    assert output.read_bytes() == previous
    assert sorted(os.listdir(root.parent)) == ["outside.png", "photos", "photos.subic"]


def test_folder_mistakes_are_one_line(model, folder, tmp_path, capsys):
    root, _ = folder
    out = str(tmp_path / "x.subic")
    build = ["index", "build", model, root]
    err, _ = _error(capsys, *build, "--output", out, "--dataset", "cifar10")
    assert "--dataset select a dataset split; a folder of pictures" in err
    err, _ = _error(capsys, *build, "--output", out, "--protocol", "paper")
    assert "--protocol" in err
    err, _ = _error(capsys, "index", "build", model, tmp_path / "nope", "--output", out)
    assert "image folder not found" in err
    err, _ = _error(
        capsys, "index", "build", model, root / "notes.txt", "--output", out
    )
    assert "not a folder of images" in err
    err, _ = _error(capsys, *build, "--output", tmp_path / "no" / "such" / "x.subic")
    assert "the folder of the output file does not exist" in err
    err, _ = _error(capsys, *build, "--output", out, "--batch-size", "0")
    assert "--batch-size must be >= 1, received 0" in err
    # A folder of no picture is refused, and nothing is written.
    empty = tmp_path / "empty"
    empty.mkdir()
    err, _ = _error(capsys, "index", "build", model, empty, "--output", out)
    assert "no picture to index in" in err and "it holds no file" in err
    (empty / "notes.png").write_text("not a picture")
    err, _ = _error(capsys, "index", "build", model, empty, "--output", out)
    assert "none of its 1 file decoded" in err
    assert not os.path.exists(out)

    index = SubicIndex(4, 16)
    index.add(np.zeros((2, 4), int))
    index.save(tmp_path / "codes.subic")
    err, _ = _error(capsys, "index", "add", model, tmp_path / "codes.subic")
    assert "codes without image paths" in err
    err, _ = _error(capsys, "index", "remove", tmp_path / "codes.subic", "a.png")
    assert "codes without image paths" in err

    main([*map(str, build), "--output", out])
    capsys.readouterr()
    err, _ = _error(capsys, "index", "remove", out, "a/nope.png")
    assert "1 paths are not in the index, none removed: a/nope.png" in err
    err, _ = _error(capsys, "index", "remove", out)
    assert "give the paths to remove, or --missing" in err
    err, _ = _error(capsys, "index", "add", model, out, tmp_path)
    assert "the index holds pictures of" in err
    other = save_model(tmp_path / "other.keras", num_blocks=8)
    err, _ = _error(capsys, "index", "add", other, out)
    assert "holds codes of 4 blocks of 16, but the model makes 8" in err
    err, _ = _error(capsys, "search", other, out, root / "a" / "a_00000.png")
    assert "holds codes of 4 blocks of 16, but the model makes 8" in err
    err, _ = _error(capsys, "search", model, out, root / "notes.txt")
    assert "not a picture (PNG, JPEG, GIF, BMP or WebP)" in err and "notes.txt" in err


def test_serve_mistakes_are_one_line_before_anything_loads(model, tmp_path, capsys):
    err, seconds = _error(capsys, "serve", model, tmp_path / "none.subic")
    assert "index file not found" in err and seconds < 1
    err, _ = _error(capsys, "serve", model, tmp_path, "--port", "70000")
    assert "--port must be <= 65535, received 70000" in err
    for value in ("0", "inf", "nan", "1e300"):
        err, _ = _error(capsys, "serve", model, tmp_path, "--max-upload-mb", value)
        assert "--max-upload-mb must be a number of MB in [0.001, 100000]" in err
    err, _ = _error(capsys, "serve", model, tmp_path, "--max-decode-mb", "inf")
    assert "--max-decode-mb must be a number of MB in [1, 100000]" in err
    for host in ("", "  "):
        err, _ = _error(capsys, "serve", model, tmp_path, "--host", host)
        assert "--host must name an address" in err


def test_special_files_are_refused_at_once(model, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    err, seconds = _error(capsys, "search", fifo, tmp_path / "x.subic", "q.png")
    assert "model file: not a regular file" in err and seconds < 1
    err, seconds = _error(capsys, "serve", model, fifo)
    assert "not a regular file" in err and seconds < 1


def test_an_index_without_its_model_is_searched_with_a_warning(model, folder, capsys):
    root, paths = folder
    output = str(root.parent / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    index = search_open(output)
    assert index.model["file"] == "model.keras" and len(index.model["digest"]) == 64
    index.model = None  # as an index of an earlier version
    index.save(output)
    capsys.readouterr()
    assert main(["search", model, output, str(root / paths[0]), "-k", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be checked against it" in err


def test_an_index_of_an_earlier_version_with_looks_is_searched_by_its_codes(
    model, folder, capsys
):
    from earlier_files import add_looks

    root, paths = folder
    output = str(root.parent / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    query = str(root / paths[0])
    capsys.readouterr()
    assert main(["search", model, output, query, "-k", "5", "--json"]) == 0
    expected = capsys.readouterr().out
    add_looks(output)  # as versions 4 to 6 wrote it
    assert main(["search", model, output, query, "-k", "5", "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == expected
    assert err.count("\n") == 1 and "no longer uses" in err
    assert "searched by its codes alone" in err


def test_command_line_basics(model, folder, tmp_path, capsys):
    import subic_keras

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"subic {subic_keras.__version__}"
    # Alone, `subic` and `subic index` print their help (not an error).
    for argv, commands in (
        [[], "quickstart,train,train-instance,index"],
        [["index"], "build,add"],
    ):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out.startswith("usage: subic") and commands in out and not err
    # A query that is no picture: one line, before TensorFlow loads.
    root, _ = folder
    output = str(tmp_path / "photos.subic")
    main(["index", "build", model, str(root), "--output", output])
    capsys.readouterr()
    (tmp_path / "notes.png").write_text("not a picture")
    err, seconds = _error(capsys, "search", model, output, tmp_path / "notes.png")
    assert seconds < 1 and err.count("not a picture") == 1, err
    assert "(PNG, JPEG, GIF, BMP or WebP)" in err and "a .npy array" in err
    # A header past twice Pillow's limit (19,000 x 19,000): one line too.
    from benchmarks.bombs import _chunk

    header = struct.pack(">IIBBBBB", 19_000, 19_000, 8, 2, 0, 0, 0)
    (tmp_path / "huge.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"")
    )
    err, seconds = _error(capsys, "search", model, output, tmp_path / "huge.png")
    assert err.count("\n") == 1 and "image too large" in err and "huge.png" in err, err
    # Counts and their nouns agree.
    one = tmp_path / "one"
    (one / "a").mkdir(parents=True)
    (root / paths_of(root)[0]).rename(one / "a" / "x.png")
    assert (
        main(["index", "build", model, str(one), "--output", str(tmp_path / "1.subic")])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "indexed 1 picture of" in out
        and "skipped 0 files;" in out  # nothing is listed
        and "1 picture in" in out
    )


def paths_of(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.png") if p.is_file())


def test_outputs_in_missing_folders_are_refused_not_created(model, tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    build = ["index", "build", model, "--dataset", "digits"]
    err, seconds = _error(capsys, *build, "--output", missing / "x.subic")
    assert "the folder of the output file does not exist" in err and seconds < 1
    err, _ = _error(capsys, "evaluate", model, "--output", missing / "e.json")
    assert "the folder of the output file does not exist" in err
    assert not (tmp_path / "no").exists()


def test_hostile_folders_and_index_files_are_one_line_or_safe(model, tmp_path, capsys):
    """Link loops, escape sequences in names, a moved folder, forged
    counters and deep metadata: each ends in a bounded time, prints nothing
    raw, and removes nothing by mistake."""
    root = tmp_path / "photos"
    paths = picture_folder(root, n=6)
    (root / "self").symlink_to(".")
    (root / "a" / "up").symlink_to("..")
    evil = "a/\x1b[31mred\nfake.png"
    (root / evil).write_bytes((root / paths[0]).read_bytes())
    output = str(tmp_path / "photos.subic")
    start = time.perf_counter()
    assert main(["index", "build", model, str(root), "--output", output]) == 0
    assert time.perf_counter() - start < 60
    captured = capsys.readouterr()
    assert "indexed 7 pictures" in captured.out
    assert "skipped self: a folder already walked" in captured.err
    main(["search", model, output, str(root / evil), "-k", "2"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31mred\\nfake.png" in out
    # The folder moved away: --missing refuses to empty the index.
    moved = tmp_path / "moved"
    os.rename(root, moved)
    err, _ = _error(capsys, "index", "remove", output, "--missing")
    assert "the indexed folder is gone" in err and "none removed" in err
    assert len(ImageIndex.load(output)) == 7
    os.rename(moved, root)
    for name in [*paths, evil]:
        os.remove(root / name)
    err, _ = _error(capsys, "index", "remove", output, "--missing")
    assert "every one of the 7 pictures is missing" in err
    assert main(["index", "remove", output, "--missing", "--force"]) == 0
    assert len(ImageIndex.load(output)) == 0
    # Stored counters and metadata beyond what a real index holds.
    index = ImageIndex.load(output)
    index._next_id = 2**63 + 5
    index.save(output)
    err, _ = _error(capsys, "index", "add", model, output)
    assert "next_id" in err and "is not a count" in err
    deep = '{"x": ' * 100_000 + "0" + "}" * 100_000
    metadata = f'{{"format": "subic.image-index", "root": "/x", "deep": {deep}}}'
    query = tmp_path / "query.png"
    query.write_bytes(_a_picture())
    for command in (
        ["index", "add", model, output],
        ["search", model, output, str(query)],
        ["serve", model, output, "--port", "0"],  # any free port: 8000 may be busy
    ):
        _write_metadata(output, metadata)
        err, _ = _error(capsys, *command)
        assert "metadata is not valid JSON (JSON nested 100001 deep" in err


def _a_picture() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buffer, "PNG")
    return buffer.getvalue()


def _write_metadata(path: str, metadata_json: str) -> None:
    """Rewrites an empty index file with raw metadata JSON (checksum kept
    right), as a forger would."""
    import hashlib
    import struct

    data = open(path, "rb").read()
    header = bytearray(data[:40])
    (n,) = struct.unpack_from("<Q", header, 24)
    assert n == 0
    struct.pack_into("<I", header, 8, 3)  # version 3:
    struct.pack_into("<I", header, 20, 2)  # an item table, no looks
    json_bytes = metadata_json.encode()
    body = struct.pack("<Q", len(json_bytes)) + json_bytes + struct.pack("<Q", 0)
    content = header + body
    with open(path, "wb") as handle:
        handle.write(content + hashlib.sha256(content).digest())
