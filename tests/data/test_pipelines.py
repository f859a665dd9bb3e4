"""Tests of `subic_keras.data.pipelines`: `make_dataset`'s batches,
shuffling, augmentation and errors."""

import numpy as np
import pytest
import tensorflow as tf

from subic_keras.data.datasets import make_dataset, standardize


def _batches(dataset):
    return [(x.numpy(), y.numpy()) for x, y in dataset]


def _images(n=10, size=8, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    return images, np.arange(n, dtype=np.int64)


def test_make_dataset_shapes_and_values():
    images, labels = _images()
    mean, std = np.array([0.4, 0.5, 0.6]), np.array([0.2, 0.3, 0.4])
    dataset = make_dataset(images, labels, 4, mean=mean, std=std)
    x_spec, y_spec = dataset.element_spec
    assert x_spec.dtype == tf.float32 and x_spec.shape.as_list() == [None, 8, 8, 3]
    assert y_spec.dtype == tf.int64
    batches = _batches(dataset)
    assert [len(y) for _, y in batches] == [4, 4, 2]
    x = np.concatenate([x for x, _ in batches])
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
    np.testing.assert_allclose(x, standardize(images, mean, std), atol=1e-6)
    # No statistics: just x / 255; grey images get a channel axis.
    (x, _), *_ = _batches(make_dataset(images[..., 0], labels, 10))
    assert x.shape == (10, 8, 8, 1)
    np.testing.assert_allclose(x[..., 0], images[..., 0] / 255, atol=1e-6)
    assert len(_batches(make_dataset(images, labels, 4, drop_remainder=True))) == 2


def test_make_dataset_shuffle_is_seeded():
    images, labels = _images(n=12)
    first = _batches(make_dataset(images, labels, 5, shuffle=True, seed=3))
    again = _batches(make_dataset(images, labels, 5, shuffle=True, seed=3))
    other = _batches(make_dataset(images, labels, 5, shuffle=True, seed=4))
    order = np.concatenate([y for _, y in first])
    np.testing.assert_array_equal(order, np.concatenate([y for _, y in again]))
    assert not np.array_equal(order, np.concatenate([y for _, y in other]))
    assert not np.array_equal(order, labels)
    np.testing.assert_array_equal(np.sort(order), labels)  # A permutation.
    for x, y in first:  # Images follow their labels.
        np.testing.assert_allclose(x, images[y] / 255, atol=1e-6)
    # Repeating: more batches than one epoch, each epoch a permutation.
    repeated = make_dataset(images, labels, 4, shuffle=True, repeat=True, seed=3)
    seen = np.concatenate([y for _, y in _batches(repeated.take(6))])
    np.testing.assert_array_equal(np.sort(seen[:12]), labels)
    np.testing.assert_array_equal(np.sort(seen[12:]), labels)
    assert not np.array_equal(seen[:12], seen[12:])


def _candidates(image, shift=4):
    """Every flip and shift of `image` by up to `shift` pixels, zero-padded."""
    size = image.shape[0]
    out = []
    for flipped in (image, image[:, ::-1]):
        padded = np.pad(flipped, ((shift, shift), (shift, shift), (0, 0)))
        for dy in range(2 * shift + 1):
            for dx in range(2 * shift + 1):
                out.append(padded[dy : dy + size, dx : dx + size])
    return np.stack(out)


def test_make_dataset_augmentation():
    images, labels = _images(n=16)
    dataset = make_dataset(images, labels, 8, augment=True, seed=5)
    batches = _batches(dataset)
    x = np.concatenate([x for x, _ in batches])
    assert x.shape == (16, 8, 8, 3) and x.dtype == np.float32
    pixels = np.rint(x * 255).astype(np.uint8)
    assert not np.array_equal(pixels, images)
    changed = 0
    for i in range(16):
        candidates = _candidates(images[i])
        matches = np.all(candidates == pixels[i], axis=(1, 2, 3))
        assert matches.any(), f"image {i} is no flip/shift of its original"
        changed += not matches[40]  # Index 40: unflipped, unshifted.
    assert changed >= 8
    # Deterministic given the seed; a new pass draws new augmentations.
    again = _batches(make_dataset(images, labels, 8, augment=True, seed=5))
    np.testing.assert_array_equal(x, np.concatenate([x for x, _ in again]))
    second_pass = np.concatenate([x for x, _ in _batches(dataset)])
    assert not np.array_equal(x, second_pass)


def test_make_dataset_feeds_keras_fit():
    import keras

    images, labels = _images(n=20)
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(20)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = make_dataset(images, labels, 8, shuffle=True, augment=True)
    history = model.fit(dataset, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2


def test_make_dataset_errors():
    images, labels = _images(n=6)
    with pytest.raises(ValueError, match="batch_size must be >= 1, received 0"):
        make_dataset(images, labels, 0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        make_dataset(images, labels, 2.0)
    with pytest.raises(ValueError, match="6 images and labels of shape \\(5,\\)"):
        make_dataset(images, labels[:5], 2)
    with pytest.raises(TypeError, match="uint8"):
        make_dataset(images / 255.0, labels, 2)
    with pytest.raises(ValueError, match="mean and std must be given together"):
        make_dataset(images, labels, 2, mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="would yield no batch"):
        make_dataset(images, labels, 7, drop_remainder=True)
    with pytest.raises(ValueError, match=r"received shape \(6, 8\)"):
        make_dataset(images[:, 0, :, 0], labels, 2)
