"""Tests of `subic_keras.data.tfds_loaders` that need no prepared data."""

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from subic_keras.data import tfds_loaders
from subic_keras.data.datasets import load_tfds_images


def test_load_tfds_images_not_prepared(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"'caltech101'.*{tmp_path}"):
        load_tfds_images("caltech101", "train", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'voc/2007'.*download=True"):
        load_tfds_images("voc/2007", "test", data_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # Nothing was created.
    with pytest.raises(ValueError, match="name must be one of"):
        load_tfds_images("mnist", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="image_size"):
        load_tfds_images("caltech101", "train", data_dir=tmp_path, image_size=(3,))


def test_tfds_example_conversion():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    voc = {"image": tf.constant(raw), "objects": {"label": tf.constant([4, 0, 4])}}
    image, label = tfds_loaders._tfds_example_to_pair(voc, "voc/2007", (16, 20))
    assert image.dtype == tf.uint8 and image.shape == (16, 20, 3)
    expected = np.zeros(20, np.int64)
    expected[[0, 4]] = 1
    np.testing.assert_array_equal(label.numpy(), expected)
    assert label.dtype == tf.int64

    caltech = {"image": tf.constant(raw), "label": tf.constant(17, tf.int64)}
    image, label = tfds_loaders._tfds_example_to_pair(caltech, "caltech101", None)
    np.testing.assert_array_equal(image.numpy(), raw)
    assert int(label) == 17

    empty = tfds_loaders._multi_hot(tf.zeros([0], tf.int64), 20)
    np.testing.assert_array_equal(empty.numpy(), np.zeros(20))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tfds_loaders._multi_hot(tf.constant([20]), 20)


def test_an_unprepared_builder_leaves_no_folder_in_the_temporary_folder(
    tmp_path, monkeypatch
):
    # tensorflow-datasets makes `tmp…tfds` there for the dataset's metadata
    # on Google's bucket whenever the data is not prepared, and keeps it.
    scratch = tmp_path / "temporary"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    mine = scratch / "tmpmine_tfds"  # someone's own folder of that name stays
    mine.mkdir()
    with pytest.raises(FileNotFoundError, match="'caltech101'"):
        load_tfds_images("caltech101", "train", data_dir=tmp_path / "tfds")
    assert os.listdir(scratch) == ["tmpmine_tfds"]
