"""Backbones, SuBiC's `f1`: networks that map inputs to feature vectors.

SuBiC's encoder (`FC0` and the block non-linearity) is put on top of one of:

- `dsh_cnn`: the small CIFAR-10 CNN of DSH (Liu et al., CVPR 2016), trained
  from scratch, with Caffe-style within-channel local response normalization
  (`LocalResponseNormalization`);
- `keras_application`: a `keras.applications` network, pooled to a vector;
- `feature_input`: the identity on precomputed feature vectors;
- `mlp_backbone`: a two-layer perceptron, for tiny images (8x8 digits);
- `LiteRTFeatureExtractor`: a frozen LiteRT (TFLite) feature extractor run
  outside Keras, whose outputs are cached on disk and fed to `feature_input`.
"""

from __future__ import annotations

import contextlib
import hashlib
import numbers
import os
import socket
import sys
from collections.abc import Iterator

import keras
import numpy as np
from keras import layers, ops

from subic_keras._io import atomic_path
from subic_keras._validation import check_int, check_non_negative

# Bumped whenever the extractor's preprocessing changes, so that stale caches
# computed the old way are never returned.
_CACHE_VERSION = 1
_RESIZE_METHOD = "bilinear"


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


def _check_image_shape(name: str, shape) -> tuple[int, int, int]:
    """Returns `shape` as a `(height, width, channels)` tuple of positive ints."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(
            f"{name} must be a (height, width, channels) tuple, received {shape!r}"
        )
    height, width, channels = (
        check_int(f"{name}[{i}]", v, minimum=1) for i, v in enumerate(shape)
    )
    return height, width, channels


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
    input_shape: tuple[int, int, int] = (32, 32, 3), name: str = "dsh_cnn"
) -> keras.Model:
    """The CIFAR-10 base CNN of DSH (Liu et al., CVPR 2016), used by SuBiC.

    conv 32 5x5 pad 2 -> max-pool 3/2 -> ReLU -> LRN -> conv 32 5x5 pad 2 ->
    avg-pool 3/2 -> ReLU -> LRN -> conv 64 5x5 pad 2 -> ReLU -> avg-pool 3/2
    -> flatten -> FC 500 + ReLU.

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

    Returns:
        A `keras.Model` mapping images to 500-d non-negative features; the
        feature layer is named `"fc"`.
    """
    input_shape = _check_image_shape("input_shape", input_shape)
    if min(input_shape[:2]) < 8:
        # Smaller images leave the third pool an empty input, as in Caffe.
        raise ValueError(
            f"input_shape height and width must be >= 8, received {input_shape}"
        )
    inputs = keras.Input(shape=input_shape, name="images")
    x = layers.Conv2D(32, 5, padding="same", name="conv1")(inputs)
    x = _caffe_pool(x, "max", name="pool1")
    x = layers.ReLU(name="relu1")(x)
    x = LocalResponseNormalization(name="norm1")(x)
    x = layers.Conv2D(32, 5, padding="same", name="conv2")(x)
    x = _caffe_pool(x, "avg", name="pool2")
    x = layers.ReLU(name="relu2")(x)
    x = LocalResponseNormalization(name="norm2")(x)
    x = layers.Conv2D(64, 5, padding="same", name="conv3")(x)
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


def _application_names() -> list[str]:
    return sorted(
        n
        for n in dir(keras.applications)
        if n[:1].isupper() and callable(getattr(keras.applications, n))
    )


def _application(name):
    """Returns the constructor and the `preprocess_input` of an application."""
    if not isinstance(name, str) or name not in _application_names():
        raise ValueError(
            f"unknown keras.applications network {name!r}; valid names: "
            + ", ".join(_application_names())
        )
    constructor = getattr(keras.applications, name)
    # The public submodule shares the constructor's module name, e.g.
    # keras.src.applications.mobilenet_v3 -> keras.applications.mobilenet_v3.
    module_name = constructor.__module__.rsplit(".", 1)[-1]
    module = getattr(keras.applications, module_name, None)
    if module is None or not hasattr(module, "preprocess_input"):
        raise ValueError(f"no preprocess_input found for keras.applications.{name}")
    return constructor, module.preprocess_input


@keras.saving.register_keras_serializable(package="subic_keras")
class ApplicationPreprocessing(keras.layers.Layer):
    """`keras.applications.<module>.preprocess_input` of a network, as a layer.

    Networks that normalize inside themselves (EfficientNet, EfficientNetV2,
    ConvNeXt, MobileNetV3) have an identity `preprocess_input`.

    Example:

    >>> layer = ApplicationPreprocessing("MobileNetV2")
    >>> float(layer(np.full((1, 2, 2, 3), 255.0, "float32"))[0, 0, 0, 0])
    1.0

    Args:
        application: a `keras.applications` network name, e.g. `"ResNet50"`.
        **kwargs: base layer arguments.
    """

    def __init__(self, application: str, **kwargs):
        super().__init__(**kwargs)
        self._preprocess = _application(application)[1]
        self.application = application

    def call(self, inputs):
        return self._preprocess(ops.cast(inputs, self.compute_dtype))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config["application"] = self.application
        return config


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    """Bounds a download that would otherwise hang on an unanswered connection."""
    previous = socket.getdefaulttimeout()
    if previous is None:
        socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        if previous is None:
            socket.setdefaulttimeout(None)


def keras_application(
    name: str,
    input_shape: tuple[int, int, int] = (224, 224, 3),
    weights: str | None = "imagenet",
    pooling: str = "avg",
    trainable: bool | int = True,
    include_preprocessing: bool = True,
) -> keras.Model:
    """A `keras.applications` network without its classifier, as a backbone.

    The model takes raw `0..255` float RGB images when `include_preprocessing`
    (the network's own `preprocess_input` is its first layer) and returns the
    globally pooled last feature map, a vector.

    Example:

    >>> model = keras_application("MobileNetV2", (32, 32, 3), weights=None)
    >>> model.output_shape
    (None, 1280)

    Args:
        name: the network's name in `keras.applications`, e.g. `"MobileNet"`,
            `"MobileNetV2"`, `"ResNet50"`, `"VGG16"`, `"EfficientNetB0"`.
        input_shape: `(height, width, 3)`.
        weights: `"imagenet"` (taken from the Keras cache, `~/.keras/models`,
            or downloaded), a path to a weights file, or `None` (random).
        pooling: `"avg"` or `"max"` global pooling.
        trainable: `True` (all layers), `False` (frozen), or an int `n >= 0`:
            only the last `n` layers of the returned model are trainable
            (pooling and activation layers count as layers).
        include_preprocessing: put `preprocess_input` inside the model; if
            False, inputs must already be preprocessed.

    Returns:
        A `keras.Model` mapping `(batch, *input_shape)` images to features.

    Raises:
        ValueError: for an unknown name or bad arguments.
        RuntimeError: when `weights="imagenet"` are neither cached nor
            downloadable (e.g. no network).
    """
    constructor, _ = _application(name)
    input_shape = _check_image_shape("input_shape", input_shape)
    if pooling not in ("avg", "max"):
        raise ValueError(f"pooling must be 'avg' or 'max', received {pooling!r}")
    if not isinstance(trainable, bool):
        trainable = check_int("trainable", trainable, minimum=0)
    if not isinstance(include_preprocessing, bool):
        raise TypeError(
            f"include_preprocessing must be a bool, received {include_preprocessing!r}"
        )
    if weights is not None and not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            f"weights must be 'imagenet', a file path or None, received {weights!r}"
        )
    if weights is not None and weights != "imagenet":
        weights = os.fspath(weights)
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"weights file not found: {weights!r}")

    inputs = keras.Input(shape=input_shape, name="images")
    x = inputs
    if include_preprocessing:
        x = ApplicationPreprocessing(name, name="preprocessing")(x)
    try:
        with _socket_timeout(60.0):
            model = constructor(
                include_top=False, weights=weights, input_tensor=x, pooling=pooling
            )
    except Exception as error:
        if weights == "imagenet" and (
            isinstance(error, OSError) or "URL fetch failure" in str(error)
        ):
            cache = os.path.join(
                os.environ.get("KERAS_HOME", os.path.join("~", ".keras")), "models"
            )
            raise RuntimeError(
                f"could not obtain the ImageNet weights of {name}: they are not in "
                f"the Keras cache ({cache}) and downloading them failed ({error}). "
                "Copy the weights file into that directory from a machine with "
                "network access, pass a local weights file, or use weights=None."
            ) from error
        raise

    # The applications list their inputs; a single input keeps calls on a bare
    # tensor free of Keras's structure warning.
    model = keras.Model(inputs, model.outputs[0], name=model.name)
    if isinstance(trainable, bool):
        model.trainable = trainable
    else:
        model.trainable = True
        cut = max(len(model.layers) - trainable, 0)
        for layer in model.layers[:cut]:
            layer.trainable = False
    return model


def _interpreter_class():
    """LiteRT's interpreter, or TensorFlow's where `ai-edge-litert` is absent."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter


def _quantization(details: dict) -> tuple[float, int]:
    """Per-tensor `(scale, zero_point)`; scale 0 for a float tensor."""
    params = details.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", []))
    if scales.size > 1:
        raise ValueError(
            f"per-channel quantized tensor {details['name']!r} is not supported"
        )
    scale, zero_point = details["quantization"]
    return float(scale), int(zero_point)


class LiteRTFeatureExtractor:
    """Runs a LiteRT (TFLite) image feature extractor on uint8 images.

    Images are replicated to RGB if grey, resized to the model's input size
    with bilinear interpolation, then normalized as `(pixel - input_mean) /
    input_std` and, for a quantized input, quantized with the input tensor's
    own `(scale, zero_point)`: `q = round(real / scale + zero_point)`. By
    default the normalization is the one the quantization implies for raw
    pixels, `pixel -> q = pixel` for uint8 inputs (`pixel - 128` for int8),
    and `(pixel - 127.5) / 127.5` for float inputs. Quantized outputs are
    dequantized with the output tensor's `(scale, zero_point)`:
    `feature = scale * (q - zero_point)`.

    An interpreter is not thread-safe: use one extractor per thread.

    Example:

    >>> extractor = LiteRTFeatureExtractor(
    ...     "data/mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
    ...     num_threads=1,
    ... )
    >>> features = extractor.extract(images, cache_dir="cache")  # uint8 RGB
    >>> features.shape, features.dtype
    ((64, 1024), dtype('float32'))

    Args:
        model_path: the `.tflite` file; one rank-4 image input
            `(batch, height, width, 3)`, any batch size.
        num_threads: CPU threads of the interpreter (`None`: its default).
        input_mean: the pixel value mapped to 0 (see above); `None` derives it.
        input_std: the pixel range mapped to 1 (see above); `None` derives it.

    Raises:
        FileNotFoundError: if `model_path` does not exist.
        ValueError: if the file is not a LiteRT image model.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        num_threads: int | None = None,
        *,
        input_mean: float | None = None,
        input_std: float | None = None,
    ):
        self.model_path = os.fspath(model_path)
        if not os.path.isfile(self.model_path):
            raise FileNotFoundError(f"LiteRT model file not found: {self.model_path!r}")
        if num_threads is not None:
            num_threads = check_int("num_threads", num_threads, minimum=1)
        self.num_threads = num_threads
        with open(self.model_path, "rb") as handle:
            self._model_digest = hashlib.sha256(handle.read()).hexdigest()
        try:
            self._interpreter = _interpreter_class()(
                model_path=self.model_path, num_threads=num_threads
            )
            self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as error:
            raise ValueError(
                f"could not load LiteRT model {self.model_path!r}: {error}"
            ) from error

        inputs = self._interpreter.get_input_details()
        outputs = self._interpreter.get_output_details()
        shapes = [tuple(int(v) for v in d["shape"]) for d in inputs]
        if len(shapes) != 1 or len(shapes[0]) != 4 or shapes[0][3] != 3:
            raise ValueError(
                f"LiteRT model {self.model_path!r} must have one image input of "
                f"shape (batch, height, width, 3), received {shapes}"
            )
        self._input, self._output = inputs[0], outputs[0]
        self._input_dtype = np.dtype(self._input["dtype"])
        self._input_quantization = _quantization(self._input)
        self._output_quantization = _quantization(self._output)
        self._dynamic_batch = int(self._input["shape_signature"][0]) == -1
        self._batch = int(self._input["shape"][0])
        self._feature_dim = int(np.prod(self._output["shape"][1:]))
        self.input_mean, self.input_std = self._normalization(input_mean, input_std)

    def _normalization(self, mean, std) -> tuple[float, float]:
        """Fills in the defaults of `(input_mean, input_std)`."""
        scale, zero_point = self._input_quantization
        if self._input_dtype.kind in "iu" and scale > 0:
            # Raw pixels fill the integer range: q = pixel + qmin.
            default = (
                float(zero_point - np.iinfo(self._input_dtype).min),
                1.0 / scale,
            )
        elif self._input_dtype.kind == "f":
            default = (127.5, 127.5)
        else:
            raise ValueError(
                f"LiteRT model {self.model_path!r} has an unsupported input type "
                f"{self._input_dtype} (float or quantized integer expected)"
            )
        mean = default[0] if mean is None else mean
        std = default[1] if std is None else std
        for arg, value in (("input_mean", mean), ("input_std", std)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{arg} must be a real number, received {value!r}")
        if not np.isfinite(mean) or not np.isfinite(std) or std <= 0:
            raise ValueError(
                f"input_mean must be finite and input_std > 0, received "
                f"input_mean={mean}, input_std={std}"
            )
        return float(mean), float(std)

    @property
    def feature_dim(self) -> int:
        """The length of a feature vector."""
        return self._feature_dim

    @property
    def input_size(self) -> tuple[int, int]:
        """The model's `(height, width)`; images are resized to it."""
        return int(self._input["shape"][1]), int(self._input["shape"][2])

    def extract(
        self,
        images: np.ndarray,
        batch_size: int = 64,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
        chunk_size: int | None = None,
    ) -> np.ndarray:
        """Features of a set of images.

        Args:
            images: uint8 `(n, height, width, 3)` RGB or `(n, height, width)`
                (or `(n, height, width, 1)`) grey images.
            batch_size: images resized at once (bounds memory; the model still
                runs at its own batch size).
            cache_dir: if given, features are saved to and loaded from a `.npy`
                file there, keyed by the model file, the images and the
                preprocessing.
            progress: show a tqdm progress bar.
            chunk_size: with `cache_dir`, cache every `chunk_size` images as
                their own entry, so that an interrupted extraction of a large
                set resumes from its last finished chunk.

        Returns:
            float32 features `(n, feature_dim)`.

        Raises:
            TypeError: if `images` is not a uint8 array.
            ValueError: for a wrong image rank or channel count.
        """
        images = self._check_images(images)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        if chunk_size is not None:
            chunk_size = check_int("chunk_size", chunk_size, minimum=1)
            if cache_dir is not None and len(images) > chunk_size:
                chunks = range(0, len(images), chunk_size)
                return np.concatenate(
                    [
                        self.extract(
                            images[s : s + chunk_size], batch_size, cache_dir, progress
                        )
                        for s in chunks
                    ]
                )
        cache_path = None
        if cache_dir is not None:
            cache_path = os.path.join(
                os.fspath(cache_dir), f"litert_features_{self._cache_key(images)}.npy"
            )
            cached = self._load_cache(cache_path, len(images))
            if cached is not None:
                return cached

        from tqdm.auto import tqdm

        features = np.empty((len(images), self.feature_dim), np.float32)
        with tqdm(
            total=len(images),
            disable=not progress,
            desc=f"features ({os.path.basename(self.model_path)})",
            unit="image",
            file=sys.stderr,
        ) as bar:
            for start in range(0, len(images), batch_size):
                chunk = self._prepare(images[start : start + batch_size])
                features[start : start + len(chunk)] = self._run(chunk)
                bar.update(len(chunk))
        if cache_path is not None:
            with atomic_path(cache_path, suffix=".npy") as tmp:
                np.save(tmp, features)
        return features

    def _check_images(self, images) -> np.ndarray:
        if not isinstance(images, np.ndarray):
            raise TypeError(
                f"images must be a NumPy array, received {type(images).__name__}"
            )
        if images.dtype != np.uint8:
            raise TypeError(
                "images must be uint8 pixels in 0..255, received dtype "
                f"{images.dtype}; convert with np.clip(x, 0, 255).astype(np.uint8)"
            )
        if images.ndim == 3:
            images = images[..., np.newaxis]
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(
                "images must have shape (n, height, width, 3) or (n, height, "
                f"width), received shape {images.shape}"
            )
        if min(images.shape[1:3]) < 1:
            raise ValueError(f"images must be non-empty, received shape {images.shape}")
        return images

    def _cache_key(self, images: np.ndarray) -> str:
        key = hashlib.sha256()
        key.update(self._model_digest.encode())
        key.update(hashlib.sha256(np.ascontiguousarray(images).data).digest())
        key.update(
            repr(
                (
                    _CACHE_VERSION,
                    images.shape,
                    _RESIZE_METHOD,
                    self.input_mean,
                    self.input_std,
                )
            ).encode()
        )
        return key.hexdigest()[:40]

    def _load_cache(self, path: str, n: int) -> np.ndarray | None:
        if not os.path.isfile(path):
            return None
        try:
            features = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            return None
        if features.shape != (n, self.feature_dim) or features.dtype != np.float32:
            return None
        return features

    def _prepare(self, images: np.ndarray) -> np.ndarray:
        """Resizes, replicates grey to RGB and converts to the input's dtype."""
        import tensorflow as tf

        pixels = images
        if images.shape[1:3] != self.input_size:
            pixels = tf.image.resize(
                images, self.input_size, method=_RESIZE_METHOD
            ).numpy()
        # Bilinear resizing acts on channels independently, so grey images are
        # replicated after it, at a third of the cost.
        pixels = np.broadcast_to(pixels, (*pixels.shape[:3], 3))
        scale, zero_point = self._input_quantization
        identity = (
            self._input_dtype == np.uint8
            and pixels.dtype == np.uint8
            and (self.input_mean, self.input_std) == (zero_point, 1.0 / scale)
        )
        if identity:
            return np.ascontiguousarray(pixels)
        real = (pixels.astype(np.float32) - self.input_mean) / self.input_std
        if self._input_dtype.kind == "f":
            return real.astype(self._input_dtype)
        info = np.iinfo(self._input_dtype)
        quantized = np.rint(real / scale + zero_point)
        return np.clip(quantized, info.min, info.max).astype(self._input_dtype)

    def _run(self, inputs: np.ndarray) -> np.ndarray:
        """Features of preprocessed inputs, at the model's batch size."""
        if self._dynamic_batch:
            if len(inputs) != self._batch:
                self._interpreter.resize_tensor_input(
                    self._input["index"], [len(inputs), *self.input_size, 3]
                )
                self._interpreter.allocate_tensors()
                self._batch = len(inputs)
            return self._invoke(inputs)
        # A fixed batch (often 1) is kept rather than resized: on MobileNet v1
        # with XNNPACK, batches of 8 to 64 measured no faster per image than
        # single images, and not every model accepts another batch size.
        outputs = []
        for start in range(0, len(inputs), self._batch):
            group = inputs[start : start + self._batch]
            missing = self._batch - len(group)
            if missing:
                padding = np.zeros((missing, *group.shape[1:]), group.dtype)
                group = np.concatenate([group, padding])
            outputs.append(self._invoke(group)[: self._batch - missing])
        return np.concatenate(outputs)

    def _invoke(self, inputs: np.ndarray) -> np.ndarray:
        self._interpreter.set_tensor(self._input["index"], inputs)
        self._interpreter.invoke()
        outputs = self._interpreter.get_tensor(self._output["index"])
        outputs = outputs.reshape(len(inputs), self.feature_dim)
        scale, zero_point = self._output_quantization
        if outputs.dtype.kind in "iu" and scale > 0:
            return scale * (outputs.astype(np.float32) - zero_point)
        return outputs.astype(np.float32)
