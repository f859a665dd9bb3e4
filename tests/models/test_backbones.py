"""Tests of subic_keras.models.backbones."""

from __future__ import annotations

import math
import os
import re
import sys
import urllib.error

import keras
import numpy as np
import pytest
import tensorflow as tf

from subic_keras.models import applications, backbones, litert
from subic_keras.models.backbones import (
    ApplicationPreprocessing,
    LiteRTFeatureExtractor,
    LocalResponseNormalization,
    dsh_cnn,
    feature_input,
    keras_application,
)

MOBILENET = "mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"


# Independent NumPy references ------------------------------------------------


def lrn_reference(x, size, alpha, beta):
    """Caffe WITHIN_CHANNEL LRN, channels last, explicit window loops."""
    x = x.astype(np.float64)
    n, height, width, channels = x.shape
    pad = (size - 1) // 2
    padded = np.zeros((n, height + 2 * pad, width + 2 * pad, channels))
    padded[:, pad : pad + height, pad : pad + width] = x**2
    sums = np.zeros_like(x)
    for i in range(height):
        for j in range(width):
            sums[:, i, j] = padded[:, i : i + size, j : j + size].sum(axis=(1, 2))
    return x / (1.0 + alpha / size**2 * sums) ** beta


def caffe_pool_reference(x, kernel, stride, mode):
    """Caffe's ceil-mode pooling (pad 0), channels last."""
    n, height, width, channels = x.shape
    out_h = math.ceil((height - kernel) / stride) + 1
    out_w = math.ceil((width - kernel) / stride) + 1
    out = np.zeros((n, out_h, out_w, channels))
    for i in range(out_h):
        for j in range(out_w):
            h0, w0 = i * stride, j * stride
            h1, w1 = min(h0 + kernel, height), min(w0 + kernel, width)
            window = x[:, h0:h1, w0:w1]
            if mode == "max":
                out[:, i, j] = window.max(axis=(1, 2))
            else:
                out[:, i, j] = window.sum(axis=(1, 2)) / ((h1 - h0) * (w1 - w0))
    return out


def bilinear_reference(image, out_h, out_w):
    """Half-pixel-centre bilinear resizing of one `(H, W, C)` image."""
    image = image.astype(np.float64)

    def axis(out, size):
        source = np.clip((np.arange(out) + 0.5) * size / out - 0.5, 0, size - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, size - 1), source - low

    r0, r1, fr = axis(out_h, image.shape[0])
    c0, c1, fc = axis(out_w, image.shape[1])
    rows = image[r0] * (1 - fr)[:, None, None] + image[r1] * fr[:, None, None]
    return rows[:, c0] * (1 - fc)[None, :, None] + rows[:, c1] * fc[None, :, None]


def tflite_bytes(model):
    """Converts with builtin ops only; fails if any op would need Select TF."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def run_tflite(content, x):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


# LocalResponseNormalization ------------------------------------------------


@pytest.mark.parametrize(
    "size, alpha, beta", [(3, 5e-5, 0.75), (3, 1.0, 0.75), (5, 0.3, 0.5), (1, 2.0, 1)]
)
def test_lrn_matches_numpy_reference(size, alpha, beta):
    x = np.random.default_rng(0).normal(0, 30, (2, 7, 6, 3)).astype("float32")
    layer = LocalResponseNormalization(size=size, alpha=alpha, beta=beta)
    expected = lrn_reference(x, size, alpha, beta)
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    if alpha >= 1:
        assert not np.allclose(expected, x, rtol=1e-2)  # the test can fail


def test_lrn_default_parameters_are_dshs():
    layer = LocalResponseNormalization()
    assert (layer.size, layer.alpha, layer.beta) == (3, 5e-5, 0.75)


def test_lrn_channels_first_matches_channels_last():
    x = np.random.default_rng(1).normal(0, 5, (2, 5, 5, 4)).astype("float32")
    last = LocalResponseNormalization(alpha=1.0, data_format="channels_last")(x)
    first = LocalResponseNormalization(alpha=1.0, data_format="channels_first")(
        np.transpose(x, (0, 3, 1, 2))
    )
    np.testing.assert_allclose(
        np.transpose(first.numpy(), (0, 2, 3, 1)), last.numpy(), rtol=1e-6
    )


def test_lrn_config_round_trip():
    layer = LocalResponseNormalization(size=5, alpha=0.1, beta=0.5, name="lrn")
    config = keras.saving.serialize_keras_object(layer)
    clone = keras.saving.deserialize_keras_object(config)
    assert isinstance(clone, LocalResponseNormalization)
    assert clone.get_config() == layer.get_config()
    x = np.random.default_rng(2).normal(0, 5, (1, 4, 4, 2)).astype("float32")
    np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())


def test_lrn_mixed_precision_does_not_overflow():
    layer = LocalResponseNormalization(alpha=1.0, dtype="mixed_float16")
    x = np.full((1, 3, 3, 1), 1000.0, "float32")
    y = layer(x).numpy()
    assert y.dtype == np.float16
    expected = lrn_reference(x, 3, 1.0, 0.75)
    np.testing.assert_allclose(y.astype("float32"), expected, rtol=2e-3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"size": 2}, ValueError, "size must be odd"),
        ({"size": 0}, ValueError, "size must be >= 1"),
        ({"size": 3.0}, TypeError, "size must be an integer"),
        ({"alpha": -1.0}, ValueError, "alpha"),
        ({"beta": float("nan")}, ValueError, "beta"),
        ({"data_format": "NHWC"}, ValueError, "data_format"),
    ],
)
def test_lrn_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LocalResponseNormalization(**kwargs)


def test_lrn_rejects_non_image_inputs():
    with pytest.raises(ValueError, match=r"4D inputs.*\(2, 3\)"):
        LocalResponseNormalization()(np.ones((2, 3), "float32"))


def test_lrn_converts_to_litert_builtin_ops():
    inputs = keras.Input((6, 5, 4))
    model = keras.Model(inputs, LocalResponseNormalization(alpha=1.0)(inputs))
    content = tflite_bytes(model)
    x = np.random.default_rng(3).normal(0, 3, (2, 6, 5, 4)).astype("float32")
    np.testing.assert_allclose(
        run_tflite(content, x), lrn_reference(x, 3, 1.0, 0.75), rtol=1e-5, atol=1e-6
    )


# dsh_cnn ------------------------------------------------------------------


def caffe_size(size):
    return math.ceil((size - 3) / 2) + 1


@pytest.mark.parametrize("input_shape", [(32, 32, 3), (28, 28, 1), (8, 9, 3)])
def test_dsh_cnn_layer_shapes(input_shape):
    model = dsh_cnn(input_shape)
    h1, w1 = caffe_size(input_shape[0]), caffe_size(input_shape[1])
    h2, w2 = caffe_size(h1), caffe_size(w1)
    h3, w3 = caffe_size(h2), caffe_size(w2)
    expected = {
        "conv1": (None, input_shape[0], input_shape[1], 32),
        "pool1": (None, h1, w1, 32),
        "norm1": (None, h1, w1, 32),
        "conv2": (None, h1, w1, 32),
        "pool2": (None, h2, w2, 32),
        "norm2": (None, h2, w2, 32),
        "conv3": (None, h2, w2, 64),
        "pool3": (None, h3, w3, 64),
        "flatten": (None, h3 * w3 * 64),
        "fc": (None, 500),
    }
    for name, shape in expected.items():
        output = model.get_layer(name).output
        if name.startswith("pool") and name + "_crop" in [x.name for x in model.layers]:
            output = model.get_layer(name + "_crop").output
        assert output.shape == shape, name
    if input_shape[0] == 32:
        assert (h1, h2, h3) == (16, 8, 4)
    if input_shape[0] == 28:
        assert (h1, h2, h3) == (14, 7, 3)
    assert model.output_shape == (None, 500)


def test_dsh_cnn_layer_order_and_parameter_count():
    model = dsh_cnn()
    kinds = [type(layer).__name__ for layer in model.layers[1:]]
    assert kinds == [
        "Conv2D",
        "MaxPooling2D",
        "ReLU",
        "LocalResponseNormalization",
        "Conv2D",
        "AveragePooling2D",
        "ReLU",
        "LocalResponseNormalization",
        "Conv2D",
        "ReLU",
        "AveragePooling2D",
        "Flatten",
        "Dense",
    ]
    conv = [5 * 5 * 3 * 32 + 32, 5 * 5 * 32 * 32 + 32, 5 * 5 * 32 * 64 + 64]
    assert model.count_params() == sum(conv) + 4 * 4 * 64 * 500 + 500 == 591828
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            assert layer.kernel_size == (5, 5) and layer.padding == "same"
        if isinstance(layer, LocalResponseNormalization):
            assert (layer.size, layer.alpha, layer.beta) == (3, 5e-5, 0.75)


def test_dsh_cnn_width_multiplies_the_channels():
    model = dsh_cnn(width=2)
    channels = [layer.filters for layer in model.layers if hasattr(layer, "filters")]
    assert channels == [64, 64, 128] and model.output_shape == (None, 500)
    conv = [5 * 5 * 3 * 64 + 64, 5 * 5 * 64 * 64 + 64, 5 * 5 * 64 * 128 + 128]
    assert model.count_params() == sum(conv) + 4 * 4 * 128 * 500 + 500
    with pytest.raises(ValueError, match="width must be >= 1, received 0"):
        dsh_cnn(width=0)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("height, width", [(8, 8), (7, 7), (8, 7), (7, 8), (2, 9)])
def test_caffe_pool_matches_caffe_ceil_mode(mode, height, width):
    inputs = keras.Input((height, width, 3))
    model = keras.Model(inputs, backbones._caffe_pool(inputs, mode, name="pool"))
    x = np.random.default_rng(4).normal(size=(2, height, width, 3)).astype("float32")
    np.testing.assert_allclose(
        model(x).numpy(), caffe_pool_reference(x, 3, 2, mode), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("input_shape", [(32, 32, 3), (28, 28, 1)])
def test_dsh_cnn_converts_to_litert_builtin_ops(input_shape):
    model = dsh_cnn(input_shape)
    x = np.random.default_rng(10).uniform(0, 255, (2, *input_shape)).astype("float32")
    expected = model(x).numpy()
    assert expected.max() > 0
    np.testing.assert_allclose(
        run_tflite(tflite_bytes(model), x), expected, rtol=1e-4, atol=1e-4
    )


def test_dsh_cnn_features_and_save_load(tmp_path):
    model = dsh_cnn()
    x = np.random.default_rng(5).uniform(0, 1, (3, 32, 32, 3)).astype("float32")
    features = model(x).numpy()
    assert features.shape == (3, 500)
    assert np.all(features >= 0) and np.all(np.isfinite(features))
    path = tmp_path / "dsh.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), features, rtol=1e-6)


@pytest.mark.parametrize(
    "shape", [(32, 32), (32, 32, 0), "32x32x3", (32, 32, 3.0), (7, 32, 3)]
)
def test_dsh_cnn_rejects_bad_input_shape(shape):
    with pytest.raises((ValueError, TypeError), match="input_shape"):
        dsh_cnn(shape)


# feature_input ------------------------------------------------------------


def test_feature_input_is_identity():
    model = feature_input(5, name="cached")
    assert model.name == "cached" and model.output_shape == (None, 5)
    x = np.random.default_rng(6).normal(size=(4, 5)).astype("float32")
    np.testing.assert_array_equal(model(x).numpy(), x)
    assert model.count_params() == 0


@pytest.mark.parametrize("dim, error", [(0, ValueError), (2.0, TypeError)])
def test_feature_input_rejects_bad_dim(dim, error):
    with pytest.raises(error, match="dim"):
        feature_input(dim)


# keras_application --------------------------------------------------------


def test_keras_application_features_and_preprocessing():
    with_pre = keras_application("MobileNetV2", (32, 32, 3), weights=None)
    without = keras_application(
        "MobileNetV2", (32, 32, 3), weights=None, include_preprocessing=False
    )
    assert with_pre.output_shape == (None, 1280)
    assert isinstance(with_pre.layers[1], ApplicationPreprocessing)
    assert not any(isinstance(x, ApplicationPreprocessing) for x in without.layers)
    without.set_weights(with_pre.get_weights())
    x = np.random.default_rng(7).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    preprocessed = keras.applications.mobilenet_v2.preprocess_input(x.copy())
    assert preprocessed.min() >= -1 and preprocessed.max() <= 1
    np.testing.assert_allclose(
        with_pre(x).numpy(), without(preprocessed).numpy(), rtol=1e-4, atol=1e-5
    )


def test_application_preprocessing_layer_matches_keras_and_serializes():
    x = np.random.default_rng(8).uniform(0, 255, (2, 4, 4, 3)).astype("float32")
    layer = ApplicationPreprocessing("VGG16")
    expected = keras.applications.vgg16.preprocess_input(x.copy())
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-6)
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert clone.application == "VGG16"
    np.testing.assert_allclose(clone(x).numpy(), expected, rtol=1e-6)


def test_keras_application_max_pooling_and_other_networks():
    model = keras_application("VGG16", (32, 32, 3), weights=None, pooling="max")
    assert model.output_shape == (None, 512)
    assert keras_application(
        "EfficientNetB0", (32, 32, 3), weights=None
    ).output_shape == (None, 1280)


@pytest.mark.parametrize("trainable", [0, 4, 10_000])
def test_keras_application_last_layers_trainable(trainable):
    model = keras_application("VGG16", (32, 32, 3), weights=None, trainable=trainable)
    flags = [layer.trainable for layer in model.layers]
    cut = max(len(flags) - trainable, 0)
    assert flags == [False] * cut + [True] * (len(flags) - cut)
    expected = {id(w) for layer in model.layers[cut:] for w in layer.trainable_weights}
    assert {id(w) for w in model.trainable_weights} == expected
    if trainable == 4:  # block5_conv2, block5_conv3, block5_pool, pooling
        assert len(model.trainable_weights) == 4


def test_keras_application_frozen_and_trainable_flags():
    frozen = keras_application("VGG16", (32, 32, 3), weights=None, trainable=False)
    assert frozen.trainable_weights == []
    full = keras_application("VGG16", (32, 32, 3), weights=None, trainable=True)
    assert len(full.trainable_weights) == 26


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"name": "ResNet51"}, ValueError, r"ResNet51.*valid names.*MobileNetV2"),
        ({"name": 3}, ValueError, "valid names"),
        ({"pooling": None}, ValueError, "pooling"),
        ({"trainable": -1}, ValueError, "trainable"),
        ({"trainable": 1.5}, TypeError, "trainable"),
        ({"input_shape": (32, 32)}, ValueError, "input_shape"),
        ({"weights": "/nonexistent/w.h5"}, FileNotFoundError, "nonexistent"),
        ({"include_preprocessing": "yes"}, TypeError, "include_preprocessing"),
    ],
)
def test_keras_application_rejects_bad_arguments(kwargs, error, match):
    arguments = {"name": "VGG16", "input_shape": (32, 32, 3), "weights": None}
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        keras_application(**arguments)


def test_keras_application_offline_imagenet_weights_fail_clearly(tmp_path, monkeypatch):
    from keras.src.backend import config
    from keras.src.utils import file_utils

    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(config, "_KERAS_DIR", str(tmp_path))
    monkeypatch.setattr(file_utils, "urlretrieve", offline)
    with pytest.raises(
        OSError, match=r"ImageNet weights of VGG16.*weights=None"
    ) as info:
        keras_application("VGG16", (32, 32, 3), weights="imagenet")
    assert str(info.value).count("\n") == 0 and info.value.reason == "no network"
    assert len(calls) == 1
    assert not os.listdir(tmp_path / "models")  # nothing half-written left

    # The command line says it in its own words, leaves no folder, exit 2.
    from served import picture_folder

    from subic_keras.cli import main

    picture_folder(tmp_path / "photos", n=30)
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--images", str(tmp_path / "photos"), "--backbone",
              "mobilenet_v3_small", "--weights", "imagenet", "--output-dir",
              str(output)])  # fmt: skip
    assert exit_info.value.code == 2 and not output.exists()


def test_a_network_trained_from_scratch_gets_settling_batch_norm(tmp_path):
    # Keras's MobileNetV3 moves its averages by 0.1 % a step: on a small
    # folder they never leave their initial values (validation at chance).
    scratch = keras_application("MobileNetV3Small", (32, 32, 3), weights=None)
    momenta = {
        layer.momentum
        for layer in scratch.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    }
    assert momenta == {applications.FROM_SCRATCH_BN_MOMENTUM}
    keras.applications.MobileNetV3Small(
        include_top=False, weights=None, input_shape=(32, 32, 3)
    ).save_weights(tmp_path / "w.weights.h5")
    pretrained = keras_application(
        "MobileNetV3Small", (32, 32, 3), weights=str(tmp_path / "w.weights.h5")
    )
    assert {
        layer.momentum
        for layer in pretrained.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    } == {0.999}


# LiteRTFeatureExtractor ---------------------------------------------------


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
