"""MobileNet v1 rebuilt from the quantized LiteRT extractor (models/mobilenet.py)."""

import keras
import numpy as np
import pytest

from subic_keras.models import mobilenet
from subic_keras.models.litert import interpreter_class

MOBILENET = "mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"


@pytest.fixture(scope="module")
def tflite(shared_data_dir):
    return str(shared_data_dir / MOBILENET)


@pytest.fixture(scope="module")
def pictures():
    # Smooth pictures with edges (random noise is far from what it was
    # trained on, and its activations sit at the quantization's floor).
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:224, 0:224] / 224.0
    out = []
    for _ in range(4):
        a, b, c = rng.uniform(2, 12, 3)
        base = np.stack(
            [np.sin(a * x + b * y), np.cos(b * x - c * y), np.sin(c * x * y)], -1
        )
        base[(x - rng.uniform(0.2, 0.8)) ** 2 + (y - 0.5) ** 2 < 0.04] = -1
        out.append(np.clip((base + 1) * 127.5, 0, 255).astype(np.uint8))
    return np.stack(out)


def _file_features(path, pictures):
    interpreter = interpreter_class()(model_path=path)
    interpreter.allocate_tensors()
    into = interpreter.get_input_details()[0]["index"]
    out = interpreter.get_output_details()[0]
    scale, zero_point = out["quantization"]
    features = []
    for picture in pictures:
        interpreter.set_tensor(into, picture[None])
        interpreter.invoke()
        q = interpreter.get_tensor(out["index"]).reshape(-1).astype(np.float32)
        features.append(scale * (q - zero_point))
    return np.stack(features)


def test_the_float_network_agrees_with_the_files_own_outputs(tflite, pictures):
    net = mobilenet.mobilenet_v1_from_litert(tflite, (224, 224, 3), pooling="avg")
    ours = net.predict(pictures / 255.0, verbose=0)
    theirs = _file_features(tflite, pictures)
    cosine = (ours * theirs).sum(1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    # The file rounds every activation to 8 bits, 27 times over; the float
    # network does not, so they agree up to that drift, not exactly.
    assert cosine.min() > 0.93, cosine
    # A network with a block's weights misplaced agrees far less.
    broken = mobilenet.mobilenet_v1_from_litert(tflite, (224, 224, 3), pooling="avg")
    layer = broken.get_layer("Conv2d_7_pointwise")
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel[:, :, ::-1], bias])
    wrong = broken.predict(pictures / 255.0, verbose=0)
    wrong_cosine = (wrong * theirs).sum(1) / (
        np.linalg.norm(wrong, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    assert wrong_cosine.max() < cosine.min() - 0.1


@pytest.mark.filterwarnings("ignore:Warning. Enabling `experimental_preserve")
def test_the_first_convolution_is_the_files_to_its_rounding(tflite, pictures):
    net = mobilenet.mobilenet_v1_from_litert(tflite, (224, 224, 3), blocks=1)
    first = keras.Model(net.inputs, net.get_layer("Conv2d_0_relu6").output)
    ours = first.predict(pictures[:1] / 255.0, verbose=0)
    interpreter = interpreter_class()(
        model_path=tflite, experimental_preserve_all_tensors=True
    )
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], pictures[:1])
    interpreter.invoke()
    details = next(
        d
        for d in interpreter.get_tensor_details()
        if d["name"].split(";")[0].endswith("Conv2d_0/Relu6")
    )
    scale, zero_point = details["quantization"]
    theirs = scale * (interpreter.get_tensor(details["index"]) - zero_point)
    assert ours.shape == theirs.shape == (1, 112, 112, 32)
    # Within about one step of the activation's 8 bits (6 / 255).
    assert np.abs(ours - theirs).mean() < scale
    assert np.percentile(np.abs(ours - theirs), 99) <= 2 * scale


def test_weights_come_in_keras_layouts(tflite):
    weights = mobilenet.litert_weights(tflite)
    assert len(weights) == 27
    assert weights["Conv2d_0"][0].shape == (3, 3, 3, 32)
    assert weights["Conv2d_1_depthwise"][0].shape == (3, 3, 32, 1)
    assert weights["Conv2d_13_pointwise"][0].shape == (1, 1, 1024, 1024)
    assert all(w.dtype == np.float32 for pair in weights.values() for w in pair)


def test_fewer_blocks_smaller_pictures_and_gem(tflite):
    net = mobilenet.mobilenet_v1_from_litert(tflite, (64, 64, 3), blocks=11)
    assert net.output_shape == (None, 512)
    assert net.get_layer("Conv2d_11_pointwise").output.shape[1:3] == (4, 4)
    assert all(layer.trainable for layer in net.layers)
    out = net.predict(np.full((2, 64, 64, 3), 0.5, np.float32), verbose=0)
    assert np.isfinite(out).all() and (out >= 0).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"blocks": 0}, "blocks must be >= 1, received 0"),
        ({"blocks": 14}, "blocks must be at most 13, received 14"),
        ({"pooling": "max"}, "pooling must be one of ('gem', 'avg'), received 'max'"),
        ({"input_shape": (64, 64, 1)}, "received (64, 64, 1)"),
        ({"input_shape": (16, 16, 3)}, "received (16, 16, 3)"),
    ],
)
def test_bad_arguments_are_named(tflite, kwargs, message):
    with pytest.raises(ValueError) as error:
        mobilenet.mobilenet_v1_from_litert(tflite, **kwargs)
    assert message in str(error.value)


def test_a_file_that_is_not_a_mobilenet_is_refused(tmp_path):
    # A LiteRT file of one float op: a model, but no MobileNet v1.
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def double(x):
        return 2.0 * x

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [double.get_concrete_function()], double
    )
    path = tmp_path / "double.tflite"
    path.write_bytes(converter.convert())
    with pytest.raises(ValueError, match="is not a quantized MobileNet v1: no weights"):
        mobilenet.litert_weights(path)


def test_gem_pooling():
    layer = mobilenet.GeneralizedMeanPooling(p=3.0)
    x = np.random.default_rng(0).uniform(0, 2, (2, 3, 3, 4)).astype("float32")
    expected = np.mean(x**3, axis=(1, 2)) ** (1 / 3)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5)
    one = mobilenet.GeneralizedMeanPooling(p=1.0)
    np.testing.assert_allclose(one(x), x.mean(axis=(1, 2)), rtol=1e-5)
    clone = mobilenet.GeneralizedMeanPooling.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="p must be > 0, received 0"):
        mobilenet.GeneralizedMeanPooling(p=0)
