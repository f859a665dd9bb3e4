import gzip
import io
import os
import pickle
import struct

import numpy as np
import pytest
import tensorflow as tf

from subic_keras.data.datasets import (
    load_cifar10,
    load_digits,
    load_fashion_mnist,
    train_validation_split,
)

# --------------------------------------------------------------------------
# CIFAR-10


def _parse_cifar_records(path, count):
    """Independent parse: pixel (r, c) of channel ch is byte 1 + ch*1024 + r*32 + c."""
    with open(path, "rb") as handle:
        raw = handle.read(count * 3073)
    images = np.zeros((count, 32, 32, 3), np.uint8)
    labels = np.zeros(count, np.int64)
    for i in range(count):
        record = raw[i * 3073 : (i + 1) * 3073]
        labels[i] = record[0]
        for ch in range(3):
            plane = np.array(list(record[1 + ch * 1024 : 1 + (ch + 1) * 1024]))
            images[i, :, :, ch] = plane.reshape(32, 32)
    return images, labels


def test_cifar_binary_first_records_match_independent_parse(shared_data_dir):
    directory = shared_data_dir / "cifar-10-batches-bin"
    (x_train, y_train), (x_test, y_test) = load_cifar10(directory, max_per_split=5)
    assert x_train.shape == (5, 32, 32, 3) and x_test.shape == (5, 32, 32, 3)
    assert x_train.dtype == np.uint8 and y_train.dtype == np.int64
    ref_x, ref_y = _parse_cifar_records(directory / "data_batch_1.bin", 5)
    np.testing.assert_array_equal(x_train, ref_x)
    np.testing.assert_array_equal(y_train, ref_y)
    ref_x, ref_y = _parse_cifar_records(directory / "test_batch.bin", 5)
    np.testing.assert_array_equal(x_test, ref_x)
    np.testing.assert_array_equal(y_test, ref_y)
    # The parent directory works too.
    (x_parent, _), _ = load_cifar10(str(shared_data_dir), max_per_split=5)
    np.testing.assert_array_equal(x_parent, x_train)


def _write_synthetic_cifar(root, records_per_file=3, seed=0):
    """Writes the same random records in both official layouts under `root`."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    binary = root / "cifar-10-batches-bin"
    python = root / "cifar-10-batches-py"
    binary.mkdir()
    python.mkdir()
    expected = {}
    for name in names:
        labels = rng.integers(0, 10, records_per_file)
        images = rng.integers(0, 256, (records_per_file, 32, 32, 3), dtype=np.uint8)
        planes = images.transpose(0, 3, 1, 2).reshape(records_per_file, 3072)
        records = np.concatenate([labels[:, None].astype(np.uint8), planes], axis=1)
        (binary / f"{name}.bin").write_bytes(records.tobytes())
        with open(python / name, "wb") as handle:
            pickle.dump({b"data": planes, b"labels": labels.tolist()}, handle)
        expected[name] = (images, labels)
    train = [expected[f"data_batch_{i}"] for i in range(1, 6)]
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return binary, python, (x_train, y_train), expected["test_batch"]


@pytest.mark.parametrize("layout", ["binary", "python"])
def test_cifar_synthetic_layouts(tmp_path, layout):
    binary, python, (x_train, y_train), (x_test, y_test) = _write_synthetic_cifar(
        tmp_path
    )
    directory = binary if layout == "binary" else python
    (xa, ya), (xb, yb) = load_cifar10(directory)
    np.testing.assert_array_equal(xa, x_train)
    np.testing.assert_array_equal(ya, y_train)
    np.testing.assert_array_equal(xb, x_test)
    np.testing.assert_array_equal(yb, y_test)
    assert ya.dtype == np.int64 and xa.flags["C_CONTIGUOUS"]
    # A limit spanning three files, larger than the test split.
    (xa, ya), (xb, yb) = load_cifar10(directory, max_per_split=7)
    np.testing.assert_array_equal(xa, x_train[:7])
    np.testing.assert_array_equal(ya, y_train[:7])
    np.testing.assert_array_equal(xb, x_test)


def test_cifar_python_layout_found_from_parent(tmp_path):
    _, _, (x_train, _), _ = _write_synthetic_cifar(tmp_path)
    for path in (tmp_path / "cifar-10-batches-bin").iterdir():
        path.unlink()
    (tmp_path / "cifar-10-batches-bin").rmdir()
    (xa, _), _ = load_cifar10(tmp_path)
    np.testing.assert_array_equal(xa, x_train)


def test_cifar_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cifar10(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"data_batch_1\.bin.*data_batch_1"):
        load_cifar10(tmp_path)
    binary, python, _, _ = _write_synthetic_cifar(tmp_path)
    with pytest.raises(ValueError, match="max_per_split must be >= 1"):
        load_cifar10(binary, max_per_split=0)

    # Truncated record.
    path = binary / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"data_batch_3\.bin.*truncated.*3073"):
        load_cifar10(binary)
    # Missing file, named.
    path.unlink()
    with pytest.raises(FileNotFoundError, match=r"missing \['data_batch_3\.bin'\]"):
        load_cifar10(binary)

    # Corrupt pickle, and a dict without the expected keys.
    path = python / "test_batch"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"test_batch.*truncated"):
        load_cifar10(python)
    with open(path, "wb") as handle:
        pickle.dump({b"pixels": np.zeros((2, 3072), np.uint8)}, handle)
    with pytest.raises(ValueError, match="b'data'"):
        load_cifar10(python)
    with open(path, "wb") as handle:
        pickle.dump(
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 10]}, handle
        )
    with pytest.raises(ValueError, match=r"labels outside \[0, 10\)"):
        load_cifar10(python)


class FakeBuilder:
    """A tfds builder whose data is prepared (or is made by `prepare`)."""

    def __init__(self, name, root, splits, prepared=True, prepare=None):
        self.name, self.data_dir_root = name, root
        self.data_dir = os.path.join(root, name, "1.0.0")
        self.splits, self.prepared, self.prepare = splits, prepared, prepare
        self.requests = []

    def is_prepared(self):
        return self.prepared

    def download_and_prepare(self):
        self.prepare(self)

    def as_dataset(self, split, batch_size, as_supervised):
        self.requests.append((split, batch_size, as_supervised))
        return [tuple(tf.constant(array) for array in part) for part in self.splits]


def _fake_tfds(monkeypatch, builder):
    import tensorflow_datasets as tfds

    monkeypatch.setattr(tfds, "builder", lambda name, **kwargs: builder)


def test_cifar_tfds_fallback_is_called(monkeypatch, tmp_path):
    splits = [
        (np.ones((4, 32, 32, 3), np.uint8), np.arange(4)),
        (np.zeros((2, 32, 32, 3), np.uint8), np.arange(2)),
    ]
    builder = FakeBuilder("cifar10", str(tmp_path), splits)
    _fake_tfds(monkeypatch, builder)
    (x_train, y_train), (x_test, _) = load_cifar10(max_per_split=4, download=False)
    assert builder.requests == [(["train[:4]", "test[:4]"], -1, True)]
    assert x_train.shape == (4, 32, 32, 3) and y_train.dtype == np.int64
    assert x_test.shape == (2, 32, 32, 3)
    builder.prepared = False
    with pytest.raises(FileNotFoundError, match="pass download=True"):
        load_cifar10(download=False)


def test_tfds_offline_fails_fast_and_leaves_nothing(monkeypatch, tmp_path):
    import socket

    def unreachable(address, timeout):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    builder = FakeBuilder("fashion_mnist", str(tmp_path / "tfds"), [], prepared=False)
    _fake_tfds(monkeypatch, builder)
    with pytest.raises(ConnectionError, match=r"--data-dir DIR.*t10k-images"):
        load_fashion_mnist()
    assert not (tmp_path / "tfds").exists()


def test_tfds_download_failing_midway_leaves_nothing(monkeypatch, tmp_path):
    import socket

    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: io.BytesIO())
    root = tmp_path / "tfds"
    (root / "downloads").mkdir(parents=True)
    (root / "downloads" / "kept.gz").write_text("an earlier download")

    def prepare(builder):
        (root / "fashion_mnist" / "incomplete.X").mkdir(parents=True)
        (root / "downloads" / "file.gz.tmp.1").write_text("partial")
        raise ConnectionError("connection reset")

    builder = FakeBuilder("fashion_mnist", str(root), [], False, prepare)
    _fake_tfds(monkeypatch, builder)
    with pytest.raises(ConnectionError, match="connection reset"):
        load_fashion_mnist()
    assert sorted(os.listdir(root)) == ["downloads"]
    assert os.listdir(root / "downloads") == ["kept.gz"]


# --------------------------------------------------------------------------
# Fashion-MNIST


def _parse_idx_gz(path, count, item_bytes, header_bytes):
    with gzip.open(path, "rb") as handle:
        raw = handle.read(header_bytes + count * item_bytes)
    return list(raw[header_bytes:])


def test_fashion_mnist_first_records(shared_data_dir):
    directory = shared_data_dir / "fashion-mnist"
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(
        directory, max_per_split=6
    )
    assert x_train.shape == (6, 28, 28) and x_test.shape == (6, 28, 28)
    assert x_train.dtype == np.uint8 and y_train.dtype == np.int64
    for x, y, prefix in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        images = _parse_idx_gz(directory / f"{prefix}-images-idx3-ubyte.gz", 6, 784, 16)
        labels = _parse_idx_gz(directory / f"{prefix}-labels-idx1-ubyte.gz", 6, 1, 8)
        assert x.reshape(-1).tolist() == images
        assert y.tolist() == labels
    (x_parent, _), _ = load_fashion_mnist(shared_data_dir, max_per_split=6)
    np.testing.assert_array_equal(x_parent, x_train)


def _write_idx(path, array, magic, compress=False):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)


def _write_synthetic_fashion(directory, n_train=5, n_test=3, compress=False):
    rng = np.random.default_rng(1)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        _write_idx(directory / f"{prefix}-images-idx3-ubyte", x, 0x803, compress)
        _write_idx(directory / f"{prefix}-labels-idx1-ubyte", y, 0x801, compress)
        arrays[prefix] = (x, y)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_fashion_mnist_synthetic(tmp_path, compress):
    arrays = _write_synthetic_fashion(tmp_path, compress=compress)
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(tmp_path)
    np.testing.assert_array_equal(x_train, arrays["train"][0])
    np.testing.assert_array_equal(y_train, arrays["train"][1])
    np.testing.assert_array_equal(x_test, arrays["t10k"][0])
    np.testing.assert_array_equal(y_test, arrays["t10k"][1])
    x_train[0, 0, 0] = 1  # Writable.
    (x_train, _), (x_test, _) = load_fashion_mnist(tmp_path, max_per_split=4)
    assert x_train.shape == (4, 28, 28) and x_test.shape == (3, 28, 28)


def test_fashion_mnist_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_fashion_mnist(tmp_path)
    _write_synthetic_fashion(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte"
    labels = tmp_path / "train-labels-idx1-ubyte"
    good_images = images.read_bytes()

    images.write_bytes(good_images[:-5])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*truncated"):
        load_fashion_mnist(tmp_path)
    images.write_bytes(struct.pack(">I", 0x801) + good_images[4:])
    with pytest.raises(ValueError, match="magic number 0x00000801"):
        load_fashion_mnist(tmp_path)
    images.write_bytes(good_images)
    _write_idx(labels, np.zeros(4, np.uint8), 0x801)
    with pytest.raises(ValueError, match=r"5 images but .* 4 labels"):
        load_fashion_mnist(tmp_path)
    labels.unlink()
    with pytest.raises(FileNotFoundError, match=r"missing.*train-labels-idx1-ubyte"):
        load_fashion_mnist(tmp_path)
    # A gzip archive cut short.
    _write_synthetic_fashion(tmp_path, compress=True)
    for name in os.listdir(tmp_path):
        if not name.endswith(".gz"):
            os.remove(tmp_path / name)
    gz = tmp_path / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte\.gz"):
        load_fashion_mnist(tmp_path)


def test_fashion_mnist_tfds_fallback_squeezes_channel(monkeypatch, tmp_path):
    splits = [
        (np.ones((3, 28, 28, 1), np.uint8), np.arange(3)),
        (np.ones((2, 28, 28, 1), np.uint8), np.arange(2)),
    ]
    builder = FakeBuilder("fashion_mnist", str(tmp_path), splits)
    _fake_tfds(monkeypatch, builder)
    (x_train, _), (x_test, _) = load_fashion_mnist()
    assert builder.requests[0][0] == ["train", "test"]
    assert x_train.shape == (3, 28, 28) and x_test.shape == (2, 28, 28)


# --------------------------------------------------------------------------
# Digits


def test_load_digits():
    from sklearn.datasets import load_digits as sklearn_digits

    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.dtype == np.uint8 and y_train.dtype == np.int64
    assert x_train.shape[1:] == (8, 8) and len(x_train) + len(x_test) == 1797
    assert len(x_test) == 599
    assert x_train.max() == 255 and x_train.min() == 0
    (x2, _), (_, y3) = load_digits()
    np.testing.assert_array_equal(x2, x_train)
    np.testing.assert_array_equal(y3, y_test)
    # Stratified: each class's test share is within one of a third.
    counts = np.bincount(np.concatenate([y_train, y_test]))
    assert np.all(np.abs(np.bincount(y_test) - counts / 3) <= 1)
    # The split is of the original images, scaled by 255/16.
    original = sklearn_digits().images.reshape(1797, -1)
    _, test_idx = train_validation_split(sklearn_digits().target, 1 / 3, seed=0)
    np.testing.assert_array_equal(
        x_test.reshape(len(x_test), -1), np.rint(original[test_idx] * 255 / 16)
    )


class _Payload:
    """Pickles to a call of `os.system`: what a malicious mirror could serve."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar_python_layout_never_runs_code(tmp_path, protocol):
    _, python, _, _ = _write_synthetic_cifar(tmp_path)
    marker = tmp_path / "pwned"
    with open(python / "data_batch_1", "wb") as handle:
        pickle.dump({b"data": _Payload(marker), b"labels": [0]}, handle, protocol)
    with pytest.raises(ValueError, match=r"data_batch_1.*references .*system"):
        load_cifar10(python)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar_python_layout_reads_any_pickle_protocol(tmp_path, protocol):
    _, python, (x_train, y_train), _ = _write_synthetic_cifar(tmp_path)
    for i in range(1, 6):
        path = python / f"data_batch_{i}"
        with open(path, "rb") as handle:
            batch = pickle.load(handle)
        with open(path, "wb") as handle:
            pickle.dump(batch, handle, protocol)
    (x, y), _ = load_cifar10(python)
    np.testing.assert_array_equal(x, x_train)
    np.testing.assert_array_equal(y, y_train)


def test_load_images_limit_caps_training_images_only(shared_data_dir):
    from subic_keras.data.datasets import load_images

    (x_train, y_train), (x_test, y_test) = load_images(
        "cifar10", str(shared_data_dir / "cifar-10-batches-bin"), limit=50
    )
    assert len(x_train) == len(y_train) == 50
    assert len(x_test) == len(y_test) == 10000
