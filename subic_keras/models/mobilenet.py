"""MobileNet v1 rebuilt in Keras from a quantized LiteRT (TFLite) file, as a
trainable float network with that file's ImageNet weights.

A quantized MobileNet v1 (Howard et al., 2017) keeps every convolution's
weights as uint8 with one `(scale, zero_point)` per tensor and BatchNorm
folded into them and an int32 bias: the float network is
`w = scale · (q − zero_point)`, `b = scale_b · q_b`, each convolution
followed by ReLU6 as in the file. `mobilenet_v1_from_litert` reads those
tensors by their graph names and puts them into the same layers in Keras,
so that an ImageNet network is at hand offline to fine-tune
(`subic_keras.instance`'s copy codes). Its features agree with the file's
own outputs up to the file's activation quantization
(`tests/models/test_mobilenet.py` measures it).
"""

from __future__ import annotations

import os
import re
import sys

import keras
import numpy as np
from keras import layers, ops

from subic_keras._validation import check_image_shape, check_int
from subic_keras.models.litert import interpreter_class

# The strides of the 13 depthwise-separable blocks (Howard et al., Table 1).
STRIDES = (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1)
_NAME = re.compile(r"MobilenetV1/MobilenetV1/(Conv2d_\d+)(?:_(depthwise|pointwise))?/")
POOLINGS = ("gem", "avg")


@keras.saving.register_keras_serializable(package="subic_keras")
class GeneralizedMeanPooling(keras.layers.Layer):
    """GeM pooling (Radenović et al., TPAMI 2018), `(mean_hw x^p)^(1/p)` per
    channel, with `p` learned: 1 is average pooling, large `p` approaches
    max pooling; copy detectors (SSCD) pool with it at `p = 3`.

    Example:

    >>> tuple(GeneralizedMeanPooling()(np.ones((2, 3, 3, 8), "float32")).shape)
    (2, 8)

    Args:
        p: the initial exponent, > 0.
        epsilon: the least activation pooled, so that `x^p` has a gradient.
    """

    def __init__(self, p: float = 3.0, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        if not p > 0:
            raise ValueError(f"p must be > 0, received {p!r}")
        self.initial_p = float(p)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.p = self.add_weight(
            name="p",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_p),
        )

    def call(self, x):
        p = ops.cast(self.p, x.dtype)
        x = ops.maximum(x, ops.cast(self.epsilon, x.dtype))
        return ops.power(ops.mean(ops.power(x, p), axis=(1, 2)), 1.0 / p)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(p=self.initial_p, epsilon=self.epsilon)
        return config


def litert_weights(path: str | os.PathLike) -> dict[str, list[np.ndarray]]:
    """The float weights of a quantized MobileNet v1 LiteRT file, by layer.

    Example:

    >>> weights = litert_weights(
    ...     "data/mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"
    ... )
    >>> len(weights), weights["Conv2d_1_depthwise"][0].shape
    (27, (3, 3, 32, 1))

    Returns:
        `{"Conv2d_0": [kernel, bias], "Conv2d_1_depthwise": ..., ...}`,
        dequantized and in Keras's layouts (`(h, w, in, out)`; depthwise
        `(h, w, channels, 1)`).

    Raises:
        ValueError: for a file that is not a quantized MobileNet v1 of 27
            convolutions.
    """
    interpreter = _interpreter(os.fspath(path))
    found: dict[str, dict[str, np.ndarray]] = {}
    for details in interpreter.get_tensor_details():
        # A fused tensor is named by its ops joined with ";": the first says
        # what it is (a folded kernel or bias, or an activation).
        name = details["name"].split(";")[0]
        match = _NAME.match(name)
        if match is None or not name.endswith(("_Fold", "_Fold/bias")):
            continue
        kind = "bias" if name.endswith("/bias") else "kernel"
        layer = "_".join(x for x in match.groups() if x)
        scale, zero_point = details["quantization"]
        if not scale:
            raise ValueError(f"{name!r} in {os.fspath(path)!r} is not quantized")
        q = interpreter.get_tensor(details["index"]).astype(np.float64)
        found.setdefault(layer, {})[kind] = (scale * (q - zero_point)).astype("float32")
    expected = {"Conv2d_0"} | {
        f"Conv2d_{i}_{kind}"
        for i in range(1, 14)
        for kind in ("depthwise", "pointwise")
    }
    missing = sorted(expected - {k for k, v in found.items() if len(v) == 2})
    if missing:
        raise ValueError(
            f"{os.fspath(path)!r} is not a quantized MobileNet v1: no weights "
            f"for {missing[:3]}{' ...' if len(missing) > 3 else ''}"
        )
    weights = {}
    for layer in expected:
        kernel, bias = found[layer]["kernel"], found[layer]["bias"]
        if layer.endswith("depthwise"):  # (1, h, w, c) -> (h, w, c, 1)
            kernel = kernel[0][..., None]
        else:  # (out, h, w, in) -> (h, w, in, out)
            kernel = kernel.transpose(1, 2, 3, 0)
        weights[layer] = [kernel, bias]
    return weights


def mobilenet_v1_from_litert(
    path: str | os.PathLike,
    input_shape: tuple[int, int, int] = (96, 96, 3),
    *,
    blocks: int = 13,
    pooling: str = "gem",
    name: str = "mobilenet_v1",
) -> keras.Model:
    """A float Keras MobileNet v1 (1.0) with a quantized LiteRT file's weights.

    The network is the file's: `(x − 128) / 128` of the 0–255 pixels, a 3 × 3
    convolution of stride 2, then depthwise-separable blocks (`STRIDES`),
    each convolution with its folded bias and ReLU6, "same" padding, then
    pooled. Its inputs are pictures in `[0, 1]`, as every backbone of the
    package takes them.

    Example:

    >>> net = mobilenet_v1_from_litert(
    ...     "data/mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
    ...     (64, 64, 3),
    ...     blocks=11,
    ... )
    >>> net.output_shape
    (None, 512)

    Args:
        path: the `.tflite` file of a quantized MobileNet v1 (1.0), for
            instance Google's 224 × 224 ImageNet embedding extractor.
        input_shape: `(height, width, 3)`, any size of 32 and more (the
            weights are the same at every size).
        blocks: how many of the 13 depthwise-separable blocks to keep
            (1–13): fewer is faster and keeps more of the picture's layout.
        pooling: `"gem"` (`GeneralizedMeanPooling`, p = 3) or `"avg"` (the
            file's own).
        name: the model's name.

    Returns:
        A `keras.Model` from `(n, *input_shape)` pictures to `(n, channels)`
        features; every layer trainable.
    """
    input_shape = check_image_shape("input_shape", input_shape)
    if input_shape[-1] != 3 or min(input_shape[:2]) < 32:
        raise ValueError(
            "input_shape must be (height, width, 3) with height and width >= 32, "
            f"received {input_shape}"
        )
    blocks = check_int("blocks", blocks, minimum=1)
    if blocks > len(STRIDES):
        raise ValueError(f"blocks must be at most {len(STRIDES)}, received {blocks}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, received {pooling!r}")
    weights = litert_weights(path)
    inputs = keras.Input(shape=input_shape, name="images")
    # The file's input quantization: q = pixel, real = (q - 128) / 128.
    x = layers.Rescaling(255.0 / 128.0, offset=-1.0, name="to_signed")(inputs)
    convolutions = [layers.Conv2D(32, 3, strides=2, padding="same", name="Conv2d_0")]
    x = _relu6(convolutions[0](x), "Conv2d_0")
    channels = [64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024]
    for i in range(1, blocks + 1):
        depthwise = layers.DepthwiseConv2D(
            3, strides=STRIDES[i - 1], padding="same", name=f"Conv2d_{i}_depthwise"
        )
        x = _relu6(depthwise(x), depthwise.name)
        pointwise = layers.Conv2D(channels[i - 1], 1, name=f"Conv2d_{i}_pointwise")
        x = _relu6(pointwise(x), pointwise.name)
        convolutions += [depthwise, pointwise]
    if pooling == "gem":
        outputs = GeneralizedMeanPooling(name="gem")(x)
    else:
        outputs = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    model = keras.Model(inputs, outputs, name=name)
    for layer in convolutions:
        layer.set_weights(weights[layer.name])
    return model


def _interpreter(path: str):
    """An interpreter whose constant tensors can be read: without the XNNPACK
    delegate, which takes them over."""
    cls = interpreter_class()
    resolver = sys.modules[cls.__module__].OpResolverType
    interpreter = cls(
        model_path=path,
        experimental_op_resolver_type=resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    return interpreter


def _relu6(x, name: str):
    return layers.ReLU(6.0, name=f"{name}_relu6")(x)
