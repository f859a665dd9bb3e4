"""Tests of `subic_keras.data.preprocessing`: grey to RGB, channel
statistics and standardization."""

import numpy as np
import pytest

from subic_keras.data import preprocessing
from subic_keras.data.datasets import channel_statistics, standardize, to_rgb


def test_to_rgb():
    grey = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for images in (grey, grey[..., None]):
        rgb = to_rgb(images)
        assert rgb.shape == (2, 3, 4, 3) and rgb.dtype == np.uint8
        for c in range(3):
            np.testing.assert_array_equal(rgb[..., c], grey)
    colour = np.zeros((2, 3, 4, 3), np.uint8)
    assert to_rgb(colour) is colour
    for shape in [(2, 3, 4, 2), (3, 4), (1, 2, 3, 4, 3)]:
        with pytest.raises(ValueError, match=rf"received shape \({shape[0]}, "):
            to_rgb(np.zeros(shape, np.uint8))


def test_channel_statistics_matches_numpy(monkeypatch):
    monkeypatch.setattr(preprocessing, "_CHUNK", 3)  # Several chunks.
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 5, 6, 3), dtype=np.uint8)
    mean, std = channel_statistics(images)
    scaled = images.astype(np.float64) / 255
    np.testing.assert_allclose(mean, scaled.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, scaled.std(axis=(0, 1, 2)), rtol=1e-12)
    assert mean.dtype == np.float64 and mean.shape == (3,)
    mean, std = channel_statistics(images[..., 0])
    assert mean.shape == (1,)
    np.testing.assert_allclose(std, scaled[..., 0].std(), rtol=1e-12)
    with pytest.raises(TypeError, match="uint8"):
        channel_statistics(scaled)
    with pytest.raises(ValueError, match=r"received shape \(0, 5, 6, 3\)"):
        channel_statistics(images[:0])


def test_standardize():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 5, 6, 3), dtype=np.uint8)
    mean, std = np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.25, 0.5])
    out = standardize(images, mean, std)
    assert out.dtype == np.float32 and out.shape == images.shape
    reference = (images / 255.0 - mean) / std
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
    out = standardize(images[..., 0], 0.5, 0.25)
    assert out.shape == (4, 5, 6)
    np.testing.assert_allclose(out, (images[..., 0] / 255 - 0.5) / 0.25, atol=1e-5)
    with pytest.raises(ValueError, match=r"std must be > 0"):
        standardize(images, mean, [0.1, 0.0, 0.1])
    with pytest.raises(ValueError, match=r"mean must be a scalar or have shape \(3,\)"):
        standardize(images, [0.1, 0.2], std)
