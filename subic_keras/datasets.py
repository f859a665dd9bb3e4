"""Dataset loaders, `tf.data` input pipelines and deterministic splits.

Local loaders read the official distribution layouts (CIFAR-10 binary or
python batches, Fashion-MNIST IDX files) so that everything works offline;
with `data_dir=None` they fall back to `tensorflow_datasets`, which may need
the network. Preprocessing used for training is per-channel standardisation,
`(x / 255 - mean) / std`, with `mean` and `std` from `channel_statistics` on
the training images (see `standardize` and `make_dataset`).

The deterministic splits are in `subic_keras.protocols`.
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import socket
import struct

import numpy as np
import tensorflow as tf

from subic_keras._validation import check_int
from subic_keras.config import DATASETS as DATASETS
from subic_keras.folders import LabelledFolder as LabelledFolder
from subic_keras.folders import image_folder as image_folder
from subic_keras.pixels import PIXEL_LEVELS, scale_pixels

# The splits live in `protocols` (NumPy only); re-exported here, where
# earlier releases defined them.
from subic_keras.protocols import query_database_split as query_database_split
from subic_keras.protocols import train_validation_split as train_validation_split

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

# Labels produced by `load_tfds_images`: "multi_hot" over `num_classes`
# classes from the objects' labels, or the "label" class id.
_TFDS_IMAGE_DATASETS = {
    "voc/2007": ("multi_hot", 20),
    "caltech101": ("label", 102),
    "imagenet2012": ("label", 1000),
}

_SHIFT = 4  # Maximum random shift, in pixels, of `make_dataset`'s augmentation.
_CHUNK = 1024  # Images per chunk in `channel_statistics`.


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
        # Planes R, G, B of 32x32 row-major pixels -> (n, 32, 32, 3).
        images[start : start + n] = (
            records[:, 1:].reshape(n, 3, _CIFAR_SIZE, _CIFAR_SIZE).transpose(0, 2, 3, 1)
        )
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
        with open(path, "rb") as handle:
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
        images.append(
            data[:n].reshape(n, 3, _CIFAR_SIZE, _CIFAR_SIZE).transpose(0, 2, 3, 1)
        )
        labels.append(batch_labels[:n])
        if remaining is not None:
            remaining -= n
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)


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


def _read_idx(path: str, magic: int, ndim: int, limit: int | None) -> np.ndarray:
    """Reads the first `limit` items of an unsigned-byte IDX file."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
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


# Where tensorflow-datasets downloads the small sets from, and the layout
# `data_dir` takes instead (for the error that says what to do offline).
_TFDS_SOURCES = {
    "cifar10": (
        "www.cs.toronto.edu",
        "cifar-10-batches-bin/ (or cifar-10-batches-py/) from "
        "https://www.cs.toronto.edu/~kriz/cifar.html",
    ),
    "fashion_mnist": (
        "fashion-mnist.s3-website.eu-central-1.amazonaws.com",
        "the four files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from "
        "https://github.com/zalandoresearch/fashion-mnist",
    ),
}
_NETWORK_TIMEOUT = 10.0  # seconds to reach a download host before giving up


def _check_reachable(name: str) -> None:
    """Fails fast, naming `data_dir`, when `name`'s download host is unreachable
    (tensorflow-datasets itself would retry for minutes)."""
    if name not in _TFDS_SOURCES:
        return
    host, layout = _TFDS_SOURCES[name]
    try:
        socket.create_connection((host, 443), timeout=_NETWORK_TIMEOUT).close()
    except OSError as error:
        raise ConnectionError(
            f"cannot download {name} with tensorflow-datasets: {host} is not "
            f"reachable ({error}); download it elsewhere and pass its directory "
            f"as data_dir (--data-dir DIR on the command line), DIR holding "
            f"{layout}"
        ) from None


def _prepare_tfds(builder, name: str) -> None:
    """`builder.download_and_prepare()`, leaving nothing behind if it fails.

    tensorflow-datasets writes into `incomplete.*` directories and `*.tmp.*`
    downloads and leaves them when interrupted; those this call created are
    removed, and so are the dataset's directories if this call made them.
    """
    _check_reachable(name)
    root = os.fspath(builder.data_dir_root)
    places = [os.path.join(root, builder.name), os.path.join(root, "downloads")]
    existed = {place: os.path.isdir(place) for place in [root, *places]}
    before = {
        place: set(os.listdir(place)) if existed[place] else set() for place in places
    }
    try:
        builder.download_and_prepare()
    except BaseException:
        for place in reversed([root, *places]):
            if not existed[place]:
                shutil.rmtree(place, ignore_errors=True)
        for place in places:
            if not existed[place] or not os.path.isdir(place):
                continue
            for entry in set(os.listdir(place)) - before[place]:
                entry = os.path.join(place, entry)
                if os.path.isdir(entry):
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    os.remove(entry)
        raise


def _load_tfds_arrays(name: str, limit: int | None, download: bool):
    """Both splits of a small tfds dataset as NumPy arrays."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(name)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"tensorflow_datasets dataset {name!r} is not prepared in "
                f"{os.fspath(builder.data_dir)!r}; pass download=True, or the "
                "directory of the official files as data_dir"
            )
        _prepare_tfds(builder, name)
    splits = (
        ["train", "test"] if limit is None else [f"train[:{limit}]", f"test[:{limit}]"]
    )
    loaded = tfds.as_numpy(
        builder.as_dataset(split=splits, batch_size=-1, as_supervised=True)
    )
    return tuple(
        (np.asarray(images, dtype=np.uint8), np.asarray(labels, dtype=np.int64))
        for images, labels in loaded
    )


def load_tfds_images(
    name: str,
    split: str,
    data_dir: str | os.PathLike | None = None,
    image_size: tuple[int, int] | None = (224, 224),
    download: bool = False,
) -> tf.data.Dataset:
    """An unbatched dataset of `(image, label)` from a `tensorflow_datasets` set.

    For the paper's cross-domain experiments: `"voc/2007"` (labels multi-hot
    over its 20 classes, from the objects' labels), `"caltech101"` and
    `"imagenet2012"` (class ids). Images are resized (bilinear, antialiased,
    aspect ratio not kept) and rounded back to uint8.

    Example:

    Reads what `tensorflow-datasets` has prepared in `data_dir`, downloading
    it first where the network allows:

    ``load_tfds_images("caltech101", "test", data_dir="~/tfds").batch(64)``

    Args:
        name: `"voc/2007"`, `"caltech101"` or `"imagenet2012"`.
        split: a tfds split, slicing allowed (`"train[:10%]"`).
        data_dir: the tfds data directory (`None`: tfds's default).
        image_size: `(height, width)` of the output, or `None` to keep the
            original sizes.
        download: download and prepare the data when it is not prepared
            (ImageNet needs its archives placed by hand first).

    Returns:
        A `tf.data.Dataset` of `(uint8 image (h, w, 3), label)`: int64 class
        id, or int64 multi-hot vector `(20,)` for VOC.

    Raises:
        ValueError: unsupported `name` or bad `image_size`.
        FileNotFoundError: the data is not prepared and `download` is False.
    """
    if name not in _TFDS_IMAGE_DATASETS:
        raise ValueError(
            f"name must be one of {sorted(_TFDS_IMAGE_DATASETS)}, received {name!r}"
        )
    image_size = _check_image_size(image_size)
    import tensorflow_datasets as tfds

    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"tensorflow_datasets dataset {name!r} is not prepared in "
                f"data_dir={data_dir!r} (looked for {os.fspath(builder.data_dir)!r}); "
                "prepare it with `tfds build` or pass download=True"
            )
        _prepare_tfds(builder, name)
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    return dataset.map(
        lambda example: _tfds_example_to_pair(example, name, image_size),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def _tfds_example_to_pair(
    example: dict, name: str, image_size: tuple[int, int] | None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Converts one tfds example dict to `(uint8 image, label)`."""
    kind, num_classes = _TFDS_IMAGE_DATASETS[name]
    image = tf.convert_to_tensor(example["image"])
    if image_size is not None:
        image = tf.image.resize(image, image_size, antialias=True)
        image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    if kind == "multi_hot":
        label = _multi_hot(example["objects"]["label"], num_classes)
    else:
        label = tf.cast(example["label"], tf.int64)
    return image, label


def _multi_hot(label_ids, num_classes: int) -> tf.Tensor:
    """`(num_classes,)` int64 vector with ones at `label_ids` (repeats allowed)."""
    label_ids = tf.cast(tf.reshape(label_ids, [-1]), tf.int64)
    # tf.one_hot maps an out-of-range id to a zero row: fail loudly instead.
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(label_ids, message="negative label id"),
            tf.debugging.assert_less(
                label_ids, tf.constant(num_classes, tf.int64), message="label id >= C"
            ),
        ]
    ):
        counts = tf.reduce_sum(tf.one_hot(label_ids, num_classes, dtype=tf.int64), 0)
    return tf.minimum(counts, 1)


# --------------------------------------------------------------------------
# Image preprocessing


def to_rgb(images) -> np.ndarray:
    """Grey images to RGB by replicating the single channel; RGB unchanged.

    Example:

    >>> to_rgb(np.zeros((5, 28, 28), np.uint8)).shape
    (5, 28, 28, 3)

    Args:
        images: `(n, H, W)` or `(n, H, W, 1)` grey, or `(n, H, W, 3)` RGB.

    Returns:
        `(n, H, W, 3)` array of the same dtype (the input itself if RGB).

    Raises:
        ValueError: any other shape.
    """
    images = np.asarray(images)
    if images.ndim == 3:
        return np.repeat(images[..., np.newaxis], 3, axis=-1)
    if images.ndim == 4 and images.shape[-1] == 3:
        return images
    if images.ndim == 4 and images.shape[-1] == 1:
        return np.repeat(images, 3, axis=-1)
    raise ValueError(
        "images must have shape (n, H, W), (n, H, W, 1) or (n, H, W, 3), "
        f"received shape {images.shape}"
    )


def channel_statistics(images) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of uint8 images, in [0, 1] units.

    `mean_c = mean(x[..., c] / 255)`, `std_c = sqrt(mean((x[..., c] / 255 -
    mean_c)^2))` (population). The images are read in chunks into exact
    per-channel histograms of the 256 grey levels; the moments are then
    taken in float64 from the histograms, so the result does not depend on
    the number of images or their order, and memory stays small.

    Example:

    >>> mean, std = channel_statistics(images)  # CIFAR-10's: mean ≈ [0.491,
    >>> mean.shape, std.shape                   #   0.482, 0.447]
    ((3,), (3,))

    Args:
        images: uint8 `(n, H, W, C)`, or `(n, H, W)` (one channel), or a
            stream of `(image, label)` pairs (`subic_keras.streams`), read
            in one pass.

    Returns:
        `(mean, std)`: float64 arrays of shape `(C,)`.

    Raises:
        TypeError: `images` is not uint8.
        ValueError: bad shape or no images.
    """
    from subic_keras import streams

    if streams.is_stream(images):
        summary = streams.summarize(images, "images")
        if summary.histogram is None:
            raise TypeError(
                f"images must be uint8 (0..255), received a stream of {summary.dtype}"
            )
        return streams.histogram_moments(summary.histogram)
    images = _check_images(images)
    histogram = None
    for start in range(0, images.shape[0], _CHUNK):
        histogram = streams.add_histogram(histogram, images[start : start + _CHUNK])
    assert histogram is not None
    return streams.histogram_moments(histogram)


def standardize(images, mean, std) -> np.ndarray:
    """Per-channel standardisation of uint8 images: `(x / 255 - mean) / std`.

    Example:

    >>> mean, std = channel_statistics(images)
    >>> x = standardize(images, mean, std)
    >>> x.dtype, bool(np.allclose(x.mean(axis=(0, 1, 2)), 0, atol=1e-5))
    (dtype('float32'), True)

    Args:
        images: uint8 `(n, H, W, C)` or `(n, H, W)` (one channel, kept 3-D).
        mean: scalar or `(C,)`, in [0, 1] units (see `channel_statistics`).
        std: scalar or `(C,)`, all > 0.

    Returns:
        float32 array of the shape of `images`.
    """
    images = np.asarray(images)
    grey = images.ndim == 3
    images = _check_images(images)
    mean, std = _check_mean_std(mean, std, images.shape[-1])
    out = (images.astype(np.float32) / np.float32(255.0) - mean) / std
    return out[..., 0] if grey else out


def _check_images(images) -> np.ndarray:
    """uint8 `(n, H, W, C)` view of `images`, or raises."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise TypeError(f"images must be uint8 (0..255), received {images.dtype}")
    if images.ndim not in (3, 4) or 0 in images.shape:
        raise ValueError(
            "images must be a non-empty array of shape (n, H, W, C) or (n, H, W), "
            f"received shape {images.shape}"
        )
    return images[..., np.newaxis] if images.ndim == 3 else images


def _check_mean_std(mean, std, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """`mean` and `std` as float32 `(C,)`, or raises."""
    checked = []
    for name, value in (("mean", mean), ("std", std)):
        value = np.asarray(value, dtype=np.float64)
        if value.ndim == 0:
            value = np.full(channels, value)
        if value.shape != (channels,):
            raise ValueError(
                f"{name} must be a scalar or have shape ({channels},) to match the "
                f"images' channels, received shape {value.shape}"
            )
        if not np.all(np.isfinite(value)):
            raise ValueError(f"{name} must be finite, received {value}")
        checked.append(value.astype(np.float32))
    if np.any(checked[1] <= 0):
        raise ValueError(f"std must be > 0, received {checked[1]}")
    return checked[0], checked[1]


# --------------------------------------------------------------------------
# tf.data pipeline


def make_dataset(
    images,
    labels,
    batch_size: int,
    *,
    shuffle: bool = False,
    augment: bool = False,
    seed: int = 0,
    mean=None,
    std=None,
    drop_remainder: bool = False,
    repeat: bool = False,
) -> tf.data.Dataset:
    """A batched `tf.data` pipeline of standardised images for `model.fit`.

    Images stay uint8 in memory; each batch is gathered by index, optionally
    augmented, then standardised: `(x / 255 - mean) / std` (just `x / 255`
    when `mean` and `std` are `None`). Augmentation is vectorised over the
    batch: a random horizontal flip (probability 1/2) and a random shift of up
    to 4 pixels in each direction (zero-pad by 4, then crop back). With the
    same `seed`, two pipelines yield the same batches; each new pass over the
    data (each epoch) is shuffled and augmented afresh. Give `fit` the
    argument `shuffle=False`: the pipeline shuffles itself, and Keras warns
    when its default `shuffle=True` meets a `tf.data.Dataset`.

    Example:

    >>> mean, std = channel_statistics(images)
    >>> train = make_dataset(images, labels, 16, shuffle=True, augment=True,
    ...                      mean=mean, std=std)
    >>> batch_images, batch_labels = next(iter(train))
    >>> tuple(batch_images.shape), batch_images.dtype.name
    ((16, 32, 32, 3), 'float32')

    Pass it to `model.fit(train, epochs=10, shuffle=False)`: the dataset
    shuffles itself.

    Args:
        images: uint8 `(n, H, W, C)`, or `(n, H, W)` (given one channel).
        labels: `(n,)` class ids or `(n, C)` (e.g. multi-hot) targets.
        batch_size: images per batch, >= 1.
        shuffle: shuffle the examples (all `n` of them) on every pass.
        augment: random flip and shift.
        seed: seed of shuffling and augmentation.
        mean: per-channel mean in [0, 1] units (`channel_statistics`).
        std: per-channel standard deviation, > 0.
        drop_remainder: drop the last incomplete batch.
        repeat: repeat forever (pass `steps_per_epoch` to `fit`).

    Returns:
        A `tf.data.Dataset` of `(float32 images (b, H, W, C), labels (b, ...))`.

    Raises:
        TypeError: `images` is not uint8, or a non-integer count or seed.
        ValueError: mismatched lengths, bad shapes, `mean`/`std` given alone
            or not matching the channels, or no complete batch.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    images = _check_images(images)
    labels = np.asarray(labels)
    if labels.ndim == 0 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"images and labels must have the same length, received "
            f"{images.shape[0]} images and labels of shape {labels.shape}"
        )
    if (mean is None) != (std is None):
        raise ValueError(
            "mean and std must be given together (or both None), received "
            f"mean={mean!r} and std={std!r}"
        )
    channels = images.shape[-1]
    if mean is None:
        mean, std = np.zeros(channels, np.float32), np.ones(channels, np.float32)
    else:
        mean, std = _check_mean_std(mean, std, channels)
    n = images.shape[0]
    if drop_remainder and n < batch_size:
        raise ValueError(
            f"drop_remainder=True with {n} images and batch_size={batch_size} "
            "would yield no batch"
        )

    images_t = tf.convert_to_tensor(images)
    labels_t = tf.convert_to_tensor(labels)
    mean_t = tf.constant(mean, tf.float32)
    std_t = tf.constant(std, tf.float32)

    def standardize_batch(batch):
        return (scale_pixels(batch) - mean_t) / std_t

    # Shuffle indices, not images: the buffer is small and each batch is one
    # vectorised gather.
    indices = tf.data.Dataset.range(n)
    if shuffle:
        indices = indices.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        indices = indices.repeat()
    indices = indices.batch(batch_size, drop_remainder=drop_remainder)

    if augment:
        # One random int64 per batch seeds stateless ops: deterministic under
        # parallel map, and fresh on every pass over the dataset.
        batch_seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        dataset = tf.data.Dataset.zip((indices, batch_seeds))
    else:
        dataset = indices

    def load(idx, batch_seed=None):
        batch = tf.gather(images_t, idx)
        if batch_seed is not None:
            batch = _augment_batch(batch, batch_seed)
        return standardize_batch(batch), tf.gather(labels_t, idx)

    dataset = dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_stream_dataset(
    data, batch_size: int, *, augment: bool = False, seed: int = 0
) -> tf.data.Dataset:
    """`make_dataset` for a stream of `(image, label)` pairs, in its own order.

    The stream (`subic_keras.streams`: a `tf.data.Dataset` or `PyDataset`,
    batched or not) is batched by `batch_size` if its elements are single
    examples, augmented as `make_dataset` does (one random seed per batch
    from `seed`), and uint8 pixels are scaled to `[0, 1]`. With a stream that
    yields what `make_dataset`'s index shuffle picks, the batches are the
    same: e.g. `Dataset.from_tensor_slices((images, labels)).shuffle(n,
    seed)` against `make_dataset(images, labels, shuffle=True, seed=seed)`
    under the same global seed.

    Example:

    >>> pairs = tf.data.Dataset.from_tensor_slices((images, labels))
    >>> batch, batch_labels = next(iter(make_stream_dataset(pairs, 16, augment=True)))
    >>> tuple(batch.shape), batch.dtype.name
    ((16, 32, 32, 3), 'float32')

    Args:
        data: the stream.
        batch_size: examples per batch, for a stream of single examples.
        augment: random flip and shift (uint8 images only).
        seed: seed of the augmentation.

    Returns:
        A `tf.data.Dataset` of `(float32 inputs, labels)` batches.

    Raises:
        ValueError: `augment` with float inputs, or a stream that does not
            give `(image, label)` pairs.
    """
    from subic_keras import streams

    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    dataset = streams.checked_pixel_range(streams.labelled_batches(data, batch_size))
    uint8 = dataset.element_spec[0].dtype == tf.uint8
    if augment and not uint8:
        raise ValueError(
            "augment=True needs uint8 images, received a stream of "
            f"{dataset.element_spec[0].dtype.name}"
        )
    if augment and dataset.element_spec[0].shape.rank != 4:
        raise ValueError(
            "augment=True needs images (H, W, C), received elements of shape "
            f"{dataset.element_spec[0].shape}"
        )
    if augment:
        batch_seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        dataset = tf.data.Dataset.zip((dataset, batch_seeds)).map(
            lambda pair, batch_seed: (_augment_batch(pair[0], batch_seed), pair[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    dataset = dataset.map(
        lambda images, labels: (
            scale_pixels(images) if uint8 else tf.cast(images, tf.float32),
            labels,
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def _augment_batch(batch: tf.Tensor, batch_seed: tf.Tensor) -> tf.Tensor:
    """Random horizontal flip and random shift by up to `_SHIFT` pixels."""
    size = tf.shape(batch)[0]
    height, width = tf.shape(batch)[1], tf.shape(batch)[2]
    seed = tf.stack([batch_seed, tf.constant(0x5EB1C, tf.int64)])
    draws = tf.random.stateless_uniform([size, 3], seed=seed)
    flip = draws[:, 0] < 0.5
    batch = tf.where(flip[:, None, None, None], tf.reverse(batch, axis=[2]), batch)
    # Offsets in [0, 2 * _SHIFT] into the padded image: a shift in
    # [-_SHIFT, _SHIFT]; the min guards against a draw of exactly 1.0.
    offsets = tf.minimum(tf.cast(draws[:, 1:] * (2 * _SHIFT + 1), tf.int32), 2 * _SHIFT)
    padded = tf.pad(batch, [[0, 0], [_SHIFT, _SHIFT], [_SHIFT, _SHIFT], [0, 0]])
    rows = offsets[:, 0:1] + tf.range(height)[None, :]
    cols = offsets[:, 1:2] + tf.range(width)[None, :]
    shifted = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(shifted, cols, axis=2, batch_dims=1)


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


def _check_image_size(image_size) -> tuple[int, int] | None:
    if image_size is None:
        return None
    if not isinstance(image_size, (tuple, list)) or len(image_size) != 2:
        raise ValueError(
            f"image_size must be a (height, width) pair or None, received "
            f"{image_size!r}"
        )
    return (
        check_int("image_size[0]", image_size[0], minimum=1),
        check_int("image_size[1]", image_size[1], minimum=1),
    )


def _check_labels_range(path: str, labels: np.ndarray, num_classes: int) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{path!r} holds labels outside [0, {num_classes}): "
            f"min {labels.min()}, max {labels.max()}"
        )
