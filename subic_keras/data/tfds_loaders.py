"""tensorflow-datasets loaders: the datasets without a local layout, and the
fallback of the local loaders when no `data_dir` is given.

Downloads need the network once; offline, each loader says in one line
which layout `data_dir` takes instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile

import numpy as np
import tensorflow as tf

from subic_keras._validation import check_int

# Labels produced by `load_tfds_images`: "multi_hot" over `num_classes`
# classes from the objects' labels, or the "label" class id.
_TFDS_IMAGE_DATASETS = {
    "voc/2007": ("multi_hot", 20),
    "caltech101": ("label", 102),
    "imagenet2012": ("label", 1000),
}

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


def _builder(name: str, data_dir: str | None = None):
    """`tfds.builder`, without the empty folder it leaves in the temporary
    folder: a builder of a dataset not prepared yet makes one (`tmp…tfds`)
    for the dataset's metadata from Google's bucket, and never removes it."""
    import tensorflow_datasets as tfds

    pattern = os.path.join(tempfile.gettempdir(), "tmp*tfds")
    before = set(glob.glob(pattern))
    try:
        return tfds.builder(name, data_dir=data_dir)
    finally:
        for scratch in set(glob.glob(pattern)) - before:
            try:
                os.rmdir(scratch)  # only if empty: never a file of anyone's
            except OSError:
                pass


def _load_tfds_arrays(name: str, limit: int | None, download: bool):
    """Both splits of a small tfds dataset as NumPy arrays."""
    import tensorflow_datasets as tfds

    builder = _builder(name)
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

    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    builder = _builder(name, data_dir=data_dir)
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
        tf.autograph.experimental.do_not_convert(
            lambda example: _tfds_example_to_pair(example, name, image_size)
        ),
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
