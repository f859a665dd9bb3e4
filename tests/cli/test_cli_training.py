"""`subic train` and `subic evaluate` on a folder of pictures: classes
recorded, splits stated, mistakes in one line, photos as they come."""

import json

import numpy as np
import pytest
from command_line import one_line_error as _error
from served import picture_folder

from subic_keras.cli import main

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_train_on_a_folder_records_its_classes(tmp_path, capsys):
    import keras

    from subic_keras.serving.server import SearchService

    root = tmp_path / "photos"
    picture_folder(root, n=200)  # classes a, b, c
    (root / "stray.txt").write_text("not in a class folder")
    out = tmp_path / "run"
    train = ["train", "--images", str(root), "--image-size", "16", "--bits", "8"]
    train += ["--block-size", "4", "--pretrain-epochs", "1", "--epochs", "1"]
    assert main([*train, "--output-dir", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert "on the pictures of" in stdout and "(resized to 16x16)" in stdout
    assert "skipped stray.txt: not in a class folder" in stderr
    # Said when the folder was checked, before training's report.
    assert stdout.index("skipped 1 file (listed") < stdout.index("pre-training: ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["class_names"] == ["a", "b", "c"] and "test" not in summary
    assert (
        summary["data"]["images"] == str(root) and summary["config"]["dataset"] is None
    )
    assert summary["num_train"] + summary["num_validation"] == 200
    model = keras.saving.load_model(out / "best.keras")
    assert model.class_names == ["a", "b", "c"] and model.input_shape[1:] == (16, 16, 3)
    # The classes name the server's predictions.
    index = str(tmp_path / "photos.subic")
    assert (
        main(["index", "build", str(out / "best.keras"), str(root), "--output", index])
        == 0
    )
    service = SearchService(str(out / "best.keras"), index)
    answer = service.search_image((root / "a" / "a_00000.png").read_bytes(), 3)
    assert answer["class_name"] in ("a", "b", "c")
    assert answer["results"][0]["path"] == "a/a_00000.png"
    assert service.stats()["class_names"] == ["a", "b", "c"]
    # The model records its folder: no data options needed afterwards.
    own = str(tmp_path / "own.subic")
    capsys.readouterr()
    assert main(["index", "build", str(out / "best.keras"), "--output", own]) == 0
    assert f"indexed 200 pictures of {root}" in capsys.readouterr().out
    assert main(["evaluate", str(out / "best.keras")]) == 0
    assert capsys.readouterr().out.startswith(f"pictures of {root} (3 classes)")
    # Trained again into the same folder: refused before training, unless
    # --overwrite; then the index of the old model is refused in one line
    # naming both and what differs, before anything is searched.
    err, seconds = _error(capsys, *train, "--output-dir", out)
    assert "--output-dir already holds a model; --overwrite replaces it" in err
    assert str(out / "best.keras") in err and seconds < 5
    assert main([*train, "--seed", "1", "--output-dir", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    query = root / "a" / "a_00000.png"
    # Told from the weights the files hold, before TensorFlow loads.
    err, seconds = _error(capsys, "search", out / "best.keras", index, query)
    model = out / "best.keras"
    assert f"{index} was written by an earlier training of {model} (weights " in err
    assert f"not by {model}" in err and "their weights differ" in err
    assert seconds < 1, seconds
    err, seconds = _error(capsys, "index", "add", out / "best.keras", index)
    assert "their weights differ" in err and seconds < 1
    with pytest.raises(ValueError, match="their weights differ"):
        SearchService(str(out / "best.keras"), index)


def test_train_folder_mistakes_are_one_line(tmp_path, capsys):
    root = tmp_path / "photos"
    picture_folder(root, n=9)
    other = tmp_path / "other"
    picture_folder(other, n=6)
    (other / "c").rename(other / "z")
    err, _ = _error(capsys, "train", "--validation-images", other)
    assert "validation_images needs images" in err
    err, _ = _error(capsys, "train", "--images", root, "--image-size", "4")
    assert "image_size must be >= 8, received 4" in err
    err, _ = _error(capsys, "train", "--images", root, "--validation-images", other)
    assert "the validation folder's classes ['a', 'b', 'z'] differ" in err
    err, _ = _error(capsys, "train", "--images", tmp_path / "none")
    assert "image folder not found" in err


def test_evaluate_on_a_folder_states_its_split(model, tmp_path, capsys):
    root = tmp_path / "photos"
    picture_folder(root, n=60)  # 20 pictures in each of 3 classes
    output = tmp_path / "eval.json"
    assert (
        main(["evaluate", model, "--images", str(root), "--output", str(output)]) == 0
    )
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"pictures of {root} (3 classes), protocol 'random' ")
    assert "(queries per class 4, seed 0)" in line
    result = json.loads(output.read_text())
    assert (result["num_queries"], result["num_database"]) == (12, 48)
    assert result["images"] == str(root) and 0 < result["map"] <= 1
    # The same seed gives the same split and the same mAP.
    assert main(["evaluate", model, "--images", str(root), "--seed", "0"]) == 0
    again = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert again["map"] == result["map"]
    err, _ = _error(capsys, "evaluate", model, "--images", root, "--dataset", "digits")
    assert "--dataset select a dataset split or its codes" in err
    err, _ = _error(capsys, "evaluate", model, "--images", root, "--seed", "0",
                    "--index", tmp_path / "x.subic")  # fmt: skip
    assert "--index select" in err


def test_a_keras_application_backbone_trains_and_loads_local_weights(tmp_path, capsys):
    import keras

    from subic_keras.config import TrainConfig
    from subic_keras.training import build_model

    root = tmp_path / "photos"
    picture_folder(root, n=90)
    out = tmp_path / "run"
    train = ["train", "--images", str(root), "--backbone", "mobilenet_v3_small"]
    train += ["--weights", "none", "--bits", "8", "--block-size", "4"]
    train += ["--pretrain-epochs", "0", "--epochs", "1", "--validation-size", "30"]
    assert main([*train, "--output-dir", str(out)]) == 0
    assert "model: " in capsys.readouterr().out
    index = str(tmp_path / "photos.subic")
    assert (
        main(["index", "build", str(out / "best.keras"), str(root), "--output", index])
        == 0
    )

    # A local weights file is loaded into the backbone.
    keras.utils.set_random_seed(7)
    base = keras.applications.MobileNetV3Small(
        include_top=False, weights=None, input_shape=(32, 32, 3), pooling="avg"
    )
    base.save_weights(tmp_path / "local.weights.h5")
    config = TrainConfig(
        backbone="mobilenet_v3_small", weights=str(tmp_path / "local.weights.h5")
    )
    subic = build_model(config, np.zeros((4, 32, 32, 3), np.uint8), num_classes=3)
    expected = base.get_layer("conv").get_weights()[0]
    loaded = subic.backbone.get_layer("conv").get_weights()[0]
    np.testing.assert_array_equal(loaded, expected)


def test_a_folder_of_photos_as_they_come_trains_indexes_and_finds_each(
    tmp_path, capsys
):
    """A 4096 × 4096 WebP wallpaper, distinct RGBA PNGs and JPEGs of
    several sizes: trained on (each decoded once, the wallpaper within the
    default decode budget), indexed, each picture found first as a copy
    of itself, and no transparent picture grouped with another."""
    from PIL import Image

    rng = np.random.default_rng(7)

    def field(size):
        base = rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)
        return Image.fromarray(base).resize(size, Image.BICUBIC)

    root = tmp_path / "photos"
    for name in ("walls", "alpha", "shots"):
        (root / name).mkdir(parents=True)
    field((4096, 4096)).save(root / "walls" / "wall.webp", quality=60)
    for number in range(15):
        field((900 + 40 * number, 600)).save(root / "walls" / f"w{number}.jpg")
        field((640, 480)).save(root / "shots" / f"s{number}.jpg", quality=85)
        picture = field((320, 200)).convert("RGBA")
        alpha = np.linspace(40 * (number % 3), 255, 320, dtype=np.float32)
        picture.putalpha(Image.fromarray(np.tile(alpha, (200, 1)).astype(np.uint8)))
        picture.save(root / "alpha" / f"a{number}.png")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.*"))
    assert len(files) == 46
    run = tmp_path / "run"
    argv = ["train", "--images", str(root), "--output-dir", str(run)]
    assert main([*argv, "--pretrain-epochs", "1", "--epochs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "skipped" not in out + err, out + err
    model = str(run / "best.keras")
    index = str(tmp_path / "photos.subic")
    assert main(["index", "build", model, str(root), "--output", index]) == 0
    assert "indexed 46 pictures" in capsys.readouterr().out
    queries = [str(root / name) for name in files]
    assert main(["search", model, index, *queries, "-k", "1", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["path"] for row in rows] == files
    assert all(row["copy"] for row in rows), rows
    assert main(["duplicates", index, "--json"]) == 0
    assert capsys.readouterr().out.strip() == ""
