"""Deployment of trained SuBiC models: TF Serving SavedModels and LiteRT files.

- `export_saved_model` writes TF Serving's layout
  `<base_dir>/<model_name>/<version>/{saved_model.pb, variables/}` with three
  signatures (`SAVED_MODEL_SIGNATURES`):

  - `serving_default`: float32 images `(batch, H, W, C)` in `[0, 1]` →
    `{"codes": int32 (batch, M), "query": float32 (batch, M·K),
    "class_query": float32 (batch, M·K)}`: the codes to index, the paper's
    query `z` and the class-posterior query `W₁ s`
    (`Subic.query(kind="class_posterior")`), both searched with
    `SubicIndex.search`;
  - `encode_images`: encoded images `(batch,)` (tf.string: JPEG, PNG, GIF,
    BMP or WebP, as `tf.io.decode_image` reads them; a GIF's first frame) →
    the same outputs. Each image is decoded to `C` channels (a picture with
    transparency composited over white first, as files are decoded for
    training, indexing and search), scaled by
    `1/255` (exactly the float32 values of `x.astype("float32") / 255`, as
    in training), and resized to `H×W` (bilinear, *without* keeping the
    aspect ratio; the identity when the image is already `H×W`); the
    model's own `Normalization` layer does the rest;
  - `classify`: float32 images → `{"probabilities": (batch, num_classes)}`,
    FC1 applied to the binary code `b`.

- `export_litert` writes the encoder (images → the same three outputs) as a LiteRT
  flatbuffer with builtin operators only, in float32 or with full-integer
  (int8) quantisation.

An instance code (`subic_keras.instance`, the command line's `instance`) is
exported the same way, with the outputs it has: `codes` and `query`, its
FC0 outputs (`InstanceSubic.query`, Eq. 10), in `serving_default`, `encode_images`
and the LiteRT file; it has no classes, so no `class_query` and no
`classify`.

Exported models take plain `[0, 1]` images: the standardisation is a layer of
the model. Every file is written to a temporary path beside its destination
and moved into place only when complete, so a failed export never leaves a
half-written version that TF Serving would load.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from typing import TYPE_CHECKING, Literal, overload

import keras
import numpy as np
import tensorflow as tf

from subic_keras._io import (
    atomic_directory,
    atomic_path,
    load_keras_file,
    make_folders,
)
from subic_keras._validation import check_finite, check_int
from subic_keras.data.pixels import PIXEL_LEVELS, scale_pixels
from subic_keras.models.layers import BlockArgmax, BlockSoftmax
from subic_keras.models.litert import run_litert as run_litert
from subic_keras.models.subic import BLOCK_PROBS, FC0, FC1, Subic

SAVED_MODEL_SIGNATURES = ("serving_default", "encode_images", "classify")
QUANTIZATIONS = ("float32", "int8")
# Inputs of the signatures (TF Serving's `inputs` / `instances` keys).
IMAGES = "images"
IMAGE_BYTES = "image_bytes"
if TYPE_CHECKING:
    from subic_keras.instance.instance_code import InstanceSubic

_VERSION = re.compile(r"[0-9]+")


@overload
def load_subic(model_or_path, *, instance: Literal[False] = False) -> Subic: ...
@overload
def load_subic(model_or_path, *, instance: bool) -> Subic | InstanceSubic: ...
def load_subic(model_or_path, *, instance: bool = False) -> Subic | InstanceSubic:
    """A `Subic` from a `Subic`, a SuBiC train model, or a `.keras` path.

    With `instance=True`, an instance code (`subic_keras.instance`) is taken
    too, as an `InstanceSubic`: what indexing a folder and searching it
    need of a model, an instance code has (`subic index build`, `search`,
    `serve`); classifying and evaluating by class need a class model.

    Example:

    >>> build_subic(backbones.dsh_cnn(), 8, 64, 10).train_model.save("best.keras")
    >>> subic = load_subic("best.keras")
    >>> subic.num_blocks, subic.block_size
    (8, 64)

    Args:
        model_or_path: a `Subic`, a SuBiC train model (a Keras model with the
            layers `fc0`, `block_probs` (a `BlockSoftmax`) and `fc1`), or the
            path of one saved with `model.save("….keras")`.
        instance: take an instance code's model too.

    Returns:
        The `Subic` holding the model and its test-time views.

    Raises:
        FileNotFoundError, IsADirectoryError: the path is not a file.
        TypeError: `model_or_path` is none of the above.
        ValueError: the file is not a Keras model file, or the model is not
            a SuBiC model (or, without `instance`, is an instance code's).
    """
    from subic_keras.instance.instance_code import InstanceSubic

    if isinstance(model_or_path, Subic) or (
        instance and isinstance(model_or_path, InstanceSubic)
    ):
        return model_or_path
    source = ""
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        model = load_keras_file(path, compile=False)
        source = f" loaded from {path!r}"
    elif isinstance(model_or_path, keras.Model):
        model = model_or_path
    else:
        raise TypeError(
            "model_or_path must be a Subic, a SuBiC train model or the path of "
            f"a .keras file, received {type(model_or_path).__name__}"
        )
    code = InstanceSubic.from_model(model)
    if code is not None:
        if instance:
            return code
        raise ValueError(
            f"model_or_path is an instance code{source}, which finds copies of "
            "a picture and has no classes: it indexes and searches folders "
            "(`subic index build`, `search`, `serve`) and is exported by "
            "`subic export`; this needs a class model trained by `subic train`"
        )
    layers = {layer.name: layer for layer in model.layers}
    is_subic = (
        isinstance(layers.get(FC0), keras.layers.Dense)
        and isinstance(layers.get(BLOCK_PROBS), BlockSoftmax)
        and isinstance(layers.get(FC1), keras.layers.Dense)
        and len(model.inputs) == 1
    )
    if not is_subic:
        raise ValueError(
            "model_or_path must be a SuBiC model (a SubicTrainModel with one "
            f"input and layers {FC0!r} (Dense), {BLOCK_PROBS!r} (BlockSoftmax) "
            f"and {FC1!r} (Dense)), received a {type(model).__name__} named "
            f"{model.name!r}{source} with {len(model.inputs)} input(s) and layers "
            f"{[layer.name for layer in model.layers]}"
        )
    return Subic.from_train_model(model)


def load_encoder(path: str | os.PathLike) -> Subic | InstanceSubic:
    """The model of an index of pictures: a class model's or an instance
    code's `.keras` file (`load_subic(path, instance=True)`), or the word
    `"instance"`, the instance code that ships with the package
    (`subic_keras.instance.instance_code.pretrained`)."""
    from subic_keras.instance.instance_code import pretrained
    from subic_keras.pretrained import INSTANCE

    if os.fspath(path) == INSTANCE:
        return pretrained()
    return load_subic(path, instance=True)


def export_saved_model(
    model_or_path,
    base_dir: str,
    model_name: str = "subic",
    version: int | None = None,
    overwrite: bool = False,
    image_size: tuple[int, int] | None = None,
) -> str:
    """Exports a SuBiC model for TF Serving, with three signatures.

    Writes `<base_dir>/<model_name>/<version>/` (`saved_model.pb` and
    `variables/`), the layout TF Serving's `--model_base_path` expects, with
    the signatures `serving_default`, `encode_images` and `classify` (see the
    module docstring). The codes are `c_m = argmax_k z_m[k]` (ties to the
    lowest index), the query is `z`, the ReLU output of FC0, and the class
    query is `W₁ s`, exactly as `Subic.encoder`, `Subic.query_encoder` and
    `Subic.class_query_encoder` compute them. An instance code's signatures
    answer `codes` and `query` (FC0's outputs, `InstanceSubic.query`), and there is
    no `classify`.

    Inputs are checked inside the graph, so on every serving host: a float
    batch of another rank, size or channel count fails with TensorFlow's
    `InvalidArgumentError` "Shape of tensor images [...] is not compatible
    with expected shape [?,H,W,C]", and bytes that are not an image fail in
    the `decode_image_bytes/.../DecodeImage` operator ("Unknown image file
    format").

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 8, 64, 10)
    >>> path = export_saved_model(subic, "serving")
    >>> path
    'serving/subic/1'
    >>> served = tf.saved_model.load(path)
    >>> served.signatures["serving_default"](images=images)["codes"].shape
    TensorShape([64, 8])

    Args:
        model_or_path: a `Subic`, a SuBiC train model, an instance code
            (`InstanceSubic` or its model) or a `.keras` path.
        base_dir: the directory mounted as TF Serving's model base.
        model_name: the model's name, TF Serving's `MODEL_NAME`.
        version: the version number, a directory name; by default one more
            than the largest existing numeric version (1 for the first).
        overwrite: replace an existing version directory.
        image_size: `(H, W)` of the signatures' images; needed only when the
            model does not fix its input size, and must agree with it
            otherwise.

    Returns:
        The path of the version directory.

    Raises:
        FileExistsError: the version directory exists and not `overwrite`.
        FileNotFoundError: `model_or_path` names no file.
        TypeError: `model_or_path` is not a model, a `Subic` or a path.
        ValueError: not a SuBiC model on images `(H, W, C)`, a bad
            `model_name`, `version` or `image_size`.
    """
    subic = load_subic(model_or_path, instance=True)
    height, width, channels = _image_shape(subic, image_size)
    model_name = _check_model_name(model_name)
    model_dir = os.path.join(os.fspath(base_dir), model_name)
    if version is not None:
        version = check_int("version", version, minimum=0)
    # The model's folder is made inside `base_dir` without following a
    # link: a planted `subic -> /elsewhere` never receives the export.
    make_folders(base_dir, model_name, replace=overwrite)
    if version is None:
        version = _next_version(model_dir)
    path = os.path.join(model_dir, str(version))
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(
            f"version {version} of model {model_name!r} already exists: {path!r}; "
            "pass overwrite=True to replace it, or choose another version"
        )
    module, signatures = _serving_module(subic, height, width, channels)
    with atomic_directory(path, overwrite=overwrite) as tmp:
        tf.saved_model.save(module, tmp, signatures=signatures)
    return path


def export_litert(
    model_or_path,
    path: str,
    quantization: str = "float32",
    representative_images: np.ndarray | None = None,
) -> str:
    """Exports SuBiC's encoder as a LiteRT (.tflite) flatbuffer.

    The flatbuffer has one signature, `serving_default`, with the input
    `images`, float32 `(batch, H, W, C)` in `[0, 1]` (the batch dimension can
    be resized), and the outputs `codes`, int32 `(batch, M)`, `query`,
    float32 `(batch, M·K)` (the paper's `z`), and `class_query`, float32
    `(batch, M·K)` (`W₁ s`). It uses LiteRT builtin operators only (no Select
    TF ops).

    - `"float32"`: the network in float32;
    - `"int8"`: full-integer quantisation (`TFLITE_BUILTINS_INT8`): weights
      and activations are int8, calibrated on `representative_images`. The
      interface stays float32: the input is quantised and the queries are
      dequantised inside the flatbuffer, so both files are called the same
      way. The codes are the argmax of the int8 `z`, i.e. of the dequantised
      `query` output, with ties (more frequent at 8 bits) broken toward the
      lowest index.

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 8, 64, 10)
    >>> path = export_litert(subic, "subic_int8.tflite", "int8",
    ...                      representative_images=images)
    >>> run_litert(path, images)["codes"].shape
    (64, 8)

    Args:
        model_or_path: a `Subic`, a SuBiC train model, an instance code
            (`InstanceSubic` or its model) or a `.keras` path.
        path: the destination file.
        quantization: `"float32"` or `"int8"`.
        representative_images: for `"int8"` only: calibration images shaped
            like the model's input, `(n, H, W, C)`, uint8 in `[0, 255]` or
            float in `[0, 1]`; a few hundred training images suffice.

    Returns:
        `path`.

    Raises:
        FileNotFoundError: `model_or_path` names no file.
        TypeError: `model_or_path` is not a model, a `Subic` or a path, or
            `representative_images` are neither uint8 nor floats.
        ValueError: not a SuBiC model, an unknown `quantization`, or missing,
            ill-shaped or out-of-range `representative_images`.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS}, received {quantization!r}"
        )
    subic = load_subic(model_or_path, instance=True)
    model = _encoder_model(subic, int8=quantization == "int8")
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if quantization == "float32":
        if representative_images is not None:
            raise ValueError(
                "representative_images is used by quantization='int8' only, "
                "received images with quantization='float32'"
            )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    else:
        images = _representative_images(
            representative_images, tuple(model.inputs[0].shape[1:])
        )
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([image[None]] for image in images)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # The converter exports through a temporary SavedModel and prints its
    # path, and warns that the float input has no statistics (it is
    # quantised from the representative data): noise for the CLI's reader.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Statistics for quantized inputs")
        flatbuffer = converter.convert()
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(flatbuffer)
    return os.fspath(path)


class _ArgmaxOperator(BlockArgmax):
    """`BlockArgmax` with LiteRT's `ARG_MAX` operator, for int8 LiteRT files.

    `first_max_index` compares each entry with its block's maximum (EQUAL).
    LiteRT's int8 EQUAL rescales both sides with a fixed-point multiplier that
    must be below 1, so it answers wrongly once z's quantisation scale exceeds
    1, as it does for a trained SuBiC whose z reaches the hundreds. ARG_MAX
    compares the raw int8 values, and LiteRT's kernel keeps the first maximum:
    ties still go to the lowest index (tests check it). Used only to convert,
    never saved.
    """

    def call(self, inputs):
        blocks = tf.reshape(inputs, (-1, self.num_blocks, self.block_size))
        return tf.argmax(blocks, axis=-1, output_type=tf.int32)


def _encoder_model(subic: Subic | InstanceSubic, int8: bool = False) -> keras.Model:
    """`images → {"codes": int32 (batch, M), "query", "class_query"}`.

    Both queries are float32 `(batch, M·K)`: `z` and `W₁ s`. An instance
    code's are `codes` and `query`, FC0's outputs `l`.
    """
    model = subic.train_model
    images = model.inputs[0]
    z = model.get_layer(FC0).output
    ranked = z
    if not isinstance(subic, Subic) and not int8:
        # An instance code's codes are its first largest probabilities, as
        # in `InstanceSubic.encode`; at int8 the probabilities are steps of
        # 1/256 and tie often, so they come from the logits, whose order
        # they keep.
        ranked = model.get_layer(BLOCK_PROBS).output
    argmax = _ArgmaxOperator if int8 else BlockArgmax
    outputs = {
        "codes": argmax(subic.num_blocks, subic.block_size, name="codes")(ranked),
        # float32 even when the model computes in float16.
        "query": keras.layers.Activation("linear", dtype="float32", name="query")(z),
    }
    if isinstance(subic, Subic):
        outputs["class_query"] = keras.layers.Activation(
            "linear", dtype="float32", name="class_query"
        )(subic.class_query_encoder.outputs[0])
    return keras.Model(images, outputs, name="encoder")


def _decoded_over_white(data, channels: int):
    """One encoded picture as uint8 `(h, w, channels)`, a transparent one
    (grey or colour with alpha) composited over white first, as
    `subic_keras.data.images` decodes files: `round(c·a + 255·(1 − a))`."""

    def decoded(depth: int):
        return tf.io.decode_image(
            data, channels=depth, dtype=tf.uint8, expand_animations=False
        )

    image = decoded(0)
    depth = tf.shape(image)[-1]
    transparent = (depth == 2) | (depth == 4)

    def over_white():
        alpha = tf.cast(image[..., -1:], tf.float32) / 255.0
        blended = tf.cast(image[..., :-1], tf.float32) * alpha + 255.0 * (1.0 - alpha)
        return tf.cast(tf.round(blended), tf.uint8)

    picture = tf.cond(transparent, over_white, lambda: image)
    colour = tf.shape(picture)[-1] == 3
    if channels == 3:  # grey replicated, as the decoders expand it
        picture = tf.cond(
            colour, lambda: picture, lambda: tf.image.grayscale_to_rgb(picture)
        )
    else:

        def luma():
            grey = tf.image.rgb_to_grayscale(tf.cast(picture, tf.float32))
            return tf.cast(tf.round(grey), tf.uint8)

        # An opaque colour picture is decoded again as grey: the decoders'
        # own conversion (libjpeg's), as before transparency was handled.
        picture = tf.cond(
            colour,
            lambda: tf.cond(transparent, luma, lambda: decoded(1)),
            lambda: picture,
        )
    return tf.ensure_shape(picture, (None, None, channels))


def _serving_module(
    subic: Subic | InstanceSubic, height: int, width: int, channels: int
):
    """A `tf.Module` holding the model's variables, and its signatures."""
    encoder = _encoder_model(subic)
    images_spec = tf.TensorSpec((None, height, width, channels), tf.float32, IMAGES)
    bytes_spec = tf.TensorSpec((None,), tf.string, IMAGE_BYTES)

    def check(images):
        # Serving hosts do not all check feeds against the signature's shape;
        # this fails, naming the input, on every host.
        return tf.ensure_shape(images, images_spec.shape, name="check_images")

    def encode(images):
        outputs = encoder(check(images), training=False)
        return {
            name: tf.cast(value, tf.int32 if name == "codes" else tf.float32)
            for name, value in outputs.items()
        }

    def decode(data):
        image = _decoded_over_white(data, channels)
        scaled = scale_pixels(image)
        # Bilinear resampling to the same size is the identity, exactly.
        return tf.image.resize(scaled, (height, width), method="bilinear")

    @tf.function(input_signature=[images_spec], autograph=False)
    def serving_default(images):
        return encode(images)

    @tf.function(input_signature=[bytes_spec], autograph=False)
    def encode_images(image_bytes):
        image_bytes = tf.ensure_shape(
            image_bytes, bytes_spec.shape, name="check_image_bytes"
        )
        images = tf.map_fn(
            decode,
            image_bytes,
            fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32),
            name="decode_image_bytes",
        )
        return encode(images)

    signatures = {
        "serving_default": serving_default.get_concrete_function(),
        "encode_images": encode_images.get_concrete_function(),
    }
    module = tf.Module(name="subic_serving")
    if isinstance(subic, Subic):  # an instance code has no classes
        classifier = keras.Model(
            subic.train_model.inputs[0],
            {"probabilities": subic.classifier.outputs[0]},
            name="binary_classifier",
        )

        @tf.function(input_signature=[images_spec], autograph=False)
        def classify(images):
            outputs = classifier(check(images), training=False)
            return {"probabilities": tf.cast(outputs["probabilities"], tf.float32)}

        signatures["classify"] = classify.get_concrete_function()
        module.classify = classify
    # Track the TensorFlow variables the signatures read, not the Keras
    # models or their variable wrappers: TF Serving's loader (TF1-style, as
    # `saved_model_cli run`) restores exactly the captured variables, and
    # finds none when only the Keras wrappers are tracked.
    captured = {
        id(variable): variable
        for function in signatures.values()
        for variable in function.variables
    }
    module.model_variables = list(captured.values())
    module.serving_default = serving_default
    module.encode_images = encode_images
    return module, signatures


def _image_shape(subic: Subic | InstanceSubic, image_size) -> tuple[int, int, int]:
    """`(H, W, C)` of the model's images, with `image_size` filling `H, W`."""
    shape = tuple(subic.train_model.inputs[0].shape[1:])
    if len(shape) != 3 or shape[2] is None:
        raise ValueError(
            "export_saved_model needs a model on images (batch, H, W, C) with a "
            f"known channel count, received input shape (batch, *{shape})"
        )
    height, width, channels = shape
    if image_size is not None:
        if (
            not isinstance(image_size, (tuple, list))
            or len(image_size) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in image_size)
            or min(image_size) < 1
        ):
            raise ValueError(
                f"image_size must be (height, width) of positive ints, received "
                f"{image_size!r}"
            )
        for name, fixed, wanted in zip(("height", "width"), shape[:2], image_size):
            if fixed is not None and fixed != wanted:
                raise ValueError(
                    f"image_size {tuple(image_size)} disagrees with the model's "
                    f"input {name} {fixed} (input shape (batch, *{shape}))"
                )
        height, width = image_size
    if height is None or width is None:
        raise ValueError(
            "image_size is required: the model's input shape (batch, *"
            f"{shape}) does not fix the image height and width"
        )
    return int(height), int(width), int(channels)


def _check_model_name(model_name) -> str:
    if (
        not isinstance(model_name, str)
        or model_name in ("", ".", "..")
        or "/" in model_name
        or os.sep in model_name
    ):
        raise ValueError(
            "model_name must be a non-empty directory name without path "
            f"separators, received {model_name!r}"
        )
    return model_name


def _next_version(model_dir: str) -> int:
    """One more than the largest numeric version directory (1 when none)."""
    if not os.path.isdir(model_dir):
        return 1
    versions = [
        int(name)
        for name in os.listdir(model_dir)
        if _VERSION.fullmatch(name) and os.path.isdir(os.path.join(model_dir, name))
    ]
    return max(versions, default=0) + 1


def _representative_images(images, input_shape: tuple) -> np.ndarray:
    """Calibration images as float32 in `[0, 1]`, checked against the input."""
    if images is None:
        raise ValueError(
            "quantization='int8' needs representative_images: a few hundred "
            f"images of shape (n, *{input_shape}), received None"
        )
    images = np.asarray(images)
    expected = "(n, " + ", ".join(str(d) for d in input_shape) + ")"
    matches = (
        images.ndim == len(input_shape) + 1
        and len(images) > 0
        and all(d is None or d == s for d, s in zip(input_shape, images.shape[1:]))
    )
    if not matches:
        raise ValueError(
            f"representative_images must have shape {expected} with n >= 1, "
            f"the model's input, received shape {images.shape}"
        )
    if images.dtype == np.uint8:
        return PIXEL_LEVELS[images]
    if images.dtype.kind != "f":
        raise TypeError(
            "representative_images must be uint8 images in [0, 255] or floats "
            f"in [0, 1], received dtype {images.dtype}"
        )
    check_finite("representative_images", images)
    if images.min() < 0 or images.max() > 1:
        raise ValueError(
            "representative_images must be floats in [0, 1] (or uint8), "
            f"received values in [{images.min()}, {images.max()}]"
        )
    return images.astype(np.float32)
