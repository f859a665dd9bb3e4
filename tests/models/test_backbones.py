"""Tests of subic_keras.models.backbones."""

from __future__ import annotations

import math
import os
import urllib.error

import keras
import numpy as np
import pytest
from litert_helpers import run_tflite, tflite_bytes

from subic_keras.models import applications, backbones
from subic_keras.models.backbones import (
    ApplicationPreprocessing,
    LocalResponseNormalization,
    dsh_cnn,
    feature_input,
    keras_application,
)

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
