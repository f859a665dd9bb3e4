"""The look: a hand-made descriptor of a picture, the peer of the instance code.

Earlier versions of this package ordered the tie groups of a class code's
best results by a *look* and lifted the near copies of the query above
them; the instance code (`subic_keras.instance.instance_code`, the paper's instance
retrieval, Sec. 4) replaced it. It stays here as a baseline, beside the
perceptual hashes, in the copy-detection benchmark
(`benchmarks/near_duplicates.py`).

A look is what the centre of a picture looks like: the picture is
box-averaged to `WORK_SIDE x WORK_SIDE` and blurred (so that every size
reads alike and a pixel's shift moves little), and its centre, `CENTRE` of
each side, is averaged to `LOOK_SIDE x LOOK_SIDE` in colour, centred and
scaled to int8: `LOOK_SIZE` = 108 bytes per picture (`look`). The centre,
because a copy cropped to 64 % of the area or more still holds it whole.
A query is looked at in `VIEWS` = 38 ways (`query_look`): as itself and as
each of 18 crops of its original (sides 0.9 and 0.8 of it, 3 x 3 offsets),
each mirrored and not, each read where the original's centre would lie;
its similarity to a picture is the cosine of the most alike view
(`similarity`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

LOOK_SIDE = 6
LOOK_SIZE = LOOK_SIDE * LOOK_SIDE * 3
# Pictures are first box-averaged to WORK_SIDE x WORK_SIDE and blurred
# (Gaussian, BLUR pixels there), so that a look is read alike from a
# picture of any size and a pixel's shift moves it little.
WORK_SIDE = 32
BLUR = 1.0
# A look is of the centre, CENTRE of each side: a crop keeping at least
# 64 % of the area (each side at least SCALES[-1]) holds it whole.
CENTRE = 0.6
# A query is looked at as a crop of its original of each side SCALES (1:
# not cropped) at SHIFTS x SHIFTS offsets, mirrored and not: VIEWS looks.
SCALES = (1.0, 0.9, 0.8)
SHIFTS = 3
_BLOCK = 1 << 22  # picture values converted to float at a time
_PICTURES = 1024  # pictures whose looks are computed at a time


def _box(length: int, start: float, stop: float, bins: int) -> np.ndarray:
    """The `(bins, length)` weights that average `[start, stop)` of an axis
    of `length` pixels (pixel `p` covers `[p, p + 1)`) into `bins` equal
    parts, each the covered share of a pixel over the part's width."""
    edges = np.linspace(start, stop, bins + 1)
    pixels = np.arange(length)
    low = np.maximum(edges[:-1, None], pixels[None])
    high = np.minimum(edges[1:, None], pixels[None] + 1)
    return np.maximum(high - low, 0) / ((stop - start) / bins)


def _blur(length: int, sigma: float) -> np.ndarray:
    """A Gaussian blur along an axis as a `(length, length)` matrix, each
    row's weights summing to 1 (so that the edges keep their level)."""
    pixels = np.arange(length)
    weights = np.exp(-0.5 * ((pixels[:, None] - pixels[None]) / sigma) ** 2)
    return weights / weights.sum(axis=1, keepdims=True)


def _windows() -> np.ndarray:
    """Where the original's centre lies in a query, for each crop the
    query may be (`SCALES`, `SHIFTS`): `(windows, 2, 2)` of
    `[[x0, x1], [y0, y1]]`, in fractions of the query's sides. A query that
    is the part `[t, t + s]` of its original along an axis shows the
    original's `u` at `(u - t) / s`."""
    low = (1 - CENTRE) / 2
    out = []
    for scale in SCALES:
        offsets = np.linspace(0, 1 - scale, SHIFTS) if scale < 1 else [0.0]
        for tx, ty in itertools.product(offsets, offsets):
            out.append(
                [[(low - t) / scale, (low + CENTRE - t) / scale] for t in (tx, ty)]
            )
    return np.clip(np.array(out), 0, 1)


VIEWS = 2 * len(_windows())


def _checked(pictures) -> np.ndarray:
    """uint8 pictures as `(n, H, W, C)`, C 1 or 3, or a ValueError."""
    pictures = np.asarray(pictures)
    if pictures.ndim == 3:
        pictures = pictures[..., None]
    if (
        pictures.dtype != np.uint8
        or pictures.ndim != 4
        or pictures.shape[-1] not in (1, 3)
        or 0 in pictures.shape[1:3]
    ):
        raise ValueError(
            "pictures must be uint8 (n, H, W), (n, H, W, 1) or (n, H, W, 3), "
            f"received {pictures.dtype} {pictures.shape}"
        )
    return pictures


def _read(
    pictures, read: Callable[[np.ndarray], np.ndarray], shape: tuple
) -> np.ndarray:
    """`read` of each picture's `_work`, int8 `(n, *shape)`: `_PICTURES`
    pictures at a time, so that the floats stay bounded however many."""
    pictures = _checked(pictures)
    out = np.empty((len(pictures), *shape), np.int8)
    for start in range(0, len(pictures), _PICTURES):
        part = pictures[start : start + _PICTURES]
        out[start : start + _PICTURES] = read(_work(part))
    return out


def _work(pictures: np.ndarray) -> np.ndarray:
    """Checked pictures, box-averaged to `WORK_SIDE` and blurred: float32
    `(n, WORK_SIDE, WORK_SIDE, 3)`."""
    n, height, width, channels = pictures.shape
    blur = _blur(WORK_SIDE, BLUR)
    rows = (blur @ _box(height, 0, height, WORK_SIDE)).astype(np.float32)
    columns = (blur @ _box(width, 0, width, WORK_SIDE)).astype(np.float32)
    # Pictures, and rows of a picture, a block at a time: the float copies
    # stay within _BLOCK values whatever the pictures' size.
    line = width * channels
    per_block = max(1, _BLOCK // (max(height, WORK_SIDE) * line))
    lines = max(1, _BLOCK // line)
    work = np.empty((n, WORK_SIDE, WORK_SIDE, 3), np.float32)
    for start in range(0, n, per_block):
        part = pictures[start : start + per_block]
        reduced = np.zeros((len(part), WORK_SIDE, line), np.float32)
        for top in range(0, height, lines):
            block = part[:, top : top + lines].astype(np.float32)
            reduced += rows[:, top : top + lines] @ block.reshape(len(part), -1, line)
        shaped = reduced.reshape(len(part), WORK_SIDE, width, channels)
        work[start : start + per_block] = columns @ shaped
    return work


def _as_int8(views: np.ndarray) -> np.ndarray:
    """Views `(..., side, side, 3)` flattened, centred and scaled to int8
    (cosines are kept: the largest magnitude of each becomes 127)."""
    flat = views.reshape(*views.shape[:-3], -1)
    flat = flat - flat.mean(axis=-1, keepdims=True)
    largest = np.abs(flat).max(axis=-1, keepdims=True)
    return np.rint(flat * (127 / np.maximum(largest, 1e-6))).astype(np.int8)


def look(pictures) -> np.ndarray:
    """The looks of uint8 pictures: int8 `(n, LOOK_SIZE)`.

    A look is the picture's centre (`CENTRE` of each side), box-averaged to
    `LOOK_SIDE x LOOK_SIDE` in colour from the picture at `WORK_SIDE`
    blurred, centred and scaled to int8.

    Example:

    >>> pictures = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    >>> looks = look(pictures)
    >>> looks.shape, looks.dtype.name
    ((2, 108), 'int8')
    >>> round(float(similarity(query_look(pictures[:1]), looks)[0, 0]), 4)
    1.0

    Args:
        pictures: uint8 `(n, H, W)`, `(n, H, W, 1)` or `(n, H, W, 3)`.

    Raises:
        ValueError: for another dtype or shape.
    """
    low = (1 - CENTRE) / 2
    side = _box(WORK_SIDE, low * WORK_SIDE, (low + CENTRE) * WORK_SIDE, LOOK_SIDE)
    side = side.astype(np.float32)

    def centre(work: np.ndarray) -> np.ndarray:
        return _as_int8(np.einsum("iy,nyxc,jx->nijc", side, work, side, optimize=True))

    return _read(pictures, centre, (LOOK_SIZE,))


def query_look(pictures) -> np.ndarray:
    """The looks of query pictures: int8 `(n, VIEWS, LOOK_SIZE)`, one for
    each crop of its original a query may be (`SCALES` x `SHIFTS`
    offsets), mirrored and not: where the original's centre would lie in
    it, read as `look` reads a picture. A query's similarity to a picture
    is that of its most alike view (`similarity`), so that a crop keeping 64 %
    of a picture's area, or its mirror image, looks like it.

    Example:

    >>> pictures = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    >>> query_look(pictures).shape == (2, VIEWS, LOOK_SIZE)
    True
    >>> bool(np.allclose(similarity(query_look(pictures[:, :, ::-1]), look(pictures)),
    ...                  similarity(query_look(pictures), look(pictures)), atol=1e-3))
    True

    Args:
        pictures: uint8 `(n, H, W)`, `(n, H, W, 1)` or `(n, H, W, 3)`.

    Raises:
        ValueError: for another dtype or shape.
    """
    windows = _windows() * WORK_SIDE
    rows = np.stack([_box(WORK_SIDE, w[1, 0], w[1, 1], LOOK_SIDE) for w in windows])
    columns = np.stack([_box(WORK_SIDE, w[0, 0], w[0, 1], LOOK_SIDE) for w in windows])
    rows, columns = rows.astype(np.float32), columns.astype(np.float32)

    def views(work: np.ndarray) -> np.ndarray:
        both = [
            np.einsum("viy,nyxc,vjx->nvijc", rows, picture, columns, optimize=True)
            for picture in (work, work[:, :, ::-1])
        ]
        return _as_int8(np.concatenate(both, axis=1))

    return _read(pictures, views, (VIEWS, LOOK_SIZE))


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarities of looks `a (na, d)` (or of query views
    `(na, v, d)`: each one's most alike view) and `b (nb, d)`: `(na, nb)`."""
    a = np.asarray(a, np.float32)
    a = a[:, None] if a.ndim == 2 else a
    b = np.asarray(b, np.float32)
    norms = np.linalg.norm(a, axis=2)[:, :, None] * np.linalg.norm(b, axis=1)
    return (np.einsum("avd,bd->avb", a, b) / np.maximum(norms, 1e-6)).max(axis=1)
