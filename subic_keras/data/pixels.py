"""The one image convention: uint8 pixels in `[0, 255]` or floats in `[0, 1]`.

Every model of the package takes images either way. uint8 images are scaled
inside the model (`ImageModel`), so `model.fit`, `model.predict`,
`Subic.encode`, `Subic.query`, the `subic` command line and the serving
signatures all give, for uint8 `x`, exactly the outputs of
`x.astype("float32") / 255`. Float inputs (images in `[0, 1]`, or
precomputed features) are taken as they are.

The scaling is a look-up in a table of the 256 float32 quotients `i / 255`
(`PIXEL_LEVELS`), not a division: TensorFlow's graph optimiser rewrites a
division by a constant as a multiplication by its reciprocal, which rounds
some pixels differently from NumPy's `x / 255`.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from subic_keras.prebuild import build_training_state

# `PIXEL_LEVELS[i] == np.float32(i) / np.float32(255)`, exactly.
PIXEL_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255.0)


def scale_pixels(images):
    """`images / 255` in float32 for a uint8 tensor; any other tensor unchanged.

    Example:

    >>> x = np.array([[0, 1, 128, 255]], np.uint8)
    >>> bool(np.array_equal(scale_pixels(x), x.astype("float32") / 255))
    True

    Args:
        images: a tensor or array of any shape.

    Returns:
        float32 values in `[0, 1]` for uint8 `images`; `images` otherwise.
    """
    dtype = getattr(images, "dtype", None)
    if dtype is None or keras.backend.standardize_dtype(dtype) != "uint8":
        return images
    return ops.take(ops.convert_to_tensor(PIXEL_LEVELS), ops.cast(images, "int32"))


@keras.saving.register_keras_serializable(package="subic_keras")
class ImageModel(keras.Model):
    """A functional model that takes uint8 pixels as well as float inputs.

    Keras casts every input of a functional model to its `Input`'s dtype
    before the first layer, so a model cannot see that its images were
    uint8. This model scales them first (`scale_pixels`): calling it,
    `predict` or `fit` on uint8 images `x` is calling it on
    `x.astype("float32") / 255`.

    Example:

    >>> inputs = keras.Input((4,))
    >>> model = ImageModel(inputs, keras.layers.Dense(2)(inputs))
    >>> x = np.array([[0, 64, 128, 255]], np.uint8)
    >>> bool(np.array_equal(model.predict(x, verbose=0),
    ...                     model.predict(x.astype("float32") / 255, verbose=0)))
    True

    Args:
        inputs, outputs, name: as `keras.Model`'s functional constructor.
    """

    def call(self, inputs, training=None, mask=None, **kwargs):
        inputs = keras.tree.map_structure(scale_pixels, inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def fit(self, x=None, y=None, *args, **kwargs):
        # The first train step is traced once, not twice (`prebuild`).
        build_training_state(self, x, y)
        return super().fit(x, y, *args, **kwargs)
