"""`keras_application`: a `keras.applications` network as SuBiC's backbone,
with its own input preprocessing as a layer (`ApplicationPreprocessing`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import keras
from keras import ops

from subic_keras._validation import check_image_shape, check_int


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


def keras_cache() -> str:
    """Where Keras keeps downloaded weights (`$KERAS_HOME/models`, by
    default `~/.keras/models`)."""
    home = os.environ.get("KERAS_HOME", os.path.join("~", ".keras"))
    return os.path.join(home, "models")


class WeightsUnavailableError(OSError):
    """ImageNet weights neither in the Keras cache nor downloadable."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(
            f"could not obtain the ImageNet weights of {name}: they are not in "
            f"the Keras cache ({keras_cache()}) and downloading them failed "
            f"({reason}); copy the weights file into that folder from a machine "
            "with network access, or pass a local weights file (weights=PATH), "
            "or weights=None"
        )


def _reason(error: Exception) -> str:
    """The innermost reason of a failed download, on one line."""
    text = " ".join(str(error).split())
    return text.rsplit(" -- ", 1)[-1][:200] or type(error).__name__


# Batch normalization's moving averages of a network trained from scratch.
# Keras's MobileNetV3 (and EfficientNet) keep 0.999 of the old average per
# step, which suits ImageNet's 5,000 steps an epoch: on a folder of a few
# hundred pictures (3 steps an epoch), 150 steps leave 86 % of the initial
# mean 0 / variance 1, so inference normalizes with statistics the network
# never had and predicts one class (validation at exactly chance while
# training accuracy reaches 1). At 0.9 the averages follow within ~20 steps.
FROM_SCRATCH_BN_MOMENTUM = 0.9


def _settle_batch_norm(model: keras.Model) -> None:
    """Moving averages that converge on a small folder (see above)."""
    for layer in model.layers:  # the applications are flat functional models
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = min(layer.momentum, FROM_SCRATCH_BN_MOMENTUM)


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
            or downloaded), a path to a weights file, or `None` (random; its
            batch normalization averages then move at
            `FROM_SCRATCH_BN_MOMENTUM`, so that they settle on a small
            folder).
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
        WeightsUnavailableError: an `OSError`, when `weights="imagenet"`
            are neither cached nor downloadable (e.g. no network).
    """
    constructor, _ = _application(name)
    input_shape = check_image_shape("input_shape", input_shape)
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
            raise WeightsUnavailableError(name, _reason(error)) from None
        raise

    if weights is None:
        _settle_batch_norm(model)
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
