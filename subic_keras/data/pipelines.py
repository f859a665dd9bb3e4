"""`tf.data` input pipelines: arrays and streams of pictures to shuffled,
augmented, standardised batches for `model.fit`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from subic_keras._validation import check_int
from subic_keras.data.pixels import scale_pixels
from subic_keras.data.preprocessing import _check_images, _check_mean_std

_SHIFT = 4  # Maximum random shift, in pixels, of `make_dataset`'s augmentation.

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

    >>> from subic_keras.data.preprocessing import channel_statistics
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

    @tf.autograph.experimental.do_not_convert
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

    The stream (`subic_keras.data.streams`: a `tf.data.Dataset` or `PyDataset`,
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
    from subic_keras.data import streams

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
            tf.autograph.experimental.do_not_convert(
                lambda pair, batch_seed: (_augment_batch(pair[0], batch_seed), pair[1])
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    dataset = dataset.map(
        tf.autograph.experimental.do_not_convert(
            lambda images, labels: (
                scale_pixels(images) if uint8 else tf.cast(images, tf.float32),
                labels,
            )
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
