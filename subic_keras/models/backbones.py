"""Backbones, SuBiC's `f1`: networks that map inputs to feature vectors.

SuBiC's encoder (`FC0` and the block non-linearity) is put on top of one of:

- `dsh_cnn`: the small CIFAR-10 CNN of DSH (Liu et al., CVPR 2016), trained
  from scratch, with Caffe-style within-channel local response normalization
  (`LocalResponseNormalization`);
- `keras_application`: a `keras.applications` network, pooled to a vector;
- `feature_input`: the identity on precomputed feature vectors;
- `mlp_backbone`: a two-layer perceptron, for tiny images (8x8 digits);
- `LiteRTFeatureExtractor`: a frozen LiteRT (TFLite) feature extractor run
  outside Keras, whose outputs are cached on disk and fed to `feature_input`;
- `mobilenet_v1_from_litert`: MobileNet v1 with the ImageNet weights of a
  quantized LiteRT file, rebuilt as a trainable float Keras network.
"""

from __future__ import annotations

import keras
from keras import layers, ops

from subic_keras._validation import check_image_shape, check_int, check_non_negative

# Re-exported: the backbones of other modules, named here with the rest.
from subic_keras.models.applications import (
    ApplicationPreprocessing as ApplicationPreprocessing,
)
from subic_keras.models.applications import keras_application as keras_application
from subic_keras.models.litert_features import (
    LiteRTFeatureExtractor as LiteRTFeatureExtractor,
)
from subic_keras.models.mobilenet import (
    mobilenet_v1_from_litert as mobilenet_v1_from_litert,
)


@keras.saving.register_keras_serializable(package="subic_keras")
class LocalResponseNormalization(keras.layers.Layer):
    """Caffe's within-channel local response normalization (`WITHIN_CHANNEL`).

    Each channel is normalized by the energy of an `n x n` spatial window
    around every position:

    `y = x / (1 + (alpha / n^2) * sum_{n x n window} x^2) ^ beta`

    The input is zero-padded by `(n - 1) / 2` on each side and the sum is
    always divided by `n^2`, as Caffe counts the padded zeros. The layer is
    built from `pad`, `average_pool` and `power`, which convert to LiteRT
    builtin operators (no Select TF ops).

    Example:

    >>> layer = LocalResponseNormalization(size=3, alpha=5e-5, beta=0.75)
    >>> tuple(layer(np.ones((1, 4, 4, 2), "float32")).shape)
    (1, 4, 4, 2)

    Args:
        size: the window side `n`, odd (Caffe supports only odd sizes).
        alpha: the scaling parameter `alpha >= 0`.
        beta: the exponent `beta >= 0`.
        data_format: `"channels_last"` or `"channels_first"`; defaults to
            `keras.config.image_data_format()`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).
    """

    def __init__(
        self,
        size: int = 3,
        alpha: float = 5e-5,
        beta: float = 0.75,
        data_format: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.size = check_int("size", size, minimum=1)
        if self.size % 2 == 0:
            raise ValueError(f"size must be odd, received {self.size}")
        self.alpha = check_non_negative("alpha", alpha)
        self.beta = check_non_negative("beta", beta)
        if data_format is None:
            data_format = keras.config.image_data_format()
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(
                "data_format must be 'channels_last' or 'channels_first', "
                f"received {data_format!r}"
            )
        self.data_format = data_format

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "LocalResponseNormalization expects 4D inputs (batch, height, "
                f"width, channels), received shape {tuple(input_shape)}"
            )
        super().build(input_shape)

    def call(self, inputs):
        x = inputs
        # Squares of large activations overflow in float16.
        if self.compute_dtype in ("float16", "bfloat16"):
            x = ops.cast(x, "float32")
        pad = (self.size - 1) // 2
        if self.data_format == "channels_last":
            paddings = ((0, 0), (pad, pad), (pad, pad), (0, 0))
        else:
            paddings = ((0, 0), (0, 0), (pad, pad), (pad, pad))
        # Pooling the explicitly zero-padded squares with "valid" padding
        # divides every window by n^2; "same" pooling would count only the
        # valid positions at the borders, unlike Caffe.
        mean_square = ops.average_pool(
            ops.pad(ops.square(x), paddings),
            pool_size=self.size,
            strides=1,
            padding="valid",
            data_format=self.data_format,
        )
        y = x * ops.power(1.0 + self.alpha * mean_square, -self.beta)
        return ops.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "size": self.size,
                "alpha": self.alpha,
                "beta": self.beta,
                "data_format": self.data_format,
            }
        )
        return config


def _caffe_pool(x, kind: str, name: str):
    """Caffe's ceil-mode 3x3 stride-2 pooling (no padding) of a Keras tensor.

    Caffe gives `ceil((size - 3) / 2) + 1` outputs per spatial axis, windows
    starting at `0, 2, 4, ...`, the last one clipped to the image (and an
    average over its in-image values only). On an even axis this is exactly
    `padding="same"` (which then pads only after the end); on an odd axis it
    is `padding="valid"`. When the two axes differ in parity, the odd one is
    padded by one row or column, pooled with "same" and the extra output,
    the only one that sees the padding, is cropped.
    """
    pooling = {"max": layers.MaxPooling2D, "avg": layers.AveragePooling2D}[kind]
    height, width = x.shape[1], x.shape[2]
    odd = (height % 2, width % 2)
    if odd == (0, 0):
        return pooling(3, 2, padding="same", name=name)(x)
    if odd == (1, 1):
        return pooling(3, 2, padding="valid", name=name)(x)
    padding = ((0, odd[0]), (0, odd[1]))
    x = layers.ZeroPadding2D(padding, name=f"{name}_pad")(x)
    x = pooling(3, 2, padding="same", name=name)(x)
    return layers.Cropping2D(padding, name=f"{name}_crop")(x)


def dsh_cnn(
    input_shape: tuple[int, int, int] = (32, 32, 3),
    name: str = "dsh_cnn",
    width: int = 1,
) -> keras.Model:
    """The CIFAR-10 base CNN of DSH (Liu et al., CVPR 2016), used by SuBiC.

    conv 32 5x5 pad 2 -> max-pool 3/2 -> ReLU -> LRN -> conv 32 5x5 pad 2 ->
    avg-pool 3/2 -> ReLU -> LRN -> conv 64 5x5 pad 2 -> ReLU -> avg-pool 3/2
    -> flatten -> FC 500 + ReLU; `width` multiplies the convolutions'
    channels (1: DSH's network).

    The pools reproduce Caffe's ceil-mode pooling (32 -> 16 -> 8 -> 4; 28 ->
    14 -> 7 -> 3), see `_caffe_pool`. LRN is
    `LocalResponseNormalization(size=3, alpha=5e-5, beta=0.75)`. Weights use
    Keras's default initializers.

    Example:

    >>> model = dsh_cnn((32, 32, 3))
    >>> model.output_shape
    (None, 500)

    Args:
        input_shape: `(height, width, channels)` of the (channels-last) images.
        name: the model's name.
        width: the channels' multiplier, >= 1.

    Returns:
        A `keras.Model` mapping images to 500-d non-negative features; the
        feature layer is named `"fc"`.
    """
    input_shape = check_image_shape("input_shape", input_shape)
    width = check_int("width", width, minimum=1)
    if min(input_shape[:2]) < 8:
        # Smaller images leave the third pool an empty input, as in Caffe.
        raise ValueError(
            f"input_shape height and width must be >= 8, received {input_shape}"
        )
    inputs = keras.Input(shape=input_shape, name="images")
    x = layers.Conv2D(32 * width, 5, padding="same", name="conv1")(inputs)
    x = _caffe_pool(x, "max", name="pool1")
    x = layers.ReLU(name="relu1")(x)
    x = LocalResponseNormalization(name="norm1")(x)
    x = layers.Conv2D(32 * width, 5, padding="same", name="conv2")(x)
    x = _caffe_pool(x, "avg", name="pool2")
    x = layers.ReLU(name="relu2")(x)
    x = LocalResponseNormalization(name="norm2")(x)
    x = layers.Conv2D(64 * width, 5, padding="same", name="conv3")(x)
    x = layers.ReLU(name="relu3")(x)
    x = _caffe_pool(x, "avg", name="pool3")
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Dense(500, activation="relu", name="fc")(x)
    return keras.Model(inputs, outputs, name=name)


def feature_input(dim: int, name: str = "features") -> keras.Model:
    """The identity backbone, for SuBiC trained on precomputed features.

    Example:

    >>> feature_input(1024).output_shape
    (None, 1024)

    Args:
        dim: the feature dimension `d >= 1`.
        name: the model's name (also its input's).

    Returns:
        A `keras.Model` whose output is its `(batch, dim)` input.
    """
    dim = check_int("dim", dim, minimum=1)
    inputs = keras.Input(shape=(dim,), name=name)
    return keras.Model(inputs, inputs, name=name)


def mlp_backbone(
    input_shape, units: int = 256, depth: int = 2, name: str = "mlp"
) -> keras.Model:
    """A perceptron of `depth` ReLU layers on flattened inputs.

    For tiny images (digits) and for a trainable head on precomputed
    features (the paper's 3-layer SuBiC on VGG-128 features, Sec. 4.2).

    Example:

    >>> mlp_backbone((1024,), units=128, depth=1).output_shape
    (None, 128)

    Args:
        input_shape: the shape of one input, e.g. `(28, 28, 1)` or `(1024,)`.
        units: the width of every layer.
        depth: the number of `Dense(units, relu)` layers, >= 1.
        name: the model's name.

    Returns:
        A `keras.Sequential` mapping inputs to `(batch, units)` features.
    """
    units = check_int("units", units, minimum=1)
    depth = check_int("depth", depth, minimum=1)
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            keras.layers.Flatten(),
            *(keras.layers.Dense(units, activation="relu") for _ in range(depth)),
        ],
        name=name,
    )
