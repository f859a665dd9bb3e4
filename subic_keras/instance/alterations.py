"""The alterations a copy of a picture goes through: one public family.

An instance code (`subic_keras.instance.instance_code`) is trained to give a picture and
its altered copies the same code, and is measured on copies altered by the
same family, or by a part of it held out of training. Each alteration is a
TensorFlow function of one float picture `(H, W, C)` in `[0, 1]` and a
stateless seed, so it runs on the fly in `tf.data` and is reproducible:

| family | what it does |
|---|---|
| `crop` | keeps 40–100 % of the area at any offset, resized back |
| `aspect` | stretches by a ratio in [3/4, 4/3], cropped back to the frame |
| `rotation` | turns by up to ±20°, the corners filled by reflection |
| `flip` | mirrors left to right |
| `rescale` | shrinks to 25–75 % of each side and enlarges back |
| `jpeg` | recompresses at quality 20–95 |
| `blur` | a Gaussian blur of 0.5–1.5 pixels |
| `noise` | Gaussian noise (σ 0.02–0.08) or salt and pepper (1–4 %) |
| `colour` | brightness ±0.25, contrast and saturation ×[0.6, 1.4], hue ±0.08 |
| `greyscale` | keeps the luma only |
| `border` | pads 4–15 % of each side with one colour, resized back |
| `overlay` | pastes a rectangle of one colour over 4–16 % of the picture |

`alter` applies a mixture of two to four families, drawn for each picture
(each at most once, in the order of the table). `HELD_OUT` groups the
families that a leave-one-out study removes from training together.

NumPy callers use `alter_batch`, which runs the same functions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from subic_keras._validation import check_int, check_pictures

FAMILIES = (
    "crop",
    "aspect",
    "rotation",
    "flip",
    "rescale",
    "jpeg",
    "blur",
    "noise",
    "colour",
    "greyscale",
    "border",
    "overlay",
)
# What a leave-one-family-out study holds out of training, together.
HELD_OUT = {
    "rotation": ("rotation",),
    "crop": ("crop", "aspect", "border"),
    "noise": ("noise", "blur", "rescale", "jpeg"),
    "colour": ("colour", "greyscale"),
    "overlay": ("overlay",),
}
MIXTURE = (2, 4)  # how many families each copy goes through, at least and most


def check_families(families: Sequence[str]) -> tuple[str, ...]:
    """`families` as a tuple in `FAMILIES` order, each known and given once."""
    if isinstance(families, str):
        raise TypeError("families must be a sequence of names, received one string")
    families = tuple(families)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families or len(set(families)) != len(families):
        raise ValueError(
            f"families must be distinct names of {', '.join(FAMILIES)}, "
            f"received {list(families)}"
        )
    return tuple(name for name in FAMILIES if name in families)


def without(held_out: str) -> tuple[str, ...]:
    """The families left for training when `held_out` (a `HELD_OUT` key) is
    held out."""
    if held_out not in HELD_OUT:
        raise ValueError(
            f"held_out must be one of {', '.join(HELD_OUT)}, received {held_out!r}"
        )
    return tuple(name for name in FAMILIES if name not in HELD_OUT[held_out])


def _uniform(seed, low: float, high: float, index: int) -> tf.Tensor:
    """One stateless draw in `[low, high)`, the `index`-th of `seed`'s."""
    key = tf.stack([seed[0], seed[1] + index])
    return tf.random.stateless_uniform([], key, low, high)


def _resize(image: tf.Tensor, size) -> tf.Tensor:
    return tf.image.resize(image, size, method="bilinear", antialias=True)


def _crop_to(image: tf.Tensor, box: tf.Tensor) -> tf.Tensor:
    """The part of `image` in `box` = (top, left, height, width) in [0, 1]
    fractions, resized back to the picture's size."""
    size = tf.shape(image)[:2]
    boxes = tf.stack([box[0], box[1], box[0] + box[2], box[1] + box[3]])[None]
    return tf.image.crop_and_resize(image[None], boxes, [0], size)[0]


def crop(image, seed):
    area = _uniform(seed, 0.4, 1.0, 0)
    side = tf.sqrt(area)
    top = _uniform(seed, 0.0, 1.0, 1) * (1.0 - side)
    left = _uniform(seed, 0.0, 1.0, 2) * (1.0 - side)
    return _crop_to(image, tf.stack([top, left, side, side]))


def aspect(image, seed):
    ratio = tf.exp(_uniform(seed, math.log(3 / 4), math.log(4 / 3), 0))
    # Stretching one side by `ratio` and cropping back to the frame keeps
    # the part 1/ratio of that side.
    height = tf.minimum(1.0, 1.0 / ratio)
    width = tf.minimum(1.0, ratio)
    top = _uniform(seed, 0.0, 1.0, 1) * (1.0 - height)
    left = _uniform(seed, 0.0, 1.0, 2) * (1.0 - width)
    return _crop_to(image, tf.stack([top, left, height, width]))


def rotation(image, seed):
    angle = _uniform(seed, -20.0, 20.0, 0) * (math.pi / 180.0)
    size = tf.cast(tf.shape(image)[:2], tf.float32)
    cos, sin = tf.cos(angle), tf.sin(angle)
    cy, cx = (size[0] - 1.0) / 2.0, (size[1] - 1.0) / 2.0
    # The output pixel (x, y) reads the input at the inverse rotation.
    transform = tf.stack(
        [
            cos,
            -sin,
            cx - cos * cx + sin * cy,
            sin,
            cos,
            cy - sin * cx - cos * cy,
            0.0,
            0.0,
        ]
    )
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None],
        transforms=transform[None],
        output_shape=tf.shape(image)[:2],
        fill_value=0.0,
        interpolation="BILINEAR",
        fill_mode="REFLECT",
    )[0]


def flip(image, seed):
    del seed
    return tf.image.flip_left_right(image)


def rescale(image, seed):
    size = tf.shape(image)[:2]
    factor = _uniform(seed, 0.25, 0.75, 0)
    small = tf.maximum(1, tf.cast(tf.cast(size, tf.float32) * factor, tf.int32))
    return _resize(_resize(image, small), size)


def jpeg(image, seed):
    quality = tf.cast(_uniform(seed, 20.0, 96.0, 0), tf.int32)
    return tf.image.adjust_jpeg_quality(image, quality)


def blur(image, seed):
    sigma = _uniform(seed, 0.5, 1.5, 0)
    offsets = tf.range(-3.0, 4.0)
    weights = tf.exp(-0.5 * tf.square(offsets / sigma))
    weights /= tf.reduce_sum(weights)
    channels = tf.shape(image)[-1]
    rows = tf.tile(tf.reshape(weights, [7, 1, 1, 1]), [1, 1, channels, 1])
    cols = tf.tile(tf.reshape(weights, [1, 7, 1, 1]), [1, 1, channels, 1])
    padded = tf.pad(image[None], [[0, 0], [3, 3], [3, 3], [0, 0]], mode="REFLECT")
    blurred = tf.nn.depthwise_conv2d(padded, rows, [1, 1, 1, 1], "VALID")
    return tf.nn.depthwise_conv2d(blurred, cols, [1, 1, 1, 1], "VALID")[0]


def noise(image, seed):
    key = tf.stack([seed[0], seed[1] + 1])
    gaussian = image + tf.random.stateless_normal(
        tf.shape(image), key, stddev=_uniform(seed, 0.02, 0.08, 2)
    )
    draw = tf.random.stateless_uniform(tf.shape(image)[:2], key)[..., None]
    share = _uniform(seed, 0.01, 0.04, 3)
    salted = tf.where(draw < share / 2, 0.0, tf.where(draw > 1 - share / 2, 1.0, image))
    return tf.cond(_uniform(seed, 0.0, 1.0, 4) < 0.5, lambda: gaussian, lambda: salted)


def colour(image, seed):
    image = image + _uniform(seed, -0.25, 0.25, 0)
    mean = tf.reduce_mean(image)
    image = mean + (image - mean) * _uniform(seed, 0.6, 1.4, 1)
    if image.shape[-1] == 3:
        image = tf.clip_by_value(image, 0.0, 1.0)
        image = tf.image.adjust_saturation(image, _uniform(seed, 0.6, 1.4, 2))
        image = tf.image.adjust_hue(image, _uniform(seed, -0.08, 0.08, 3))
    return image


def greyscale(image, seed):
    del seed
    if image.shape[-1] != 3:
        return image
    return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def border(image, seed):
    size = tf.shape(image)[:2]
    share = _uniform(seed, 0.04, 0.15, 0)
    pad = tf.maximum(1, tf.cast(tf.cast(size, tf.float32) * share, tf.int32))
    fill = _uniform(seed, 0.0, 1.0, 1)
    padded = tf.pad(image - fill, [[pad[0], pad[0]], [pad[1], pad[1]], [0, 0]]) + fill
    return _resize(padded, size)


def overlay(image, seed):
    size = tf.shape(image)[:2]
    fsize = tf.cast(size, tf.float32)
    area = _uniform(seed, 0.04, 0.16, 0)
    ratio = tf.exp(_uniform(seed, -0.7, 0.7, 1))
    height = tf.clip_by_value(tf.sqrt(area * ratio), 0.05, 0.9)
    width = tf.clip_by_value(area / height, 0.05, 0.9)
    top = _uniform(seed, 0.0, 1.0, 2) * (1.0 - height)
    left = _uniform(seed, 0.0, 1.0, 3) * (1.0 - width)
    rows = (tf.range(size[0], dtype=tf.float32) + 0.5) / fsize[0]
    cols = (tf.range(size[1], dtype=tf.float32) + 0.5) / fsize[1]
    inside = ((rows >= top) & (rows < top + height))[:, None] & (
        (cols >= left) & (cols < left + width)
    )[None, :]
    fill = tf.stack([_uniform(seed, 0.0, 1.0, 4 + c) for c in range(3)])
    fill = fill[: image.shape[-1]] if image.shape[-1] is not None else fill
    return tf.where(inside[..., None], fill, image)


_FUNCTIONS = {
    "crop": crop,
    "aspect": aspect,
    "rotation": rotation,
    "flip": flip,
    "rescale": rescale,
    "jpeg": jpeg,
    "blur": blur,
    "noise": noise,
    "colour": colour,
    "greyscale": greyscale,
    "border": border,
    "overlay": overlay,
}


def alter(
    image: tf.Tensor,
    seed: tf.Tensor,
    families: Sequence[str] = FAMILIES,
    mixture: tuple[int, int] = MIXTURE,
) -> tf.Tensor:
    """One copy of `image`, altered by two to four of `families`.

    Example:

    >>> picture = tf.random.uniform((32, 32, 3))
    >>> copy = alter(picture, tf.constant([0, 7]))
    >>> copy.shape, copy.dtype
    (TensorShape([32, 32, 3]), tf.float32)

    Args:
        image: a float picture `(H, W, C)` in `[0, 1]`, `C` 1 or 3.
        seed: a stateless seed, int32 or int64 `(2,)`: the same seed gives
            the same copy.
        families: the families drawn from (`FAMILIES` names).
        mixture: how many families a copy goes through, at least and at
            most (fewer when `families` has fewer).

    Returns:
        The altered picture, float32 `(H, W, C)` in `[0, 1]`.
    """
    families = check_families(families)
    low, high = mixture
    high = min(high, len(families))
    low = min(low, high)
    seed = tf.cast(seed, tf.int64)
    key = tf.stack([seed[0], seed[1] * 7919 + 1])
    # A random order of the families; the first `count` of them are applied,
    # in the table's order.
    order = tf.argsort(tf.random.stateless_uniform([len(families)], key))
    count = tf.random.stateless_uniform(
        [], tf.stack([key[0], key[1] + 1]), low, high + 1, dtype=tf.int64
    )
    chosen = tf.scatter_nd(
        order[:, None], tf.range(len(families), dtype=tf.int64) < count, [len(families)]
    )
    image = tf.convert_to_tensor(image, tf.float32)
    for i, name in enumerate(families):
        step = tf.stack([seed[0] + 104729 * (i + 1), seed[1]])
        function = _FUNCTIONS[name]
        image = tf.cond(
            chosen[i],
            lambda f=function, x=image, s=step: f(x, s),
            lambda x=image: x,
        )
        image = tf.clip_by_value(image, 0.0, 1.0)
    return image


def alter_batch(
    pictures: np.ndarray,
    seed: int = 0,
    families: Sequence[str] = FAMILIES,
    mixture: tuple[int, int] = MIXTURE,
) -> np.ndarray:
    """Altered copies of uint8 pictures `(n, H, W[, C])`, one each, as uint8.

    Picture `i` is altered with the seed `(seed, i)`: the same `seed`
    gives the same copies.
    """
    pictures = check_pictures("pictures", pictures)
    seed = check_int("seed", seed, minimum=0)
    run = _batch_function(check_families(families), tuple(mixture))
    grey = pictures.ndim == 3
    images = pictures[..., None] if grey else pictures
    parts = [
        # Tensors, not Python ints: a new int would trace the function again.
        run(
            tf.constant(images[start : start + 1024]),
            tf.constant(seed, tf.int64),
            tf.constant(start, tf.int64),
        ).numpy()
        for start in range(0, len(images), 1024)
    ]
    out = np.concatenate(parts) if parts else np.zeros(images.shape, np.float32)
    altered = np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)
    return altered[..., 0] if grey else altered


@functools.lru_cache(maxsize=16)
def _batch_function(families: tuple[str, ...], mixture: tuple[int, int]):
    """`alter` over a batch, traced once per families, mixture and shape."""

    # The alterations branch by `tf.cond` alone, so AutoGraph's rewrite is
    # not needed: without it the first call (what `index build` pays to
    # choose a folder's copy rules) traces in about half the time, the
    # copies unchanged.
    @tf.function(reduce_retracing=True, autograph=False)
    def run(images, seed, start):
        n = tf.shape(images, out_type=tf.int64)[0]
        seeds = tf.stack(
            [
                tf.fill([n], tf.cast(seed, tf.int64)),
                tf.cast(start, tf.int64) + tf.range(n),
            ],
            axis=1,
        )
        return tf.map_fn(
            lambda pair: alter(
                tf.cast(pair[0], tf.float32) / 255.0, pair[1], families, mixture
            ),
            (images, seeds),
            fn_output_signature=tf.float32,
        )

    return run
