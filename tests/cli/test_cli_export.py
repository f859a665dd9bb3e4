"""Tests of `subic export` (subic_keras.cli), and of an instance code's
exports."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from exported import tiny_subic

from subic_keras.cli import main as cli_main
from subic_keras.data import datasets
from subic_keras.instance.instance_code import build_instance_subic
from subic_keras.serving.export import export_litert, export_saved_model, run_litert

# Integration tests (exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_an_instance_code_exports_its_codes_and_queries(tmp_path, capsys):
    """An instance code has no classes: `codes` and `query` (FC0's) in both
    SavedModel signatures and both LiteRT files, no `classify`, from the
    library and from `subic export`."""
    keras.utils.set_random_seed(6)
    backbone = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten()]
    )
    code = build_instance_subic(backbone, 2, 8)
    path = tmp_path / "code.keras"
    code.save(path, include_optimizer=False)
    images = np.random.default_rng(7).integers(0, 256, (40, 8, 8, 3), np.uint8)
    queries, codes = code.query(images), code.encode(images)

    served = tf.saved_model.load(export_saved_model(str(path), str(tmp_path)))
    assert sorted(served.signatures) == ["encode_images", "serving_default"]
    out = served.signatures["serving_default"](
        images=tf.constant(images / 255.0, tf.float32)
    )
    assert sorted(out) == ["codes", "query"]
    np.testing.assert_array_equal(out["codes"].numpy(), codes)
    np.testing.assert_allclose(out["query"].numpy(), queries, atol=1e-5)
    encoded = [tf.io.encode_png(image).numpy() for image in images[:3]]
    out = served.signatures["encode_images"](image_bytes=tf.constant(encoded))
    np.testing.assert_array_equal(out["codes"].numpy(), codes[:3])

    floats = run_litert(export_litert(code, str(tmp_path / "c.tflite")), images)
    assert sorted(floats) == ["codes", "query"]
    np.testing.assert_array_equal(floats["codes"], codes)
    np.testing.assert_allclose(floats["query"], queries, atol=1e-4)
    int8_path = export_litert(code, str(tmp_path / "c8.tflite"), "int8", images)
    ints = run_litert(int8_path, images)
    assert sorted(ints) == ["codes", "query"]
    assert (ints["codes"] == codes).mean() > 0.8
    # int8 steps of the queries' range: the same order, roughly.
    step = np.ptp(queries) / 255
    np.testing.assert_allclose(ints["query"], queries, atol=4 * step)

    out_dir = tmp_path / "serving"
    argv = ["export", str(path), "--output-dir", str(out_dir), "--litert"]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert f"SavedModel for TF Serving: {out_dir / 'subic' / '1'}" in printed
    cli_codes = run_litert(str(out_dir / "subic.tflite"), images)["codes"]
    np.testing.assert_array_equal(cli_codes, codes)


def test_cli_export(tmp_path, capsys):
    keras.utils.set_random_seed(5)
    (x, _), _ = datasets.load_digits()
    subic = tiny_subic(shape=(8, 8, 1), num_classes=10)
    model = tmp_path / "best.keras"
    subic.train_model.save(model)
    out = tmp_path / "serving"
    arguments = ["export", str(model), "--output-dir", str(out)]
    assert (
        cli_main(
            [
                *arguments,
                "--litert",
                "--int8",
                "--representative-data",
                "digits",
                "--num-representative",
                "50",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"SavedModel for TF Serving: {out / 'subic' / '1'}" in printed
    assert (out / "subic" / "1" / "saved_model.pb").is_file()
    for name in ("subic.tflite", "subic_int8.tflite"):
        assert (out / name).is_file() and f"{out / name}" in printed
    images = x[:5, ..., None]
    float_codes = run_litert(str(out / "subic.tflite"), images)["codes"]
    np.testing.assert_array_equal(float_codes, subic.encode(images / 255.0))

    assert cli_main([*arguments, "--model-name", "digits"]) == 0
    assert (out / "digits" / "1").is_dir()
    assert cli_main(arguments) == 0  # the next version
    assert sorted(os.listdir(out / "subic")) == ["1", "2"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*arguments, "--version", "1"])
    assert exit_info.value.code == 2
    assert "version exists; pass --overwrite" in capsys.readouterr().err
    # Exporting again writes the next version and replaces the LiteRT file
    # with its encoder (export/README.md).
    before = (out / "subic.tflite").stat().st_mtime_ns
    assert cli_main([*arguments, "--litert"]) == 0
    assert sorted(os.listdir(out / "subic")) == ["1", "2", "3"]
    assert (out / "subic.tflite").stat().st_mtime_ns > before
    assert f"{out / 'subic' / '3'}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main([*arguments, "--int8"])
    assert "--int8 needs --representative-data" in capsys.readouterr().err
    assert cli_main([*arguments, "--version", "1", "--overwrite", "--litert"]) == 0
    assert sorted(os.listdir(out)) == [
        "digits",
        "subic",
        "subic.tflite",
        "subic_int8.tflite",
    ]


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["export", "--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "--representative-data" in printed and "--output-dir" in printed
