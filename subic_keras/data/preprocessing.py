"""Image preprocessing for training: RGB conversion and per-channel
standardisation, `(x / 255 - mean) / std`, with `mean` and `std` from
`channel_statistics` on the training images.
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1024  # Images per chunk in `channel_statistics`.

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
            stream of `(image, label)` pairs (`subic_keras.data.streams`), read
            in one pass.

    Returns:
        `(mean, std)`: float64 arrays of shape `(C,)`.

    Raises:
        TypeError: `images` is not uint8.
        ValueError: bad shape or no images.
    """
    from subic_keras.data import streams

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
