"""The data a training recipe takes: images and labels checked and split,
their digest (what a cached pre-training depends on), and each stage's
`model.fit` inputs and optimizer.
"""

from __future__ import annotations

import hashlib
import math

import keras
import numpy as np

from subic_keras._validation import check_int
from subic_keras.config import Recipe
from subic_keras.data import datasets, streams


def learning_rate_schedule(rate: float, total_steps: int):
    """`rate`, then `rate / 10` after 75% of the steps."""
    boundary = max(1, int(0.75 * total_steps))
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        [boundary], [rate, rate / 10]
    )


def stage_optimizer(
    recipe: Recipe, num_images: int, epochs: int, steps_per_epoch: int | None = None
):
    """Adam at `recipe.learning_rate` for a stage of `epochs` over `num_images`
    (`learning_rate_schedule`: ×0.1 after 75% of the stage's steps); a
    stream's own `steps_per_epoch` (batches) replaces the count of batches
    of `recipe.batch_size`."""
    if steps_per_epoch is None:
        steps_per_epoch = math.ceil(num_images / recipe.batch_size)
    steps = steps_per_epoch * epochs
    return keras.optimizers.Adam(learning_rate_schedule(recipe.learning_rate, steps))


def fit_dataset(
    images, labels, batch_size: int, *, shuffle: bool, augment: bool, seed: int
):
    """A `tf.data` pipeline of `(inputs, labels)` for one stage's `fit`.

    uint8 images go through `datasets.make_dataset` (scaled to `[0, 1]`,
    optionally augmented); float inputs (e.g. precomputed features) are
    batched as they are, and cannot be augmented. A stream of `(image,
    label)` pairs (`subic_keras.data.streams`, `labels=None`) goes through
    `datasets.make_stream_dataset`, in its own order (`shuffle` is the
    stream's business).
    """
    if streams.is_stream(images):
        return datasets.make_stream_dataset(
            images, batch_size, augment=augment, seed=seed
        )
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return datasets.make_dataset(
            images, labels, batch_size, shuffle=shuffle, augment=augment, seed=seed
        )
    if augment:
        raise ValueError(
            "augment=True needs uint8 images, received inputs of dtype "
            f"{images.dtype}; pass augment=False for features"
        )
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels))
    if shuffle:
        data = data.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
    return data.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _check_split(name: str, images, labels) -> tuple[np.ndarray, np.ndarray]:
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
        raise TypeError(
            f"{name} images must be uint8 pixels or float inputs, received dtype "
            f"{images.dtype}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"{name} labels must be a vector of one class id per image, received "
            f"{len(images)} images and labels of shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer) or (
        len(labels) and labels.min() < 0
    ):
        raise ValueError(
            f"{name} labels must be non-negative integer class ids, received "
            f"dtype {labels.dtype}"
        )
    if images.dtype != np.uint8 and not np.all(np.isfinite(images)):
        raise ValueError(f"{name} inputs must be finite, received NaN or infinity")
    return images, labels


def _num_classes(num_classes, *label_sets) -> int:
    needed = int(max(labels.max() for labels in label_sets if len(labels))) + 1
    if num_classes is None:
        return check_int("num_classes", max(needed, 2), minimum=2)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    if needed > num_classes:
        raise ValueError(
            f"num_classes is {num_classes}, but the labels reach class {needed - 1}"
        )
    return num_classes


class Split:
    """One split of a stage's data: arrays, or a stream read only when needed.

    A stream is summarised (`streams.summarize`, one pass) only for what
    its structure does not tell: its labels (the class count when
    `num_classes` is not given; validation), its batch count when its
    cardinality is unknown, and its digest for the pre-training cache.
    """

    def __init__(self, name: str, images, labels):
        self.name = name
        self.is_stream = streams.is_stream(images)
        if self.is_stream:
            if labels is not None:
                raise ValueError(
                    f"{name} labels must be None when the images are a stream of "
                    f"(image, label) pairs, received {type(labels).__name__}"
                )
            self.images, self._labels = images, None
            streams.check_pixel_range(images, name)  # checks the elements too
        else:
            self.images, self._labels = _check_split(name, images, labels)

    @property
    def summary(self) -> streams.StreamSummary:
        """The stream's one-pass summary (made once: `streams.summarize`)."""
        return streams.summarize(self.images, self.name)

    @property
    def labels(self) -> np.ndarray:
        return self.summary.labels if self._labels is None else self._labels

    @property
    def fit_labels(self):
        """The labels to pass beside `images`: `None` for a stream."""
        return self._labels

    def __len__(self) -> int:
        if self._labels is not None:
            return len(self._labels)
        return self.summary.count

    def known_count(self) -> int | None:
        """The number of examples, if known without reading a stream."""
        if not self.is_stream or streams.known_summary(self.images) is not None:
            return len(self)
        dataset = streams.as_dataset(self.images, self.name)
        spec = dataset.element_spec
        count = int(dataset.cardinality())
        return count if count >= 0 and spec[1].shape.rank == 0 else None

    def optimizer(self, recipe: Recipe, epochs: int):
        """`stage_optimizer` for `epochs` over this split."""
        return stage_optimizer(recipe, 0, epochs, self.steps(recipe.batch_size))

    @property
    def input_shape(self) -> tuple:
        if self.is_stream:
            spec = streams.labelled_batches(self.images, 1, self.name).element_spec
            return tuple(spec[0].shape[1:])
        return tuple(np.shape(self.images)[1:])

    def steps(self, batch_size: int) -> int:
        """Batches per epoch."""
        if not self.is_stream:
            return math.ceil(len(self) / batch_size)
        known = int(streams.labelled_batches(self.images, batch_size).cardinality())
        return known if known > 0 else self.summary.steps(batch_size)

    def digest(self) -> str:
        if self.is_stream:
            return self.summary.digest
        return _digest(self.images, self.labels)

    def training_batches(self, recipe: Recipe, seed: int):
        """A stage's training batches: shuffled, augmented if `recipe.augment`."""
        return fit_dataset(
            self.images,
            self.fit_labels,
            recipe.batch_size,
            shuffle=True,
            augment=recipe.augment,
            seed=seed,
        )

    def validation_batches(self, seed: int):
        """Keras's validation batches, in order, as they are."""
        return fit_dataset(
            self.images, self.fit_labels, 256, shuffle=False, augment=False, seed=seed
        )


def check_data(
    images,
    labels,
    validation,
    num_classes=None,
    input_shape=None,
    *,
    classifies: bool = True,
):
    """Checked `(training, validation, num_classes, input_shape)`: a stage's
    data, arrays or streams, as two `Split`s.

    With `classifies` (a model with a softmax over the classes) and no
    `num_classes`, validation classes that training lacks are refused: the
    class count would silently grow to include them."""
    training = Split("training", images, labels)
    if not isinstance(validation, (tuple, list)) or len(validation) != 2:
        if not streams.is_stream(validation):
            raise ValueError(
                "validation must be a pair (images, labels) or a stream of "
                f"(image, label) pairs, received {type(validation).__name__}"
            )
        validation = (validation, None)
    held_out = Split("validation", *validation)
    if classifies and num_classes is None:
        # Training's labels are read here anyway, for the class count.
        unknown = np.setdiff1d(held_out.labels, training.labels)
        if len(unknown):
            raise ValueError(
                f"validation holds classes that training does not: "
                f"{unknown[:10].tolist()}; a classifier cannot learn them (give "
                "num_classes to train one anyway)"
            )
    if num_classes is None or not training.is_stream:
        # A stream's labels are read (one pass) only when the class count
        # is not given.
        num_classes = _num_classes(num_classes, training.labels, held_out.labels)
    else:
        num_classes = _num_classes(num_classes, held_out.labels)
    return training, held_out, num_classes, tuple(input_shape or training.input_shape)


def _data_digest(training: Split, validation: Split) -> str:
    if not training.is_stream and not validation.is_stream:
        return _digest(
            training.images, training.labels, validation.images, validation.labels
        )
    digests = training.digest() + validation.digest()
    return hashlib.sha256(digests.encode()).hexdigest()


def _digest(*arrays) -> str:
    hasher = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        hasher.update(f"{array.dtype.str}{array.shape}".encode())
        hasher.update(array.data.cast("B"))
    return hasher.hexdigest()
