"""A folder's index by a class code and the instance code beside it: copies
listed first, ties kept in insertion order without one."""

import json

import numpy as np
import pytest
from command_line import one_line_error as _error
from served import COPY_MARGIN, ruled_instance

from subic_keras.cli import main
from subic_keras.data import images
from subic_keras.instance.instance_code import pretrained
from subic_keras.models.subic import FC0
from subic_keras.search.image_index import ImageIndex

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_ties_stay_in_insertion_order_without_an_instance_code(model, tmp_path, capsys):
    # One picture faded into noise, ever more: the untrained model gives
    # them few codes (tie groups), each listed in the order indexed.
    from PIL import Image

    rng = np.random.default_rng(3)
    base = rng.integers(0, 256, (32, 32, 3)).astype(np.float64)
    root = tmp_path / "faded"
    (root / "a").mkdir(parents=True)
    for i, t in enumerate(np.linspace(0.05, 0.9, 30)[::-1]):
        noise = rng.integers(0, 256, (32, 32, 3))
        picture = (base * (1 - t) + noise * t).astype(np.uint8)
        Image.fromarray(picture).save(root / "a" / f"img_{i:02d}.png")
    output = str(tmp_path / "faded.subic")
    argv = ["index", "build", model, str(root), "--output", output]
    assert main([*argv, "--instance-model", "none"]) == 0
    query = tmp_path / "query.png"
    Image.fromarray(base.astype(np.uint8)).save(query)
    capsys.readouterr()
    assert main(["search", model, output, str(query), "-k", "30", "--json"]) == 0
    matches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not any(match["copy"] for match in matches)
    groups: dict[float, list[str]] = {}
    for match in matches:
        groups.setdefault(match["score"], []).append(match["path"])
    tied = [paths for paths in groups.values() if len(paths) > 2]
    assert tied, groups
    assert all(paths == sorted(paths) for paths in tied)


def test_a_class_index_keeps_the_instance_code_and_lists_copies_first(
    model, shared_data_dir, tmp_path, capsys
):
    from PIL import Image

    from subic_keras.data.datasets import load_cifar10

    (_, _), (x_test, y_test) = load_cifar10(shared_data_dir)
    root = tmp_path / "photos"
    paths = images.write_image_folder(x_test[:60], y_test[:60] % 3, root, "abc")
    output = str(tmp_path / "photos.subic")
    assert main(["index", "build", model, str(root), "--output", output]) == 0
    index = ImageIndex.load(output)
    assert index.instance.num_blocks == 64
    assert index.instance_model["file"] == "instance"
    # The shipped code with its rules, as a file of its own.
    ruled = ruled_instance(tmp_path / "ruled.keras")
    output = str(tmp_path / "ruled.subic")
    argv = ["index", "build", model, str(root), "--output", output]
    assert main([*argv, "--instance-model", ruled]) == 0
    # Copies: each picture twice as large, recompressed (JPEG 90).
    copies_of = [3, 11, 27, 40, 52]
    for number in copies_of:
        picture = Image.open(root / paths[number]).resize((64, 64), Image.BICUBIC)
        picture.save(tmp_path / f"copy_{number}.jpg", quality=90)
    queries = [str(tmp_path / f"copy_{number}.jpg") for number in copies_of]
    capsys.readouterr()
    assert main(["search", model, output, *queries, "-k", "60", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # Each original comes first where the instance code's copy rule (99 %
    # precise on validation) marks it; else the class ranking stands (of the
    # untrained, randomly drawn class model), the original first among
    # pictures of its class score, by instance score.
    marked = 0
    for query, number in zip(queries, copies_of):
        mine = [row for row in rows if row["query"] == query]
        first = mine[0]
        original = next(row for row in mine if row["path"] == paths[number])
        if first["copy"]:
            marked += 1
            assert first["path"] == paths[number], mine[:3]
        else:
            assert first["score"] == max(row["score"] for row in mine), mine[:3]
            if original["score"] == first["score"]:
                assert first["path"] == paths[number], mine[:3]
        assert not any(row["copy"] for row in mine[1:]), mine[:3]
    assert marked >= 3, rows
    # The same index searched by its instance codes alone.
    assert main(["search", ruled, output, *queries, "-k", "1", "--json"]) == 0
    alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["path"] for row in alone] == [paths[n] for n in copies_of]
    # New pictures get both codes; another instance code is refused.
    extra = root / "d"
    extra.mkdir()
    (extra / "new.png").write_bytes((root / paths[0]).read_bytes())
    assert main(["index", "add", model, output]) == 0
    index = ImageIndex.load(output)
    assert len(index.instance.codes) == len(index) == 61
    np.testing.assert_array_equal(
        index.instance.codes.get_codes(index.ids(["d/new.png"])),
        index.instance.codes.get_codes(index.ids([paths[0]])),
    )
    other = str(tmp_path / "other.keras")
    code = pretrained()
    bias = code.model.get_layer(FC0).bias
    bias.assign(bias + 1.0)
    code.save(other)
    error, _ = _error(capsys, "search", other, output, queries[0])
    assert f"was written by {ruled}" in error, error
    # The same weights without the copy rules: the message names the rules.
    unruled = str(tmp_path / "unruled.keras")
    code = pretrained()
    code.model.copy_margin = code.model.copy_blocks = None
    code.save(unruled)
    error, _ = _error(capsys, "search", unruled, output, queries[0])
    assert f"copy_margin {COPY_MARGIN} against None" in error, error
    assert "weights differ" not in error, error
    # Without an instance code: the class code alone.
    plain = str(tmp_path / "plain.subic")
    argv = ["index", "build", model, str(root), "--output", plain]
    assert main([*argv, "--instance-model", "none"]) == 0
    index = ImageIndex.load(plain)
    assert index.instance is None and not index.written_with_looks
    assert _error(capsys, *argv, "--instance-model", model)[0].startswith(
        "subic index build: error: --instance-model must be an instance code"
    )
    split = ["index", "build", model, "--dataset", "digits", "--output", plain]
    error, _ = _error(capsys, *split, "--instance-model", "instance")
    assert "--instance-model keeps instance codes of a folder's pictures" in error
