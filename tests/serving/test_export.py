"""Tests of subic_keras.serving.export's SavedModel, checked with TensorFlow's
own tools.

The DSH-CNN SuBiC of tests/serving/conftest.py is exported once; error cases
use a tiny 8×8 model.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from exported import K, M, reference_codes, tiny_subic

from subic_keras import build_subic
from subic_keras.serving.export import (
    QUANTIZATIONS,
    SAVED_MODEL_SIGNATURES,
    export_litert,
    export_saved_model,
    load_subic,
)

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
# One worker runs this module and test_litert_export.py (the README's
# `--dist loadgroup`): the model they export is trained once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("export")]


@pytest.fixture(scope="module")
def saved_path(trained, tmp_path_factory):
    return export_saved_model(trained, str(tmp_path_factory.mktemp("serving")))


@pytest.mark.slow
def test_load_subic_needs_no_other_import(tmp_path):
    # A fresh process that imports only `subic_keras.serving.export`: the package's
    # classes are registered before the file is read.
    tiny_subic().train_model.save(tmp_path / "tiny.keras")
    script = (
        "from subic_keras.serving.export import load_subic; "
        f"print(load_subic({str(tmp_path / 'tiny.keras')!r}).num_blocks)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr[-2000:]


def test_layout_and_default_versions(tiny, tmp_path):
    first = export_saved_model(tiny, str(tmp_path))
    assert first == str(tmp_path / "subic" / "1")
    assert (Path(first) / "saved_model.pb").is_file()
    assert (Path(first) / "variables" / "variables.index").is_file()
    # Non-numeric names (temporary or stray directories) are not versions.
    for name in ("7a", ".8.tmp", "tmp"):
        (tmp_path / "subic" / name).mkdir()
    (tmp_path / "subic" / "99").write_text("a file, not a version")
    assert export_saved_model(tiny, str(tmp_path), version=5).endswith("5")
    assert export_saved_model(tiny, str(tmp_path)) == str(tmp_path / "subic" / "6")
    other = export_saved_model(tiny, str(tmp_path), model_name="other")
    assert other == str(tmp_path / "other" / "1")
    # Readable by a server running as another user (the umask permitting).
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(first).st_mode & 0o777 == 0o777 & ~umask
    litert = export_litert(tiny, str(tmp_path / "subic.tflite"))
    assert os.stat(litert).st_mode & 0o777 == 0o666 & ~umask


def test_existing_version_needs_overwrite(tiny, tmp_path):
    path = Path(export_saved_model(tiny, str(tmp_path), version=3))
    (path / "marker").write_text("old")
    with pytest.raises(FileExistsError, match=r"version 3 of model 'subic'.*/3'"):
        export_saved_model(tiny, str(tmp_path), version=3)
    assert (path / "marker").exists()
    export_saved_model(tiny, str(tmp_path), version=3, overwrite=True)
    assert not (path / "marker").exists() and (path / "saved_model.pb").is_file()
    assert sorted(os.listdir(tmp_path / "subic")) == ["3"]  # no temporary left


def test_failed_export_leaves_no_version(tiny, tmp_path, monkeypatch):
    def half_written(module, directory, signatures=None):
        Path(directory, "saved_model.pb").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        export_saved_model(tiny, str(tmp_path))
    assert os.listdir(tmp_path / "subic") == []


def test_exports_are_never_written_through_a_planted_link(tiny, tmp_path):
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    base = tmp_path / "serving"
    base.mkdir()
    (base / "subic").symlink_to(outside)  # the model's folder
    with pytest.raises(FileExistsError, match="a symbolic link stands where"):
        export_saved_model(tiny, str(base))
    (base / "other").mkdir()
    (base / "other" / "2").symlink_to(outside / "1")  # a version
    with pytest.raises(FileExistsError, match="already exists"):
        export_saved_model(tiny, str(base), model_name="other", version=2)
    path = tmp_path / "subic.tflite"
    path.symlink_to(outside / "model.tflite")
    with pytest.raises(FileExistsError, match="never writes through a link"):
        export_litert(tiny, str(path))
    # Replacing them replaces the links themselves.
    assert export_saved_model(tiny, str(base), overwrite=True) == str(
        base / "subic" / "1"
    )
    export_saved_model(tiny, str(base), model_name="other", version=2, overwrite=True)
    assert not (base / "subic").is_symlink() and not (base / "other" / "2").is_symlink()
    assert (base / "other" / "2" / "saved_model.pb").is_file()
    assert os.listdir(outside) == ["1"] and os.listdir(outside / "1") == []


def test_failed_litert_export_leaves_no_file(tiny, tmp_path, monkeypatch):
    class Failing:
        target_spec = type("Spec", (), {})()

        def convert(self):
            raise RuntimeError("conversion failed")

    monkeypatch.setattr(
        tf.lite.TFLiteConverter, "from_keras_model", lambda model: Failing()
    )
    path = tmp_path / "subic.tflite"
    with pytest.raises(RuntimeError, match="conversion failed"):
        export_litert(tiny, str(path))
    assert os.listdir(tmp_path) == []


# SavedModel: TensorFlow's saved_model_cli ---------------------------------


def saved_model_cli(*arguments: str) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).with_name("saved_model_cli")
    command = (
        [str(executable)]
        if executable.exists()
        else [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [*command, *arguments], capture_output=True, text=True, env=env, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def test_saved_model_cli_show(saved_path):
    shown = saved_model_cli("show", "--all", "--dir", saved_path).stdout
    for name in SAVED_MODEL_SIGNATURES:
        assert f"signature_def['{name}']" in shown
    blocks = {
        name: shown.split(f"signature_def['{name}']")[1].split("signature_def[")[0]
        for name in SAVED_MODEL_SIGNATURES
    }
    for name in ("serving_default", "classify"):
        assert "inputs['images'] tensor_info:" in blocks[name]
        assert "dtype: DT_FLOAT" in blocks[name]
        assert "shape: (-1, 32, 32, 3)" in blocks[name]
    assert "inputs['image_bytes'] tensor_info:" in blocks["encode_images"]
    assert "dtype: DT_STRING" in blocks["encode_images"]
    for name in ("serving_default", "encode_images"):
        codes = blocks[name].split("outputs['codes']")[1]
        assert codes.split("shape:")[0].count("DT_INT32") == 1
        assert f"shape: (-1, {M})" in codes
        for output in ("query", "class_query"):
            block = blocks[name].split(f"outputs['{output}']")[1]
            assert f"shape: (-1, {M * K})" in block.split("outputs[")[0]
    assert "shape: (-1, 10)" in blocks["classify"].split("outputs['probabilities']")[1]


def test_saved_model_cli_run(saved_path, trained, cifar, tmp_path):
    image = cifar[2][:1].astype(np.float32) / np.float32(255.0)
    # Python floats that are exactly the float32 values (a literal, since
    # saved_model_cli evaluates --input_exprs with ast.literal_eval).
    literal = repr(image.astype(np.float64).tolist())
    completed = saved_model_cli(
        "run",
        "--dir",
        saved_path,
        "--tag_set",
        "serve",
        "--signature_def",
        "serving_default",
        "--input_exprs",
        f"images={literal}",
        "--outdir",
        str(tmp_path),
    )
    assert "Result for output key codes" in completed.stdout
    codes = np.load(tmp_path / "codes.npy")
    query = np.load(tmp_path / "query.npy")
    assert codes.dtype == np.int32 and codes.shape == (1, M)
    np.testing.assert_array_equal(codes, trained.encode(image))
    np.testing.assert_allclose(query, trained.query(image), rtol=0, atol=1e-4)


# SavedModel: the signatures against Keras ----------------------------------


def test_signatures_match_keras(
    saved_path, trained, cifar, keras_outputs, keras_class_query
):
    served = tf.saved_model.load(saved_path)
    assert set(served.signatures) == set(SAVED_MODEL_SIGNATURES)
    images = cifar[2].astype(np.float32) / np.float32(255.0)
    codes, z = keras_outputs
    out = served.signatures["serving_default"](images=tf.constant(images))
    assert out["codes"].dtype == tf.int32 and out["query"].dtype == tf.float32
    np.testing.assert_array_equal(out["codes"].numpy(), codes)
    np.testing.assert_allclose(out["query"].numpy(), z, rtol=0, atol=1e-4)
    assert out["class_query"].dtype == tf.float32
    np.testing.assert_allclose(
        out["class_query"].numpy(), keras_class_query, rtol=1e-5, atol=1e-5
    )
    # The codes are the per-block argmax of the served z (independent check).
    np.testing.assert_array_equal(
        out["codes"].numpy(), reference_codes(out["query"].numpy(), M)
    )
    assert len(np.unique(codes)) > 4  # not a degenerate model
    probabilities = served.signatures["classify"](images=tf.constant(images))
    expected = trained.classifier.predict(images, verbose=0)
    np.testing.assert_allclose(
        probabilities["probabilities"].numpy(), expected, rtol=0, atol=1e-5
    )
    # FC1 on the one-hot code, computed here from the Keras weights.
    fc1 = trained.train_model.get_layer("fc1")
    one_hot = np.eye(K, dtype=np.float32)[codes].reshape(len(codes), M * K)
    logits = one_hot @ fc1.kernel.numpy() + fc1.bias.numpy()
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(
        probabilities["probabilities"].numpy(), softmax, rtol=0, atol=1e-5
    )


def test_encode_images_png_is_exact(saved_path, cifar):
    served = tf.saved_model.load(saved_path)
    pixels = cifar[2]
    pngs = [tf.io.encode_png(image).numpy() for image in pixels]
    from_bytes = served.signatures["encode_images"](image_bytes=tf.constant(pngs))
    floats = pixels.astype(np.float32) / np.float32(255.0)
    from_floats = served.signatures["serving_default"](images=tf.constant(floats))
    for name in ("codes", "query", "class_query"):
        np.testing.assert_array_equal(
            from_bytes[name].numpy(), from_floats[name].numpy()
        )


def test_encode_images_jpeg_and_resize(saved_path, trained, cifar):
    served = tf.saved_model.load(saved_path)
    pixels = cifar[2][:16]
    jpegs = [tf.io.encode_jpeg(image, quality=90).numpy() for image in pixels]
    out = served.signatures["encode_images"](image_bytes=tf.constant(jpegs))
    # Reference: TensorFlow's JPEG decoder, then the Keras encoder.
    decoded = np.stack([tf.io.decode_jpeg(data).numpy() for data in jpegs])
    assert np.abs(decoded.astype(int) - pixels).max() > 0  # JPEG is lossy
    floats = decoded.astype(np.float32) / np.float32(255.0)
    np.testing.assert_array_equal(out["codes"].numpy(), trained.encode(floats))
    np.testing.assert_allclose(
        out["query"].numpy(), trained.query(floats), rtol=0, atol=1e-4
    )

    # A 48×40 PNG (another size and aspect ratio) is stretched to 32×32.
    big = tf.image.resize(pixels, (48, 40), method="nearest").numpy()
    pngs = [tf.io.encode_png(image).numpy() for image in big]
    out = served.signatures["encode_images"](image_bytes=tf.constant(pngs))
    resized = tf.image.resize(big.astype(np.float32) / 255.0, (32, 32)).numpy()
    np.testing.assert_allclose(
        out["query"].numpy(), trained.query(resized), rtol=1e-5, atol=1e-4
    )
    # Grey PNGs are expanded to the model's three channels.
    grey = [tf.io.encode_png(image[..., :1]).numpy() for image in pixels[:2]]
    out = served.signatures["encode_images"](image_bytes=tf.constant(grey))
    rgb = np.repeat(pixels[:2, ..., :1], 3, axis=-1).astype(np.float32) / 255.0
    np.testing.assert_array_equal(out["codes"].numpy(), trained.encode(rgb))


def test_encode_images_composites_alpha_as_the_python_decoder(
    saved_path, trained, cifar
):
    # Served and indexed pictures must agree: a transparent PNG is composited
    # over white by `encode_images` exactly as `images.decode_image` does.
    from PIL import Image

    from subic_keras.data.images import decode_image

    served = tf.saved_model.load(saved_path)
    rng = np.random.default_rng(0)
    pixels = cifar[2][:6]
    alpha = rng.integers(0, 256, (*pixels.shape[:3], 1), dtype=np.uint8)
    pngs = []
    for image, a in zip(pixels, alpha):
        rgba = Image.fromarray(np.concatenate([image, a], -1), "RGBA")
        for picture in (rgba, rgba.convert("LA")):
            buffer = io.BytesIO()
            picture.save(buffer, "PNG")
            pngs.append(buffer.getvalue())
    out = served.signatures["encode_images"](image_bytes=tf.constant(pngs))
    decoded = np.stack([decode_image(data, (32, 32, 3)) for data in pngs])
    floats = decoded.astype(np.float32) / np.float32(255.0)
    np.testing.assert_array_equal(out["codes"].numpy(), trained.encode(floats))
    np.testing.assert_allclose(
        out["query"].numpy(), trained.query(floats), rtol=0, atol=1e-4
    )


@pytest.mark.parametrize(
    "shape, received",
    [
        ((32, 32, 3), r"\[32,32,3\]"),  # no batch axis
        ((2, 32, 32, 1), r"\[2,32,32,1\]"),  # grey images for an RGB model
        ((2, 31, 32, 3), r"\[2,31,32,3\]"),  # another size
    ],
)
@pytest.mark.parametrize("signature", ["serving_default", "classify"])
def test_serving_rejects_wrong_shapes(saved_path, signature, shape, received):
    served = tf.saved_model.load(saved_path)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"tensor images {received} is not compatible with expected shape "
        r"\[\?,32,32,3\]",
    ):
        served.signatures[signature](images=tf.zeros(shape))


def test_serving_rejects_bad_bytes(saved_path, cifar):
    served = tf.saved_model.load(saved_path)
    good = tf.io.encode_png(cifar[2][0]).numpy()
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)decode_image_bytes.*Unknown image file format",
    ):
        served.signatures["encode_images"](image_bytes=tf.constant([good, b"junk"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor image_bytes"):
        served.signatures["encode_images"](image_bytes=tf.constant([[good]]))


# Input checks ---------------------------------------------------------------


def test_refuses_models_that_are_not_subic(tiny, tmp_path):
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc0")])
    for function, args in (
        (export_saved_model, (str(tmp_path),)),
        (export_litert, (str(tmp_path / "x.tflite"),)),
    ):
        with pytest.raises(
            ValueError,
            match=r"must be a SuBiC model .* received a Sequential named "
            rf"'{plain.name}' .* layers \['fc0'\]",
        ):
            function(plain, *args)
    with pytest.raises(ValueError, match="received a ImageModel named 'encoder'"):
        export_saved_model(tiny.encoder, str(tmp_path))
    with pytest.raises(TypeError, match="received dict"):
        export_saved_model({}, str(tmp_path))
    missing = tmp_path / "missing.keras"
    with pytest.raises(FileNotFoundError, match="missing.keras"):
        export_saved_model(str(missing), str(tmp_path))
    saved_plain = tmp_path / "plain.keras"
    plain.save(saved_plain)
    with pytest.raises(ValueError, match=r"loaded from '.*plain\.keras'"):
        export_litert(str(saved_plain), str(tmp_path / "x.tflite"))
    assert not (tmp_path / "x.tflite").exists()
    assert not (tmp_path / "subic").exists()


def test_loads_keras_files_and_train_models(tiny, tmp_path):
    path = tmp_path / "model.keras"
    tiny.train_model.save(path)
    for source in (str(path), path, tiny.train_model, tiny):
        subic = load_subic(source)
        assert (subic.num_blocks, subic.block_size) == (2, 4)
    images = np.random.default_rng(2).random((3, 8, 8, 3), dtype=np.float32)
    served = tf.saved_model.load(export_saved_model(str(path), str(tmp_path / "s")))
    np.testing.assert_array_equal(
        served.signatures["serving_default"](images=images)["codes"].numpy(),
        tiny.encode(images),
    )


def test_argument_checks(tiny, tmp_path):
    with pytest.raises(ValueError, match="model_name must be a non-empty directory"):
        export_saved_model(tiny, str(tmp_path), model_name="a/b")
    with pytest.raises(ValueError, match="version must be >= 0, received -1"):
        export_saved_model(tiny, str(tmp_path), version=-1)
    with pytest.raises(ValueError, match=r"image_size \(9, 8\) disagrees"):
        export_saved_model(tiny, str(tmp_path), image_size=(9, 8))
    with pytest.raises(ValueError, match="quantization must be one of"):
        export_litert(tiny, str(tmp_path / "x.tflite"), "int4")
    assert QUANTIZATIONS == ("float32", "int8")
    with pytest.raises(ValueError, match="used by quantization='int8' only"):
        export_litert(tiny, str(tmp_path / "x.tflite"), representative_images=[1])
    with pytest.raises(ValueError, match="needs representative_images"):
        export_litert(tiny, str(tmp_path / "x.tflite"), "int8")
    with pytest.raises(
        ValueError,
        match=r"shape \(n, 8, 8, 3\) with n >= 1, the model's input, "
        r"received shape \(5, 8, 8, 1\)",
    ):
        export_litert(
            tiny,
            str(tmp_path / "x.tflite"),
            "int8",
            representative_images=np.zeros((5, 8, 8, 1), np.uint8),
        )
    with pytest.raises(ValueError, match=r"received shape \(0, 8, 8, 3\)"):
        export_litert(
            tiny, str(tmp_path / "x.tflite"), "int8", np.zeros((0, 8, 8, 3), np.uint8)
        )
    with pytest.raises(ValueError, match=r"floats in \[0, 1\]"):
        export_litert(
            tiny, str(tmp_path / "x.tflite"), "int8", np.full((2, 8, 8, 3), 255.0)
        )
    assert os.listdir(tmp_path) == []


def test_flexible_input_size_needs_image_size(tmp_path):
    backbone = keras.Sequential(
        [
            keras.Input((None, None, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
        ]
    )
    subic = build_subic(backbone, 2, 4, 3, input_shape=(None, None, 3), optimizer=None)
    with pytest.raises(ValueError, match="image_size is required"):
        export_saved_model(subic, str(tmp_path))
    served = tf.saved_model.load(
        export_saved_model(subic, str(tmp_path), image_size=(12, 10))
    )
    spec = served.signatures["serving_default"].structured_input_signature[1]
    assert spec["images"].shape.as_list() == [None, 12, 10, 3]
    png = tf.io.encode_png(np.zeros((30, 30, 3), np.uint8)).numpy()
    out = served.signatures["encode_images"](image_bytes=tf.constant([png]))
    assert out["codes"].shape == (1, 2)
