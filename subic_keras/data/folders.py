"""A folder of labelled pictures as `tf.data` streams, for training at any size.

`image_folder` reads the class-per-subfolder layout of
`keras.utils.image_dataset_from_directory` (`root/cat/…`, `root/dog/…`):
the files are listed and decoded once, with the package's one decoder
(`subic_keras.data.images`: EXIF orientation, transparency over white, 16-bit
to 8-bit, antialiased resize), so a picture trained on gives the pixels it
gives when indexed or searched. The decoded pictures are kept at the
training size in an unnamed temporary file (mapped, so memory stays flat;
gone when the stream is, or when the process ends), and every later epoch
reads them there: a folder of large photos costs one decode, not one per
epoch. A file whose identity (inode, size, modification time) changed since
is decoded again. Memory holds the file names and labels, not the pictures.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from subic_keras._validation import check_int
from subic_keras.data import images, streams
from subic_keras.data.paths import check_folder, open_in_folder
from subic_keras.data.protocols import train_validation_split

_DECODE_BATCH = 64  # pictures per decoding call
# Free space left on the temporary folder's disk when the cache is made;
# with less, epochs decode the files again as they come.
_CACHE_SPARE = 1 << 30


@dataclasses.dataclass
class LabelledFolder:
    """A labelled folder as streams of `(uint8 picture (H, W, C), class id)`.

    Attributes:
        training: the training stream, reshuffled on every pass (file names
            are shuffled, so this costs no memory) unless `shuffle=False`.
        validation: the held-out stream, in a fixed order; `None` without
            `validation_split`.
        class_names: the class folders, in the order of the class ids.
        training_paths, validation_paths: the pictures of each split,
            relative to the folder (sorted).
        skipped: files left out, with the reason (not a picture, truncated,
            outside a class folder, or unreadable later).
    """

    training: tf.data.Dataset
    validation: tf.data.Dataset | None
    class_names: list[str]
    training_paths: list[str]
    validation_paths: list[str]
    skipped: list[images.SkippedFile]


def image_folder(
    directory: str | os.PathLike,
    image_size: int | Sequence[int] = 224,
    *,
    channels: int = 3,
    validation_split: float | int | None = None,
    seed: int = 0,
    max_images: int | None = None,
    shuffle: bool = True,
    workers: int | None = None,
) -> LabelledFolder:
    """A class-per-subfolder tree of pictures as training and validation streams.

    Each split is checked once when this is called: every file is decoded
    (in threads), files that are not pictures are listed in `skipped`
    instead of failing an epoch later, and the split's one-pass summary
    (`streams.summarize`: labels, pixel histogram, digest) is kept, so
    training reads no file more than once per epoch. A file that becomes
    unreadable afterwards is replaced by the next readable picture of its
    class, with a warning, and added to `skipped`: the streams keep their
    length, so an epoch never ends early or dies halfway.

    Example:

    >>> import tempfile
    >>> from subic_keras.data.images import write_image_folder
    >>> root = tempfile.mkdtemp()
    >>> _ = write_image_folder(images[:40], [0, 1] * 20, root, ["cat", "dog"])
    >>> folder = image_folder(root, 16, validation_split=0.25)
    >>> folder.class_names, len(folder.training_paths), len(folder.validation_paths)
    (['cat', 'dog'], 30, 10)
    >>> picture, label = next(iter(folder.validation))
    >>> tuple(picture.shape), picture.dtype.name
    ((16, 16, 3), 'uint8')

    Train on it with `train_subic(backbone, M, K, folder.training, None,
    folder.validation, num_classes=len(folder.class_names))`.

    Args:
        directory: the folder: one subfolder per class (at least two),
            pictures inside, searched recursively.
        image_size: the side, or `(height, width)`, pictures are resized to.
        channels: 3 (RGB) or 1 (grey).
        validation_split: a fraction in (0, 1) or a count of pictures held
            out per class in proportion (`protocols.train_validation_split`,
            seeded); `None`: no validation stream.
        seed: seed of the split, of the subset (`max_images`) and of the
            training stream's order.
        max_images: at most this many training pictures (a seeded subset
            that keeps every class).
        shuffle: reshuffle the training stream on every pass; `False` keeps
            the sorted order (a folder to validate or evaluate on).
        workers: decoding threads of the check (default: the cores).

    Returns:
        A `LabelledFolder`.

    Raises:
        ValueError: fewer than two classes, a class without a readable
            picture, or a bad `image_size`, `channels` or `validation_split`.
        FileNotFoundError, NotADirectoryError: `directory` is not a folder.
    """
    root = check_folder(directory)
    shape = (*_image_size(image_size), _channels(channels))
    seed = check_int("seed", seed, minimum=0)
    paths, class_names, skipped = images.labelled_files(root)
    labels = images.class_ids(paths, class_names)
    if validation_split is None:
        train_idx, val_idx = np.arange(len(paths)), np.zeros(0, np.int64)
    else:
        train_idx, val_idx = _validation_indices(labels, validation_split, seed)
    if max_images is not None:
        max_images = check_int("max_images", max_images, minimum=1)
        if max_images < len(train_idx):
            rng = np.random.default_rng(seed)
            train_idx = np.sort(rng.choice(train_idx, max_images, replace=False))
    splits: list[tuple[tf.data.Dataset | None, list[str]]] = []
    for name, index, reshuffled in (
        ("training", train_idx, shuffle),
        ("validation", val_idx, False),
    ):
        if name == "validation" and validation_split is None:
            splits.append((None, []))
            continue
        kept, summary, cache = _check_files(
            root, [paths[i] for i in index], class_names, shape, name, skipped, workers
        )
        if name == "training":  # a small class may lend validation nothing
            images.check_classes(summary.labels, class_names, root)
        stream = _stream(root, kept, summary, cache, shape, reshuffled, seed, skipped)
        splits.append((stream, kept))
    (training, training_paths), (validation, validation_paths) = splits
    return LabelledFolder(
        training, validation, class_names, training_paths, validation_paths, skipped
    )


def _image_size(image_size) -> tuple[int, int]:
    sizes = (image_size, image_size) if np.ndim(image_size) == 0 else image_size
    if len(sizes) != 2:
        raise ValueError(
            f"image_size must be a side or (height, width), received {image_size!r}"
        )
    height, width = (check_int("image_size", side, minimum=1) for side in sizes)
    return height, width


def _channels(channels) -> int:
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, received {channels!r}")
    return int(channels)


def _validation_indices(labels: np.ndarray, validation_split, seed: int):
    if isinstance(validation_split, float) and not 0 < validation_split < 1:
        raise ValueError(
            f"validation_split must be a fraction in (0, 1) or a count, received "
            f"{validation_split!r}"
        )
    return train_validation_split(labels, validation_split, seed=seed)


def _check_files(
    root: str,
    paths: list[str],
    class_names: list[str],
    shape: tuple[int, ...],
    name: str,
    skipped: list,
    workers: int | None,
) -> tuple[list[str], streams.StreamSummary, _PixelCache]:
    """Decodes every file once: the readable ones, their pixels (kept in a
    `_PixelCache`) and the split's summary."""
    summarizer = streams.Summarizer(name)
    cache = _PixelCache(len(paths), shape)
    kept: list[str] = []
    for batch in images.image_batches(root, paths, shape, workers=workers):
        skipped += batch.skipped
        if batch.paths:
            cache.put(len(kept), batch.pixels, batch.identities)
            kept += batch.paths
            summarizer.add(batch.pixels, images.class_ids(batch.paths, class_names))
    if not kept:
        raise ValueError(
            f"the {name} split of {root} holds no readable picture "
            f"({len(paths)} files listed)"
        )
    return kept, summarizer.result(batched=False), cache


class _PixelCache:
    """A split's decoded pictures, one row each, in an unnamed temporary file
    mapped into memory (the operating system pages it; nothing outlives the
    process), with the identity of the file each came from. Without room on
    the temporary folder's disk it holds nothing and every read misses."""

    def __init__(self, count: int, shape: tuple[int, ...]):
        self.rows: np.ndarray | None = None
        self.identities: list[tuple[int, int, int, int] | None] = [None] * count
        nbytes = count * math.prod(shape)
        try:
            room = shutil.disk_usage(tempfile.gettempdir()).free if count else 0
        except OSError:
            return
        if nbytes + _CACHE_SPARE > room:
            return
        try:
            self._file = tempfile.TemporaryFile(prefix="subic-pixels-")
            self._file.truncate(nbytes)
            self.rows = np.memmap(self._file, np.uint8, "r+", shape=(count, *shape))
        except OSError:  # a temporary folder that refuses: decode as we go
            self.rows = None

    def put(self, start: int, pixels: np.ndarray, identities: list) -> None:
        if self.rows is None:
            return
        self.rows[start : start + len(pixels)] = pixels
        self.identities[start : start + len(pixels)] = identities

    def get(self, position: int, path: str) -> np.ndarray | None:
        """The picture at `position` if the file at `path` is still the one
        it was decoded from, else `None`."""
        if self.rows is None or self.identities[position] is None:
            return None
        try:
            if images.file_identity(os.stat(path)) != self.identities[position]:
                return None
        except OSError:
            return None
        return np.array(self.rows[position])


def _stream(root, kept, summary, cache, shape, shuffle: bool, seed: int, skipped):
    decoder = _Decoder(root, kept, summary.labels, shape, skipped, cache)
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.arange(len(kept)), summary.labels)  # the labels of `kept`, in order
    )
    if shuffle:
        dataset = dataset.shuffle(len(kept), seed=seed, reshuffle_each_iteration=True)

    @tf.autograph.experimental.do_not_convert
    def load(positions, labels):
        pixels = tf.numpy_function(decoder, [positions], tf.uint8, stateful=False)
        return tf.ensure_shape(pixels, (None, *shape)), labels

    # Decoded a batch per call (one Python call per _DECODE_BATCH pictures),
    # then single pictures again; every picture is decoded, or replaced, so
    # the stream keeps its length, which Keras needs to count its steps.
    dataset = (
        dataset.batch(_DECODE_BATCH)
        .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
        .apply(tf.data.experimental.assert_cardinality(len(kept)))
    )
    streams.remember(dataset, summary)
    return dataset


class FolderChangedError(ValueError):
    """A folder that lost every picture of a class while it was trained on."""


def folder_failure(error: Exception) -> str | None:
    """The `FolderChangedError` message inside a TensorFlow error raised by a
    folder's stream (which carries it as text, with a traceback), else
    `None`."""
    marker = f"{FolderChangedError.__name__}: "
    text = str(error)
    if marker not in text:
        return None
    return text.split(marker, 1)[1].splitlines()[0].strip()


class _Decoder:
    """Decodes a split's pictures by position; a file that broke after the
    check is replaced by the next readable picture of its class (reported
    in `skipped` and by a warning), so an epoch never dies halfway."""

    def __init__(
        self,
        root: str,
        kept: list[str],
        labels: np.ndarray,
        shape: tuple[int, ...],
        skipped: list,
        cache: _PixelCache,
    ):
        self.root, self.shape, self.skipped, self.cache = root, shape, skipped, cache
        self.real_root = os.path.realpath(root)
        self.files = kept
        self.labels = np.asarray(labels)
        self.broken: set[int] = set()

    def __call__(self, positions) -> np.ndarray:
        return np.stack([self.picture(int(p)) for p in positions]).reshape(
            -1, *self.shape
        )

    def read(self, position: int) -> np.ndarray:
        relative = self.files[position]
        cached = self.cache.get(position, os.path.join(self.real_root, relative))
        if cached is not None:
            return cached
        fd = open_in_folder(self.real_root, relative)
        return images.read_image(relative, self.shape, fd=fd)

    def picture(self, position: int) -> np.ndarray:
        if position not in self.broken:
            try:
                return self.read(position)
            except (images.ImageDecodeError, OSError) as error:
                self._broke(position, error)
        same_class = np.flatnonzero(self.labels == self.labels[position])
        start = int(np.searchsorted(same_class, position))
        for candidate in np.roll(same_class, -start):
            if candidate in self.broken:
                continue
            try:
                return self.read(int(candidate))
            except (images.ImageDecodeError, OSError) as error:
                self._broke(int(candidate), error)
        raise FolderChangedError(
            f"no readable picture is left in the class of {self.files[position]} "
            f"(in {self.root}): its files were removed or broke during training"
        )

    def _broke(self, position: int, error: Exception) -> None:
        self.broken.add(position)
        relative = self.files[position]
        self.skipped.append(images.SkippedFile(relative, str(error)))
        warnings.warn(
            f"skipped {relative} ({error}); another picture of its class "
            "takes its place",
            stacklevel=1,
        )
