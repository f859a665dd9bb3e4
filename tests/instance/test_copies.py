"""`subic_keras.instance.copies`: what counts as a copy, chosen on validation; an
index of a folder built, searched and grouped by an instance code."""

import json

import numpy as np
import pytest

from subic_keras.cli import main
from subic_keras.data import images
from subic_keras.instance import copies
from subic_keras.instance import instance_code as instance
from subic_keras.search.image_index import ImageIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_encoder, load_subic


def test_least_precise_takes_the_lowest_threshold_that_keeps_precision():
    values = np.array([5.0, 4.0, 4.0, 3.0, 2.0, 1.0])
    correct = np.array([True, True, False, True, False, True])
    # At 4 (both rows of the tie count): 2 of 3; at 3: 3 of 4.
    assert copies.least_precise(values, correct, 0.75) == (3.0, 0.75, 0.75)
    assert copies.least_precise(values, correct, 1.0) == (5.0, 1.0, 0.25)
    assert copies.least_precise(values, ~correct, 0.9) is None


def test_a_margin_is_never_above_zero_and_the_best_codes_tie_at_zero():
    """The scan sums in float32: the query's best code may score a hair
    above the float64 best, and every code of the query's argmax must share
    one margin, 0 (a rule chosen among them would pick by rounding)."""
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(2, 32 * 16)).astype(np.float32)
    best = queries.reshape(2, 32, 16).max(-1)
    float32_sums = np.stack(
        [best.astype(np.float32).sum(-1), np.float32(best.sum(-1)) + 3e-5], axis=1
    )
    margins = copies.copy_margins(queries, float32_sums, 16)
    assert margins.max() == 0.0 and (margins == 0.0).all()
    assert copies.copy_margins(queries, float32_sums - 2.0, 16).max() < -1.9


def test_mark_flags_exact_copies_and_margins_over_the_rule():
    query = np.array([[0.5, 0.5, 0.0, 0.0, 1.0, -2.0, 0.0, 0.0]], np.float32)
    # The best possible score is 0.5 + 1.0 = 1.5: margins 0, -0.5 and -1.5.
    rows = [
        [
            {"score": 1.5, "exact": False},
            {"score": 1.0, "exact": False},
            {"score": 0.0, "exact": True},
        ]
    ]
    copies.mark(rows, query, 4, margin=-0.6)
    assert [row["copy"] for row in rows[0]] == [True, True, True]
    copies.mark(rows, query, 4, margin=-0.1)
    assert [row["copy"] for row in rows[0]] == [True, False, True]
    copies.mark(rows, query, 4, margin=None)  # a class code: exact only
    assert [row["copy"] for row in rows[0]] == [False, False, True]


def test_duplicate_groups_join_codes_with_enough_equal_blocks():
    codes = np.array(
        [
            [0, 1, 2, 3],
            [0, 1, 2, 0],
            [5, 5, 5, 5],
            [0, 9, 9, 3],
            [5, 5, 5, 6],
            [7, 7, 7, 7],
        ]
    )
    ids = np.arange(100, 106)
    groups = copies.duplicate_groups(codes, ids, 16, copy_blocks=3)
    assert [g.tolist() for g in groups] == [[100, 101], [102, 104]]
    # With 2 equal blocks, 103 joins 100 (blocks 0 and 3).
    groups = copies.duplicate_groups(codes, ids, 16, copy_blocks=2)
    assert [g.tolist() for g in groups] == [[100, 101, 103], [102, 104]]
    assert copies.duplicate_groups(codes, ids, 16, copy_blocks=5) == []
    with pytest.raises(ValueError, match="copy_blocks must be >= 1, received 0"):
        copies.duplicate_groups(codes, ids, 16, copy_blocks=0)


def test_duplicate_groups_match_a_brute_force_count():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 4, (300, 6))
    groups = copies.duplicate_groups(codes, np.arange(300), 4, copy_blocks=5, k=300)
    equal = (codes[:, None] == codes[None]).sum(-1) >= 5
    np.fill_diagonal(equal, False)
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(equal, directed=False)
    expected = sorted(
        (np.flatnonzero(labels == label) for label in np.unique(labels)),
        key=lambda g: (-len(g), g[0]),
    )
    expected = [g.tolist() for g in expected if len(g) > 1]
    assert [g.tolist() for g in groups] == expected and expected


def test_each_code_is_compared_with_the_others_not_itself():
    """The floor of the rules reads each code's most equal blocks with any
    other, in several searches, a repeated code's being all of them."""
    from subic_keras.search import SubicIndex

    codes = np.random.default_rng(3).integers(0, 4, (60, 5))
    codes[7] = codes[3]
    index = SubicIndex(5, 4, search_chunk_size=20)
    index.add(codes)
    rows = np.arange(60)
    found = copies._best_other(*index.search_codes(index.get_codes(rows), 2), rows)
    equal = (codes[:, None] == codes[None]).sum(-1)
    np.fill_diagonal(equal, -1)
    np.testing.assert_array_equal(found, equal.max(1))
    assert found[3] == found[7] == 5


def test_calibrate_sets_rules_that_a_save_keeps(
    small_code, pictures, tmp_path, monkeypatch
):
    code = small_code()
    instance.train_instance(code, pictures, epochs=3, batch_size=20, verbose=0)
    monkeypatch.setattr(copies, "STORED_ROWS", 50)  # 50 of the 120 drawn
    monkeypatch.setattr(copies, "_CHUNK_ENTRIES", 16 * 4 * 16)  # 16 a search
    found = copies.calibrate(code, pictures, queries=20, precision=0.5)
    assert found["queries"] == 40
    for name in ("copy_margin", "copy_blocks"):
        value = found[name]["value"]
        assert value == getattr(code, name)
        if value is not None:
            assert found[name]["precision"] >= 0.5
            assert value >= found[name]["floor"]
    code.model.copy_margin, code.model.copy_blocks = -2.5, 3
    code.save(tmp_path / "code.keras", include_optimizer=False)
    loaded = instance.InstanceSubic.load(tmp_path / "code.keras")
    assert (loaded.copy_margin, loaded.copy_blocks) == (-2.5, 3)
    np.testing.assert_array_equal(loaded.encode(pictures), code.encode(pictures))
    with pytest.raises(ValueError, match="pictures must number more than"):
        copies.calibrate(code, pictures[:40], queries=20)


def test_the_commands_refuse_an_instance_code_where_classes_are_needed(
    instance_model,
):
    with pytest.raises(ValueError, match="is an instance code .*, which finds copies"):
        load_subic(instance_model)
    assert isinstance(load_encoder(instance_model), instance.InstanceSubic)


def test_a_folder_is_indexed_searched_and_grouped_by_an_instance_code(
    instance_model, photos, tmp_path, capsys
):
    index_path = tmp_path / "photos.subic"
    argv = ["index", "build", str(instance_model), str(photos), "--output"]
    assert main([*argv, str(index_path)]) == 0
    index = ImageIndex.load(index_path)
    assert len(index) == 42 and not index.written_with_looks
    assert index.model["copy_blocks"] == 4 and index.model["query"] == "logits"
    capsys.readouterr()

    query = next(photos.glob("*/*00007.png"))
    argv = ["search", str(instance_model), str(index_path), str(query), "--json"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["exact"] and rows[0]["copy"]
    copy_row = next(row for row in rows if row["path"] == "a/copy_of_7.png")
    assert copy_row["copy"]  # the same pixels: the same code, score 1
    # A picture whose code is not the query's is not marked.
    assert all(row["copy"] == (row["score"] >= rows[0]["score"] - 1e-4) for row in rows)

    assert main(["duplicates", str(index_path), "--json"]) == 0
    out, err = capsys.readouterr()
    groups = [json.loads(line)["paths"] for line in out.splitlines()]
    planted = [sorted(g) for g in groups if any("copy_of" in p for p in g)]
    assert len(planted) == 2
    assert all(len(group) >= 2 for group in groups)
    assert "groups of copies" in err or "group of copies" in err
    assert index.duplicates() == [g for g in groups]
    # More equal blocks than the code has: refused, not 0 groups.
    for beyond in ("5", "99999999999999999999"):
        with pytest.raises(SystemExit) as stop:
            main(["duplicates", str(index_path), "--copy-blocks", beyond])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, err
        assert "copy_blocks must be at most the code's 4 blocks" in err


def test_the_count_of_equal_blocks_comes_from_the_index_or_the_user():
    record = {"query": "logits", "copy_blocks": 30}
    assert copies.recorded_copy_blocks(record, None, 64) == 30
    assert copies.recorded_copy_blocks(record, 28, 64) == 28
    # The folder's own rule comes first; none chosen there: exact copies.
    folder = {**record, "copies": {"copy_blocks": 61}}
    assert copies.recorded_copy_blocks(folder, None, 64) == 61
    none = {**record, "copies": {"copy_blocks": None}}
    assert copies.recorded_copy_blocks(none, None, 64) is None
    with pytest.raises(ValueError, match="chose no number of equal blocks"):
        copies.recorded_copy_blocks({"query": "logits"}, None, 64)
    with pytest.raises(ValueError, match="an index of a class code"):
        copies.recorded_copy_blocks({"query": "fc0"}, None, 64)
    for beyond in (65, 99999999999999999999):
        with pytest.raises(ValueError, match="at most the code's 64 blocks"):
            copies.recorded_copy_blocks(record, beyond, 64)


def test_exact_copies_are_grouped_whatever_the_rule():
    codes = np.array([[0, 1, 2], [3, 3, 3], [1, 2, 0], [0, 1, 2]])
    ids, prints = np.array([10, 11, 12, 13]), np.array([5, 6, 5, 0], np.uint64)
    # No rule: the equal fingerprints alone (0: unknown, never equal).
    groups = copies.duplicate_groups(codes, ids, 4, None, fingerprints=prints)
    assert [g.tolist() for g in groups] == [[10, 12]]
    both = copies.duplicate_groups(codes, ids, 4, 3, fingerprints=prints)
    assert [g.tolist() for g in both] == [[10, 12, 13]]


def test_duplicates_mistakes_are_one_line(photos, tmp_path, capsys):
    def error(*argv):
        with pytest.raises(SystemExit) as stop:
            main(["duplicates", *argv])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    assert "index file not found" in error(str(tmp_path / "none.subic"))
    class_index = ImageIndex(2, 4, photos)
    class_index.save(tmp_path / "class.subic")
    assert "--copy-blocks must be >= 1, received 0" in error(
        str(tmp_path / "class.subic"), "--copy-blocks", "0"
    )
    assert "copy_blocks must be given" in error(str(tmp_path / "class.subic"))
    # A manifest is refused as what it is, before Ray starts.
    manifest = tmp_path / "photos.shards.json"
    manifest.write_text("{}")
    assert "is not a valid shard manifest" in error(str(manifest))
    missing = error(str(tmp_path / "photos.db"))
    assert "there is no Milvus Lite database at that path" in missing
    with pytest.raises(ValueError, match="reads a .subic file, not"):
        ImageIndex.load(manifest)


def test_an_instance_code_is_searched_from_the_library(instance_model, photos):
    code = load_encoder(instance_model)
    index, report = retrieval.index_folder(code, photos)
    assert report.added == 42
    files = sorted(photos.glob("b/*.png"))[:3]
    pixels = np.stack([images.read_image(path, (16, 16, 3)) for path in files])
    queries = code.query(pixels)
    answers = copies.mark(
        index.answer(queries, 3), queries, code.block_size, code.copy_margin
    )
    assert all(rows[0]["copy"] for rows in answers)


def test_a_server_of_an_instance_code_marks_copies_and_names_no_class(
    instance_model, photos, tmp_path
):
    from subic_keras.serving.server import SearchService

    index_path = tmp_path / "photos.subic"
    assert (
        main(
            [
                "index",
                "build",
                str(instance_model),
                str(photos),
                "--output",
                str(index_path),
            ]
        )
        == 0
    )
    service = SearchService(str(instance_model), str(index_path))
    data = next(photos.glob("*/*00003.png")).read_bytes()
    answer = service.search_image(data, k=5)
    assert answer["predicted_class"] is None and answer["probability"] is None
    first, second = answer["results"][:2]
    assert first["exact"] and first["copy"] and second["copy"]
    assert {first["path"], second["path"]} == {
        str(next(photos.glob("*/*00003.png")).relative_to(photos)),
        "a/copy_of_3.png",
    }
    assert service.stats()["num_classes"] is None


def test_distinct_transparent_pictures_are_not_grouped(tmp_path, capsys):
    """RGBA and LA pictures are composited over white before they are
    encoded: a dark slate with flowers, a pink-purple gradient, a
    near-white plain and two half-transparent ones are five pictures, and
    the shipped code's `subic duplicates` groups none of them."""
    from PIL import Image, ImageDraw

    root = tmp_path / "walls"
    root.mkdir()
    slate = Image.new("RGBA", (640, 400), (47, 62, 70, 255))
    draw = ImageDraw.Draw(slate)
    for x in range(40, 640, 90):
        draw.ellipse((x, 150, x + 50, 200), fill=(230, 120, 160, 255))
    ramp = np.linspace(0, 1, 640)[None, :, None]
    gradient = (1 - ramp) * [236, 112, 180] + ramp * [120, 60, 200]
    gradient = np.broadcast_to(gradient, (400, 640, 3)).astype(np.uint8)
    pink = Image.fromarray(gradient).convert("RGBA")
    plain = Image.new("RGBA", (640, 400), (246, 246, 244, 255))
    veiled = pink.copy()
    veiled.putalpha(96)
    grey = Image.new("LA", (640, 400), (30, 160))
    for name, picture in [
        ("slate", slate),
        ("gradient", pink),
        ("plain", plain),
        ("veiled", veiled),
        ("grey", grey),
    ]:
        picture.save(root / f"{name}.png")
    index_path = tmp_path / "walls.subic"
    argv = ["index", "build", "instance", str(root), "--output", str(index_path)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["duplicates", str(index_path), "--json"]) == 0
    assert capsys.readouterr().out.strip() == ""
