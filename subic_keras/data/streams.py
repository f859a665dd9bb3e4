"""Data as streams: a `tf.data.Dataset` or a Keras `PyDataset` where arrays go.

Every function of the package that trains or evaluates on `(images, labels)`
arrays (`train_subic`, `pretrain_backbone`, `baselines.train_hashing`,
`scoring.evaluate`, `callbacks.RetrievalValidation`) also takes one stream
of `(image, label)` pairs in place of the two arrays, batched or not:

    pairs = keras.utils.image_dataset_from_directory("photos", image_size=(224, 224))
    pairs = pairs.map(lambda x, y: (tf.cast(x, tf.uint8), y))  # its floats are 0..255
    subic, summary = sk.train_subic(backbone, 8, 64, pairs, None, validation_pairs)

Images are uint8 pixels (scaled to `[0, 1]` inside the models) or floats
in `[0, 1]` (float pictures on another scale are refused:
`check_pixel_range`); labels are integer class ids. Nothing is held in
memory beyond a batch at a time, except what the arrays path also keeps per
item: the labels, and the codes of an evaluation's database.

A stream is read in its own order: shuffle a training stream yourself
(`dataset.shuffle(n, reshuffle_each_iteration=True)`, or
`subic_keras.data.datasets.image_folder`, which shuffles file names). A stream
that is evaluated must give its elements in the same order on every pass;
a reshuffling one is detected and refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

_SUMMARY_BATCH = 256
# PyDatasets converted to `tf.data`, so each is inspected once.
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_stream(data) -> bool:
    """Whether `data` is a `tf.data.Dataset` or a Keras `PyDataset`."""
    import keras

    return isinstance(data, (tf.data.Dataset, keras.utils.PyDataset))


def as_dataset(data, name: str = "data") -> tf.data.Dataset:
    """`data` as a `tf.data.Dataset`: a `PyDataset`'s batches, in order.

    Raises:
        TypeError: `data` is neither a `tf.data.Dataset` nor a `PyDataset`.
        ValueError: an endless `tf.data.Dataset` (one pass would never end).
    """
    import keras

    if isinstance(data, tf.data.Dataset):
        if data.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                f"{name} is an endless stream (.repeat() without a count): the "
                "recipe reads one pass of it per epoch; pass the stream without "
                ".repeat(), or .take(n) of it"
            )
        return data
    if data in _CONVERTED:
        return _CONVERTED[data]
    if not isinstance(data, keras.utils.PyDataset):
        raise TypeError(
            f"{name} must be a tf.data.Dataset or a keras.utils.PyDataset, "
            f"received {type(data).__name__}"
        )
    count = data.num_batches
    if not count:
        raise ValueError(f"{name} is a PyDataset without batches (num_batches=0)")
    first = data[0]
    if not isinstance(first, tuple) or len(first) < 2:
        raise ValueError(
            f"{name} must give (images, labels) batches, received "
            f"{type(first).__name__}"
        )
    signature = tuple(
        tf.TensorSpec((None, *np.shape(part)[1:]), tf.as_dtype(np.asarray(part).dtype))
        for part in first[:2]
    )

    def batches():
        for index in range(count):
            images, labels = data[index][:2]
            yield np.asarray(images), np.asarray(labels)
        data.on_epoch_end()

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    _CONVERTED[data] = dataset
    return dataset


def labelled_batches(data, batch_size: int, name: str = "data") -> tf.data.Dataset:
    """The stream's `(images, labels)` in batches, its element types checked.

    An element whose label is a scalar is one example, and is batched here
    by `batch_size`; a vector of labels is a batch already, kept as it is.
    Elements beyond `(image, label)` (sample weights) are dropped.

    Raises:
        ValueError: elements that are not `(image, label)` pairs, or
            labels that are not class ids.
        TypeError: images neither uint8 nor float.
    """
    dataset = as_dataset(data, name)
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        raise ValueError(
            f"{name} must give (image, label) pairs, received elements {spec}"
        )
    if len(spec) > 2:
        dataset = dataset.map(
            tf.autograph.experimental.do_not_convert(
                lambda image, label, *rest: (image, label)
            )
        )
    images, labels = spec[:2]
    if labels.dtype.is_floating or not labels.dtype.is_integer:
        raise ValueError(
            f"{name}'s labels must be integer class ids, received {labels.dtype.name}"
        )
    if labels.shape.rank not in (0, 1):
        raise ValueError(
            f"{name}'s labels must be class ids (one per image), received labels "
            f"of shape {labels.shape}"
        )
    if images.dtype != tf.uint8 and not images.dtype.is_floating:
        raise TypeError(
            f"{name}'s images must be uint8 pixels or float inputs, received "
            f"{images.dtype.name}"
        )
    if labels.shape.rank == 0:
        dataset = dataset.batch(batch_size)
    return dataset


def check_pixel_range(data, name: str = "data") -> None:
    """Refuses a stream of float pictures that are not in `[0, 1]`.

    Float pictures `(H, W, C)` must be in `[0, 1]` (uint8 ones are scaled
    inside the models). `keras.utils.image_dataset_from_directory` gives
    floats in `[0, 255]`, which would train silently on the wrong scale:
    its first batch is read to tell here, and every later batch is checked
    in the graph as it is trained on (`checked_pixel_range`). uint8
    pictures and feature vectors are not read.

    Raises:
        ValueError: float pictures beyond `[0, 1]`, with the fix.
    """
    dataset = labelled_batches(data, _SUMMARY_BATCH, name)
    images = dataset.element_spec[0]
    if not images.dtype.is_floating or images.shape.rank != 4:
        return
    for batch, _ in dataset.take(1).as_numpy_iterator():
        low, high = float(np.min(batch)), float(np.max(batch))
        if low < 0 or high > 1:
            raise ValueError(
                f"{name}'s float pictures must be in [0, 1], received values in "
                f"[{low:g}, {high:g}]; for keras.utils.image_dataset_from_directory "
                "(0..255), map it with `lambda x, y: (tf.cast(x, tf.uint8), y)`"
            )


PIXEL_RANGE_ERROR = "float pictures must be in [0, 1]"


def checked_pixel_range(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` of `(images, labels)` batches, each batch of float pictures
    `(b, H, W, C)` asserted in `[0, 1]` as it passes (a min and a max per
    batch): a stream that changes scale after its first batch fails with
    `tf.errors.InvalidArgumentError` naming `PIXEL_RANGE_ERROR`."""
    images = dataset.element_spec[0]
    if not images.dtype.is_floating or images.shape.rank != 4:
        return dataset

    @tf.autograph.experimental.do_not_convert
    def check(batch, labels):
        message = f"{PIXEL_RANGE_ERROR} (a batch after the first left it)"
        checks = [
            tf.debugging.assert_greater_equal(
                tf.reduce_min(batch), tf.cast(0, batch.dtype), message=message
            ),
            tf.debugging.assert_less_equal(
                tf.reduce_max(batch), tf.cast(1, batch.dtype), message=message
            ),
        ]
        with tf.control_dependencies(checks):
            return tf.identity(batch), labels

    return dataset.map(check)


@dataclasses.dataclass
class StreamSummary:
    """What one pass over a labelled stream tells.

    Attributes:
        count: examples.
        num_batches: the stream's elements, for a stream of batches; `None`
            for a stream of single examples (batched by the reader).
        labels: the class ids, int64 `(count,)`, in stream order.
        element_shape: one input's shape.
        dtype: the inputs' dtype name.
        histogram: uint8 images: per channel, the count of each grey level,
            `(C, 256)`; `None` for float inputs.
        digest: a digest of the examples that does not depend on their
            order (so a reshuffled stream keeps its digest).
    """

    count: int
    num_batches: int | None
    labels: np.ndarray
    element_shape: tuple
    dtype: str
    histogram: np.ndarray | None
    digest: str

    def steps(self, batch_size: int) -> int:
        """Batches per pass, at `batch_size` for a stream of single examples."""
        if self.num_batches is not None:
            return self.num_batches
        return -(-self.count // batch_size)


class Summarizer:
    """Accumulates a `StreamSummary` batch by batch."""

    def __init__(self, name: str):
        self.name = name
        self.labels: list[np.ndarray] = []
        self.hashes: list[bytes] = []
        self.histogram: np.ndarray | None = None
        self.shape: tuple | None = None
        self.dtype: np.dtype | None = None
        self.num_batches = 0

    def add(self, images: np.ndarray, labels: np.ndarray) -> None:
        """Adds a batch: images `(b, ...)` and their class ids `(b,)`."""
        self.num_batches += 1
        if self.shape is None:
            self.shape, self.dtype = images.shape[1:], images.dtype
        elif images.shape[1:] != self.shape or images.dtype != self.dtype:
            raise ValueError(
                f"{self.name}'s inputs must all have one shape and dtype, received "
                f"{self.shape} {self.dtype} then {images.shape[1:]} {images.dtype}"
            )
        if images.dtype == np.uint8:
            self.histogram = add_histogram(self.histogram, images)
        elif not np.all(np.isfinite(images)):
            raise ValueError(
                f"{self.name}'s inputs must be finite, received NaN or inf"
            )
        self.labels.append(np.asarray(labels, np.int64))
        for image, label in zip(images, labels):
            hasher = hashlib.blake2b(image.tobytes(), digest_size=16)
            hasher.update(int(label).to_bytes(8, "little", signed=True))
            self.hashes.append(hasher.digest())

    def result(self, batched: bool) -> StreamSummary:
        """The summary; `batched`: whether the stream's elements are batches."""
        if not self.hashes:
            raise ValueError(
                f"{self.name} must hold at least one example, received none"
            )
        labels = np.concatenate(self.labels)
        if labels.min() < 0:
            raise ValueError(
                f"{self.name}'s labels must be non-negative class ids, received "
                f"{int(labels.min())}"
            )
        assert self.shape is not None and self.dtype is not None
        digest = hashlib.sha256(f"{self.dtype.str}{self.shape}".encode())
        digest.update(b"".join(sorted(self.hashes)))
        return StreamSummary(
            count=len(self.hashes),
            num_batches=self.num_batches if batched else None,
            labels=labels,
            element_shape=tuple(self.shape),
            dtype=str(self.dtype),
            histogram=self.histogram,
            digest=digest.hexdigest(),
        )


_SUMMARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember(data, summary: StreamSummary) -> None:
    """Records `summary` as `data`'s, for `summarize` (a reader that has
    made one pass over the data already)."""
    _SUMMARIES[data] = summary


def known_summary(data) -> StreamSummary | None:
    """`data`'s summary if a pass has made it already, else `None`."""
    try:
        return _SUMMARIES.get(data)
    except TypeError:  # not weakly referenceable
        return None


def summarize(data, name: str = "data") -> StreamSummary:
    """One pass over a labelled stream: count, labels, pixel histogram, digest.

    The result is kept for as long as `data` lives, so the recipe's steps
    (class count, learning-rate schedule, standardisation, cache key) share
    one pass.

    Example:

    >>> pairs = tf.data.Dataset.from_tensor_slices((images, labels))
    >>> summary = summarize(pairs.batch(20))
    >>> summary.count, summary.num_batches, summary.element_shape
    (64, 4, (32, 32, 3))
    >>> summarize(pairs.shuffle(64)).digest == summary.digest  # order-free
    True

    Raises:
        ValueError: an empty stream, inputs of changing shape, or float
            inputs with NaN or infinite values.
    """
    cached = known_summary(data)
    if cached is not None:
        return cached
    summarizer = Summarizer(name)
    for images, labels in _numpy_batches(data, name):  # checks the elements
        summarizer.add(images, labels)
    # A stream of batches gives label vectors; one of examples, scalars.
    batched = as_dataset(data, name).element_spec[1].shape.rank == 1
    summary = summarizer.result(batched)
    try:
        remember(data, summary)
    except TypeError:
        pass
    return summary


def add_histogram(histogram: np.ndarray | None, images: np.ndarray) -> np.ndarray:
    """`histogram` `(C, 256)` plus the grey-level counts of uint8 `images`."""
    channels = images.shape[-1] if images.ndim == 4 else 1
    if histogram is None:
        histogram = np.zeros((channels, 256), np.int64)
    pixels = images.reshape(-1, channels)
    for channel in range(channels):
        histogram[channel] += np.bincount(pixels[:, channel], minlength=256)
    return histogram


def histogram_moments(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation, in `[0, 1]` units, of pixel
    counts `(C, 256)` (population statistics, in float64)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    count = histogram.sum(axis=1)
    mean = histogram @ levels / count
    variance = (histogram * (levels - mean[:, None]) ** 2).sum(axis=1) / count
    return mean, np.sqrt(variance)


def _numpy_batches(data, name: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    dataset = labelled_batches(data, _SUMMARY_BATCH, name)
    for images, labels in dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
        yield np.asarray(images), np.asarray(labels)


def rows(data, positions: np.ndarray, labels: np.ndarray, name: str = "data"):
    """The inputs at `positions` (sorted) of a stream, as NumPy batches.

    Yields image batches, in stream order, after checking that each row's
    label is the one `labels` (the stream's labels of an earlier pass) holds
    there: a stream that reorders itself between passes cannot be evaluated.
    """
    positions = np.asarray(positions, np.int64)
    wanted = np.zeros(len(labels), bool)
    wanted[positions] = True
    wanted_t = tf.constant(wanted)
    dataset = labelled_batches(data, _SUMMARY_BATCH, name).unbatch()
    selected = (
        dataset.enumerate()
        .filter(
            tf.autograph.experimental.do_not_convert(
                lambda i, pair: tf.logical_and(
                    i < len(wanted),
                    tf.gather(wanted_t, tf.minimum(i, len(wanted) - 1)),
                )
            )
        )
        .map(
            tf.autograph.experimental.do_not_convert(
                lambda i, pair: (i, pair[0], pair[1])
            )
        )
        .batch(_SUMMARY_BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    seen = 0
    for index, images, batch_labels in selected.as_numpy_iterator():
        if not np.array_equal(batch_labels, labels[index]):
            raise ValueError(
                f"{name} gave other labels on a second pass: a stream that is "
                "evaluated must keep its order (do not shuffle it)"
            )
        seen += len(index)
        yield images
    if seen != len(positions):
        raise ValueError(
            f"{name} gave {seen} of the {len(positions)} expected examples on a "
            "second pass: a stream that is evaluated must give the same elements "
            "on every pass"
        )
