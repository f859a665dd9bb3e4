"""Dataset loaders: CIFAR-10, Fashion-MNIST and scikit-learn's digits.

Local loaders read the official distribution layouts (CIFAR-10 binary or
python batches, Fashion-MNIST IDX files) so that everything works offline;
with `data_dir=None` they fall back to `tensorflow_datasets`
(`subic_keras.data.tfds_loaders`), which may need the network.

Preprocessing for training (`channel_statistics`, `standardize`) is in
`subic_keras.data.preprocessing`, the `tf.data` pipelines (`make_dataset`,
`make_stream_dataset`) in `subic_keras.data.pipelines`, the deterministic splits
in `subic_keras.data.protocols`; all are re-exported here.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import struct
from collections.abc import Iterator

import numpy as np

from subic_keras._validation import check_int
from subic_keras.config import DATASETS as DATASETS
from subic_keras.data.folders import LabelledFolder as LabelledFolder
from subic_keras.data.folders import image_folder as image_folder
from subic_keras.data.paths import open_file

# The pipelines, preprocessing and tensorflow-datasets loaders live in
# modules of their own; re-exported here, where earlier releases had them.
from subic_keras.data.pipelines import make_dataset as make_dataset
from subic_keras.data.pipelines import make_stream_dataset as make_stream_dataset
from subic_keras.data.pixels import PIXEL_LEVELS
from subic_keras.data.preprocessing import channel_statistics as channel_statistics
from subic_keras.data.preprocessing import standardize as standardize
from subic_keras.data.preprocessing import to_rgb as to_rgb

# The splits live in `protocols` (NumPy only); re-exported here, where
# earlier releases defined them.
from subic_keras.data.protocols import query_database_split as query_database_split
from subic_keras.data.protocols import train_validation_split as train_validation_split
from subic_keras.data.tfds_loaders import _load_tfds_arrays
from subic_keras.data.tfds_loaders import load_tfds_images as load_tfds_images

_CIFAR_SIZE = 32
_CIFAR_PIXELS = 3 * _CIFAR_SIZE * _CIFAR_SIZE
_CIFAR_RECORD = 1 + _CIFAR_PIXELS
_CIFAR_CLASSES = 10
_CIFAR_BINARY_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_BINARY_TEST = "test_batch.bin"
_CIFAR_PYTHON_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_PYTHON_TEST = "test_batch"

_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801
_FASHION_SIZE = 28
_FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


# --------------------------------------------------------------------------
# CIFAR-10


def load_cifar10(
    data_dir: str | os.PathLike | None = None,
    *,
    max_per_split: int | None = None,
    download: bool = True,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads CIFAR-10 from a local copy, or from `tensorflow_datasets`.

    `data_dir` holds the official *binary* version (`data_batch_1.bin` …
    `data_batch_5.bin`, `test_batch.bin`; a record is one label byte then the
    1,024-byte R, G and B planes, row-major) or the official *python* version
    (`data_batch_1` … `data_batch_5`, `test_batch`: pickled dicts with
    `b"data"` and `b"labels"`). It may also be the parent of
    `cifar-10-batches-bin/` or `cifar-10-batches-py/`. The binary version is
    the recommended one. The python version is unpickled by a restricted
    reader that accepts only what the official batches hold (dicts, lists,
    strings, bytes, integers and NumPy arrays): a file that references any
    other code raises `ValueError` instead of running it.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = load_cifar10(
    ...     "data/cifar-10-batches-bin", max_per_split=100)
    >>> x_train.shape, y_train.dtype
    ((100, 32, 32, 3), dtype('int64'))

    Args:
        data_dir: the local directory, or `None` to use
            `tfds.load("cifar10")` (may download; the order is then tfds's).
        max_per_split: read only the first `max_per_split` training and test
            records (only the bytes needed, for the binary version).
        download: passed to `tfds.load` when `data_dir` is `None`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: uint8 images of shape
        `(n, 32, 32, 3)` (RGB) and int64 labels of shape `(n,)` in `[0, 10)`,
        in the files' order.

    Raises:
        FileNotFoundError: `data_dir` or one of its files is missing.
        ValueError: a file is truncated or not in the CIFAR-10 format.
    """
    limit = _check_limit(max_per_split)
    if data_dir is None:
        return _load_tfds_arrays("cifar10", limit, download)
    directory, layout = _find_cifar_dir(os.fspath(data_dir))
    if layout == "binary":
        train = _read_cifar_binary(
            [os.path.join(directory, f) for f in _CIFAR_BINARY_FILES], limit
        )
        test = _read_cifar_binary([os.path.join(directory, _CIFAR_BINARY_TEST)], limit)
    else:
        train = _read_cifar_python(
            [os.path.join(directory, f) for f in _CIFAR_PYTHON_FILES], limit
        )
        test = _read_cifar_python([os.path.join(directory, _CIFAR_PYTHON_TEST)], limit)
    return train, test


def _find_cifar_dir(data_dir: str) -> tuple[str, str]:
    """Returns `(directory, "binary" | "python")` holding the CIFAR-10 files."""
    layouts = (
        ("binary", (*_CIFAR_BINARY_FILES, _CIFAR_BINARY_TEST), "cifar-10-batches-bin"),
        ("python", (*_CIFAR_PYTHON_FILES, _CIFAR_PYTHON_TEST), "cifar-10-batches-py"),
    )
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f"CIFAR-10 data_dir does not exist or is not a directory: {data_dir!r}"
        )
    candidates = [(data_dir, layout, files) for layout, files, _ in layouts] + [
        (os.path.join(data_dir, subdir), layout, files)
        for layout, files, subdir in layouts
    ]
    for directory, layout, files in candidates:
        # A directory is taken to be in a layout as soon as it holds one of
        # its files, so that a partial copy is reported as such.
        present = [f for f in files if os.path.isfile(os.path.join(directory, f))]
        if present:
            missing = [f for f in files if f not in present]
            if missing:
                raise FileNotFoundError(
                    f"CIFAR-10 {layout} layout in {directory!r} is incomplete: "
                    f"missing {missing}"
                )
            return directory, layout
    raise FileNotFoundError(
        f"No CIFAR-10 files found in {data_dir!r}: looked for the binary version "
        f"({', '.join(layouts[0][1])}) and the python version "
        f"({', '.join(layouts[1][1])}), in that directory and in its "
        "subdirectories cifar-10-batches-bin/ and cifar-10-batches-py/"
    )


def _read_cifar_binary(
    paths: list[str], limit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Reads the first `limit` records (all if `None`) of binary batches."""
    counts = []
    for path in paths:
        size = os.path.getsize(path)
        if size == 0 or size % _CIFAR_RECORD:
            raise ValueError(
                f"{path!r} is truncated or not a CIFAR-10 binary batch: its size, "
                f"{size} bytes, is not a positive multiple of the "
                f"{_CIFAR_RECORD}-byte record (1 label byte + {_CIFAR_PIXELS} "
                "pixel bytes)"
            )
        counts.append(size // _CIFAR_RECORD)
    total = sum(counts) if limit is None else min(sum(counts), limit)
    images = np.empty((total, _CIFAR_SIZE, _CIFAR_SIZE, 3), dtype=np.uint8)
    labels = np.empty((total,), dtype=np.int64)
    start = 0
    for path, count in zip(paths, counts):
        n = min(count, total - start)
        if n == 0:
            break
        records = np.fromfile(path, dtype=np.uint8, count=n * _CIFAR_RECORD)
        records = records.reshape(n, _CIFAR_RECORD)
        labels[start : start + n] = records[:, 0]
        _planes_to_pixels(records[:, 1:], images[start : start + n])
        _check_labels_range(path, labels[start : start + n], _CIFAR_CLASSES)
        start += n
    return images, labels


# The globals an official CIFAR-10 python batch (a Python 2 pickle of a dict
# holding a NumPy array) references, and those of the same dict pickled by
# Python 3 (`_codecs.encode` rebuilds bytes under protocols < 3, and
# `_frombuffer` arrays under protocol 5). Nothing else is looked up, so a
# crafted file cannot name a callable to run.
_CIFAR_PICKLE_GLOBALS = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(
                f"it references {module}.{name}, which a CIFAR-10 batch never "
                "does; refusing to run it"
            )
        return super().find_class(module, name)


def _read_cifar_python(
    paths: list[str], limit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Reads the first `limit` records (all if `None`) of pickled batches."""
    images, labels = [], []
    remaining = limit
    for path in paths:
        if remaining == 0:
            break
        with open_file(path) as handle:
            try:
                batch = _CifarUnpickler(handle, encoding="bytes").load()
            except pickle.UnpicklingError as error:
                raise ValueError(
                    f"{path!r} is not a CIFAR-10 python batch: {error}"
                ) from error
            except Exception as error:
                raise ValueError(
                    f"{path!r} is truncated or not a CIFAR-10 python batch: {error}"
                ) from error
        if not isinstance(batch, dict):
            raise ValueError(
                f"{path!r} is not a CIFAR-10 python batch: expected a pickled dict, "
                f"found {type(batch).__name__}"
            )
        data = batch.get(b"data", batch.get("data"))
        batch_labels = batch.get(b"labels", batch.get("labels"))
        if data is None or batch_labels is None:
            raise ValueError(
                f"{path!r} is not a CIFAR-10 python batch: expected keys b'data' "
                f"and b'labels', found {sorted(map(repr, batch))}"
            )
        data = np.asarray(data)
        batch_labels = np.asarray(batch_labels, dtype=np.int64)
        if (
            data.dtype != np.uint8
            or data.ndim != 2
            or data.shape[1] != _CIFAR_PIXELS
            or batch_labels.shape != (data.shape[0],)
        ):
            raise ValueError(
                f"{path!r} is not a CIFAR-10 python batch: expected uint8 data of "
                f"shape (n, {_CIFAR_PIXELS}) and n labels, found data "
                f"{data.dtype} {data.shape} and labels {batch_labels.shape}"
            )
        n = data.shape[0] if remaining is None else min(data.shape[0], remaining)
        _check_labels_range(path, batch_labels[:n], _CIFAR_CLASSES)
        pixels = np.empty((n, _CIFAR_SIZE, _CIFAR_SIZE, 3), np.uint8)
        _planes_to_pixels(data[:n], pixels)
        images.append(pixels)
        labels.append(batch_labels[:n])
        if remaining is not None:
            remaining -= n
    return np.concatenate(images), np.concatenate(labels)


def _planes_to_pixels(planes: np.ndarray, pixels: np.ndarray) -> None:
    """Writes CIFAR-10 rows, planes R, G, B of 32x32 row-major pixels
    `(n, 3072)`, into `pixels` `(n, 32, 32, 3)`.

    One channel at a time: each copy reads a plane in order, where a single
    transposed copy would read with a stride of 1,024 bytes, several times
    slower.
    """
    interleaved = pixels.reshape(len(pixels), -1, 3)
    size = interleaved.shape[1]
    for channel in range(3):
        interleaved[:, :, channel] = planes[:, channel * size : (channel + 1) * size]


# --------------------------------------------------------------------------
# Fashion-MNIST


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None,
    *,
    max_per_split: int | None = None,
    download: bool = True,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads Fashion-MNIST from the official IDX files, or `tensorflow_datasets`.

    `data_dir` holds `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
    `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each gzipped
    (`.gz`) or not; it may also be the parent of `fashion-mnist/` or
    `fashion_mnist/`. Magic numbers, dimensions and lengths are validated.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = load_fashion_mnist(
    ...     "data/fashion-mnist", max_per_split=100)
    >>> x_test.shape
    (100, 28, 28)

    Args:
        data_dir: the local directory, or `None` to use
            `tfds.load("fashion_mnist")` (may download).
        max_per_split: read only the first `max_per_split` training and test
            examples (only the bytes needed).
        download: passed to `tfds.load` when `data_dir` is `None`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: uint8 grey images of shape
        `(n, 28, 28)` and int64 labels of shape `(n,)`, in the files' order.

    Raises:
        FileNotFoundError: `data_dir` or one of its files is missing.
        ValueError: a file is truncated or not a valid IDX file.
    """
    limit = _check_limit(max_per_split)
    if data_dir is None:
        (x_train, y_train), (x_test, y_test) = _load_tfds_arrays(
            "fashion_mnist", limit, download
        )
        return (x_train.reshape(x_train.shape[:3]), y_train), (
            x_test.reshape(x_test.shape[:3]),
            y_test,
        )
    paths = _find_fashion_files(os.fspath(data_dir))
    splits = []
    for split in ("train", "test"):
        images_path = paths[f"{split}_images"]
        labels_path = paths[f"{split}_labels"]
        images = _read_idx(images_path, _IDX_IMAGES_MAGIC, 3, limit)
        labels = _read_idx(labels_path, _IDX_LABELS_MAGIC, 1, limit)
        if images.shape[1:] != (_FASHION_SIZE, _FASHION_SIZE):
            raise ValueError(
                f"{images_path!r} holds images of shape {images.shape[1:]}, "
                f"expected ({_FASHION_SIZE}, {_FASHION_SIZE})"
            )
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"{images_path!r} holds {images.shape[0]} images but "
                f"{labels_path!r} holds {labels.shape[0]} labels"
            )
        labels = labels.astype(np.int64)
        _check_labels_range(labels_path, labels, 10)
        splits.append((images, labels))
    return splits[0], splits[1]


def _find_fashion_files(data_dir: str) -> dict[str, str]:
    """Maps each of `_FASHION_FILES` to its path, gzipped or not."""
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f"Fashion-MNIST data_dir does not exist or is not a directory: {data_dir!r}"
        )
    candidates = [data_dir] + [
        os.path.join(data_dir, sub)
        for sub in ("fashion-mnist", "fashion_mnist")
        if os.path.isdir(os.path.join(data_dir, sub))
    ]
    looked_for = ", ".join(f"{name}[.gz]" for name in _FASHION_FILES.values())
    for directory in candidates:
        paths = {}
        for key, name in _FASHION_FILES.items():
            for filename in (name, name + ".gz"):
                if os.path.isfile(os.path.join(directory, filename)):
                    paths[key] = os.path.join(directory, filename)
                    break
        if len(paths) == len(_FASHION_FILES):
            return paths
        if paths:
            missing = [
                f"{name}[.gz]"
                for key, name in _FASHION_FILES.items()
                if key not in paths
            ]
            raise FileNotFoundError(
                f"Fashion-MNIST files in {directory!r} are incomplete: missing "
                f"{missing}"
            )
    raise FileNotFoundError(
        f"No Fashion-MNIST files found in {data_dir!r}: looked for {looked_for}, "
        "in that directory and in its subdirectories fashion-mnist/ and "
        "fashion_mnist/"
    )


@contextlib.contextmanager
def _open_idx(path: str) -> Iterator:
    """An IDX file, gzipped or not, opened as every file is (`open_file`)."""
    with open_file(path) as handle:
        if not path.endswith(".gz"):
            yield handle
            return
        with gzip.GzipFile(fileobj=handle, mode="rb") as unzipped:
            yield unzipped


def _read_idx(path: str, magic: int, ndim: int, limit: int | None) -> np.ndarray:
    """Reads the first `limit` items of an unsigned-byte IDX file."""
    try:
        with _open_idx(path) as handle:
            header = handle.read(4 + 4 * ndim)
            if len(header) < 4 + 4 * ndim:
                raise ValueError(
                    f"{path!r} is truncated: its IDX header needs {4 + 4 * ndim} "
                    f"bytes, found {len(header)}"
                )
            (found,) = struct.unpack(">I", header[:4])
            if found != magic:
                raise ValueError(
                    f"{path!r} is not the expected IDX file: magic number "
                    f"{found:#010x}, expected {magic:#010x}"
                )
            dims = struct.unpack(f">{ndim}I", header[4:])
            n = dims[0] if limit is None else min(dims[0], limit)
            count = n * int(np.prod(dims[1:], dtype=np.int64))
            data = handle.read(count)
    except (OSError, EOFError) as error:
        # gzip reports a cut-off archive as EOFError, a damaged one as OSError.
        raise ValueError(f"{path!r} is truncated or corrupt: {error}") from error
    if len(data) < count:
        raise ValueError(
            f"{path!r} is truncated: expected {count} data bytes for {n} items of "
            f"shape {dims[1:]}, found {len(data)}"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape((n, *dims[1:])).copy()


# --------------------------------------------------------------------------
# scikit-learn digits and tensorflow_datasets


def load_digits(
    *, test_size: int | float = 1 / 3, seed: int = 0
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads scikit-learn's bundled 8x8 digits (offline), split train/test.

    Pixel values 0..16 are scaled to 0..255: `round(x * 255 / 16)`. The split
    is `train_validation_split(labels, test_size, seed, stratify=True)`.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = load_digits()
    >>> x_train.shape, x_test.shape
    ((1198, 8, 8), (599, 8, 8))

    Args:
        test_size: size of the test split (a count, or a fraction in (0, 1)).
        seed: seed of the split.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: uint8 images `(n, 8, 8)` and
        int64 labels `(n,)`, each split in the original order.
    """
    from sklearn.datasets import load_digits as sklearn_load_digits

    bunch = sklearn_load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    train, test = train_validation_split(labels, test_size, seed=seed, stratify=True)
    return (images[train], labels[train]), (images[test], labels[test])


# --------------------------------------------------------------------------
# Model inputs


def as_model_inputs(images: np.ndarray) -> np.ndarray:
    """uint8 images `(n, H, W[, C])` to the float `[0, 1]` inputs models take.

    Float arrays are taken to be model inputs already (images in `[0, 1]`,
    or features) and returned as float32.
    """
    images = np.asarray(images)
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32, copy=False)
    if images.dtype != np.uint8:
        raise TypeError(
            f"images must be uint8 pixels or float inputs, received dtype "
            f"{images.dtype}"
        )
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(
            f"images must have shape (n, H, W) or (n, H, W, C), received {images.shape}"
        )
    return PIXEL_LEVELS[images]


# --------------------------------------------------------------------------
# By name


def load_images(
    name: str, data_dir: str | None = None, limit: int | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads a dataset of `DATASETS` as uint8 images `(n, H, W, C)`.

    Args:
        name: `"digits"` (scikit-learn's 8x8 digits), `"cifar10"` or
            `"fashion_mnist"`.
        data_dir: directory of the official files (`load_cifar10`,
            `load_fashion_mnist`); `None` uses `tensorflow_datasets`.
        limit: at most this many training images (the first ones); the
            test split is always whole.

    Returns:
        `(x_train, y_train), (x_test, y_test)`.
    """
    if name == "digits":
        (x_train, y_train), (x_test, y_test) = load_digits()
    elif name == "cifar10":
        (x_train, y_train), (x_test, y_test) = load_cifar10(data_dir)
    elif name == "fashion_mnist":
        (x_train, y_train), (x_test, y_test) = load_fashion_mnist(data_dir)
    else:
        raise ValueError(f"dataset must be one of {DATASETS}, received {name!r}")
    if x_train.ndim == 3:
        x_train, x_test = x_train[..., None], x_test[..., None]
    if limit is not None:
        x_train, y_train = x_train[:limit], y_train[:limit]
    return (x_train, y_train), (x_test, y_test)


# --------------------------------------------------------------------------
# Shared checks


def _check_limit(max_per_split) -> int | None:
    if max_per_split is None:
        return None
    return check_int("max_per_split", max_per_split, minimum=1)


def _check_labels_range(path: str, labels: np.ndarray, num_classes: int) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{path!r} holds labels outside [0, {num_classes}): "
            f"min {labels.min()}, max {labels.max()}"
        )
