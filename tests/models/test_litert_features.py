"""Tests of subic_keras.models.litert_features (and the interpreter it runs)."""

from __future__ import annotations

import os
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from litert_helpers import tflite_bytes
from reference import bilinear_reference

from subic_keras.models import litert
from subic_keras.models.backbones import LiteRTFeatureExtractor

MOBILENET = "mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"


@pytest.fixture(scope="module")
def mobilenet_path(shared_data_dir):
    path = shared_data_dir / MOBILENET
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="module")
def extractor(mobilenet_path):
    return LiteRTFeatureExtractor(mobilenet_path, num_threads=1)


@pytest.fixture(scope="module")
def cifar_images(shared_data_dir):
    path = shared_data_dir / "cifar-10-batches-bin" / "test_batch.bin"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with open(path, "rb") as handle:
        records = np.frombuffer(handle.read(8 * 3073), np.uint8).reshape(8, 3073)
    return records[:, 1:].reshape(8, 3, 32, 32).transpose(0, 2, 3, 1).copy()


def test_extractor_properties(extractor):
    assert extractor.feature_dim == 1024
    assert extractor.input_size == (224, 224)


def test_extractor_features_on_cifar(extractor, cifar_images):
    features = extractor.extract(cifar_images, batch_size=3, progress=False)
    assert features.shape == (8, 1024) and features.dtype == np.float32
    assert np.all(np.isfinite(features)) and np.all(features >= 0)
    scale = extractor._interpreter.get_output_details()[0]["quantization"][0]
    steps = features / scale
    np.testing.assert_allclose(steps, np.rint(steps), atol=1e-3)  # dequantized
    assert len({features[i].tobytes() for i in range(8)}) == 8
    again = extractor.extract(cifar_images, batch_size=8, progress=False)
    np.testing.assert_array_equal(again, features)


def test_extractor_matches_direct_interpreter(mobilenet_path, extractor, cifar_images):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(mobilenet_path), num_threads=1)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    scale, zero_point = out["quantization"]
    images = cifar_images[:2]
    expected = []
    for image in images:
        pixels = np.clip(np.rint(bilinear_reference(image, 224, 224)), 0, 255)
        interpreter.set_tensor(inp["index"], pixels.astype(np.uint8)[None])
        interpreter.invoke()
        q = interpreter.get_tensor(out["index"]).reshape(-1).astype(np.float32)
        expected.append(scale * (q - zero_point))
    features = extractor.extract(images, progress=False)
    np.testing.assert_allclose(features, np.stack(expected), atol=2 * scale)


def test_extractor_grey_images(extractor, cifar_images, capsys):
    grey = cifar_images[:3, :, :, 0]
    features = extractor.extract(grey, progress=True)
    assert "3/3" in capsys.readouterr().err  # the tqdm bar
    rgb = np.repeat(grey[..., None], 3, axis=-1)
    np.testing.assert_array_equal(features, extractor.extract(rgb, progress=False))
    np.testing.assert_array_equal(
        features, extractor.extract(grey[..., None], progress=False)
    )


def test_extractor_cache(extractor, cifar_images, tmp_path, monkeypatch):
    calls = []
    invoke = extractor._invoke

    def counting(inputs):
        calls.append(len(inputs))
        return invoke(inputs)

    monkeypatch.setattr(extractor, "_invoke", counting)
    first = extractor.extract(cifar_images[:4], cache_dir=tmp_path, progress=False)
    assert sum(calls) == 4
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].endswith(".npy")
    np.testing.assert_array_equal(np.load(tmp_path / files[0]), first)

    second = extractor.extract(cifar_images[:4], cache_dir=tmp_path, progress=False)
    assert sum(calls) == 4  # loaded, not recomputed
    np.testing.assert_array_equal(second, first)

    other = cifar_images[:4].copy()
    other[0, 0, 0, 0] ^= 1
    extractor.extract(other, cache_dir=tmp_path, progress=False)
    assert sum(calls) == 8 and len(os.listdir(tmp_path)) == 2

    # A damaged cache file is recomputed and replaced, never returned.
    np.save(tmp_path / files[0], np.zeros((2, 3), np.float32))
    third = extractor.extract(cifar_images[:4], cache_dir=tmp_path, progress=False)
    assert sum(calls) == 12
    np.testing.assert_array_equal(third, first)
    np.testing.assert_array_equal(np.load(tmp_path / files[0]), first)


def test_extractor_cache_in_chunks_resumes(extractor, cifar_images, tmp_path):
    images = cifar_images[:5]
    whole = extractor.extract(images, progress=False)
    # A run interrupted after its first chunk left that chunk's entry.
    extractor.extract(images[:2], cache_dir=tmp_path, progress=False)
    chunked = extractor.extract(
        images, cache_dir=tmp_path, progress=False, chunk_size=2
    )
    np.testing.assert_allclose(chunked, whole, rtol=1e-6)
    assert len(os.listdir(tmp_path)) == 3  # [0:2] reused, [2:4] and [4:5] added
    with pytest.raises(ValueError, match="chunk_size must be >= 1, received 0"):
        extractor.extract(images, cache_dir=tmp_path, chunk_size=0)


def test_extractor_empty_input(extractor):
    features = extractor.extract(np.zeros((0, 32, 32, 3), np.uint8), progress=False)
    assert features.shape == (0, 1024)


def test_extractor_input_validation(extractor):
    with pytest.raises(ValueError, match=r"\(8, 32\)"):
        extractor.extract(np.zeros((8, 32), np.uint8))
    with pytest.raises(ValueError, match=r"\(2, 32, 32, 4\)"):
        extractor.extract(np.zeros((2, 32, 32, 4), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        extractor.extract(np.zeros((2, 32, 32, 3), np.float32))
    with pytest.raises(TypeError, match="NumPy array"):
        extractor.extract([[0]])
    with pytest.raises(ValueError, match="batch_size"):
        extractor.extract(np.zeros((2, 32, 32, 3), np.uint8), batch_size=0)


def test_extractor_missing_or_invalid_model(tmp_path):
    missing = tmp_path / "missing.tflite"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        LiteRTFeatureExtractor(missing)
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=re.escape(str(garbage))):
        LiteRTFeatureExtractor(garbage)
    with pytest.raises(ValueError, match="num_threads"):
        LiteRTFeatureExtractor(garbage, num_threads=0)


@pytest.fixture(scope="module")
def mean_models(tmp_path_factory):
    """Float LiteRT models averaging their 16x16 input: dynamic and fixed batch."""
    directory = tmp_path_factory.mktemp("litert")
    paths = {}
    for kind, batch in (("dynamic", None), ("fixed", 3)):
        inputs = keras.Input((16, 16, 3), batch_size=batch)
        model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(inputs))
        paths[kind] = directory / f"mean_{kind}.tflite"
        paths[kind].write_bytes(tflite_bytes(model))
    return paths


@pytest.mark.parametrize("kind", ["dynamic", "fixed"])
def test_extractor_float_model_batching(mean_models, kind):
    extractor = LiteRTFeatureExtractor(mean_models[kind], num_threads=1)
    assert extractor.feature_dim == 3 and extractor.input_size == (16, 16)
    assert (extractor.input_mean, extractor.input_std) == (127.5, 127.5)
    assert extractor._dynamic_batch == (kind == "dynamic")
    if kind == "fixed":
        assert extractor._batch == 3  # batches of 5 are padded groups of 3
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    expected = ((images - 127.5) / 127.5).mean(axis=(1, 2))
    features = extractor.extract(images, batch_size=5, progress=False)
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)

    small = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    resized = np.stack([bilinear_reference(image, 16, 16) for image in small])
    expected = ((resized - 127.5) / 127.5).mean(axis=(1, 2))
    np.testing.assert_allclose(
        extractor.extract(small, progress=False), expected, rtol=1e-4, atol=1e-5
    )


def test_extractor_custom_normalization(mean_models):
    extractor = LiteRTFeatureExtractor(
        mean_models["dynamic"], input_mean=0.0, input_std=255.0
    )
    images = np.full((1, 16, 16, 3), 51, np.uint8)
    np.testing.assert_allclose(
        extractor.extract(images, progress=False), 0.2, rtol=1e-5
    )
    with pytest.raises(ValueError, match="input_std"):
        LiteRTFeatureExtractor(mean_models["dynamic"], input_std=0.0)


def test_interpreter_falls_back_to_tensorflow(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    assert litert.interpreter_class() is tf.lite.Interpreter
