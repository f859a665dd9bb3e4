"""Near-duplicate queries: pictures of a database, altered as copies are.

The earlier copy benchmark's task, kept as one set of queries of
`benchmarks/near_duplicates.py`: every picture of a set is in the
database, and each query is one of them cropped, recompressed, brightened
or mirrored; a search finds the original, or not (recall@1, recall@10).
It measures what class codes alone cannot: SuBiC's codes are trained for classes
(paper Sec. 3), so a copy's code is shared with hundreds of pictures of its
class and the original is one of a tie group.
"""

from __future__ import annotations

import io

import numpy as np

from subic_keras._validation import check_int, check_pictures

# Each alteration, as a person copying a picture applies it.
ALTERATIONS = ("crop", "jpeg", "brightness", "flip")
# A crop keeps this share of the area (its aspect ratio kept), resized back.
CROP_AREA = (0.6, 0.9)
JPEG_QUALITY = (30, 70)
BRIGHTNESS = 0.2  # pixel values scaled by a factor in [1 - b, 1 + b]


def alter(pictures: np.ndarray, seed: int = 0) -> tuple[np.ndarray, list[tuple]]:
    """Alters each picture by a random mix of `ALTERATIONS`.

    Each alteration is applied with probability 1/2 (at least one per
    picture), in the order crop, brightness, flip, JPEG: a random crop
    keeping 60–90 % of the area resized back (bilinear), a brightness
    factor in [0.8, 1.2], a horizontal flip, and JPEG at quality 30–70.

    Example:

    >>> altered, applied = alter(np.zeros((2, 32, 32, 3), np.uint8), seed=0)
    >>> altered.shape, applied[0]
    ((2, 32, 32, 3), ('jpeg', 'brightness', 'flip'))

    Args:
        pictures: uint8 `(n, H, W, 3)` or `(n, H, W)`.
        seed: the seed of every random choice.

    Returns:
        `(altered, applied)`: uint8 pictures of the same shape, and each
        picture's alterations, in `ALTERATIONS` names.

    Raises:
        ValueError: for pictures that are not uint8 `(n, H, W[, 3])`.
    """
    from PIL import Image

    pictures = check_pictures("pictures", pictures)
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    altered = np.empty_like(pictures)
    applied = []
    height, width = pictures.shape[1:3]
    for i, picture in enumerate(pictures):
        chosen = rng.random(len(ALTERATIONS)) < 0.5
        if not chosen.any():
            chosen[rng.integers(len(ALTERATIONS))] = True
        names = tuple(n for n, c in zip(ALTERATIONS, chosen) if c)
        image = Image.fromarray(picture)
        if "crop" in names:
            side = np.sqrt(rng.uniform(*CROP_AREA))
            h, w = max(1, round(height * side)), max(1, round(width * side))
            top, left = rng.integers(height - h + 1), rng.integers(width - w + 1)
            image = image.crop((left, top, left + w, top + h)).resize(
                (width, height), Image.Resampling.BILINEAR
            )
        if "brightness" in names:
            factor = rng.uniform(1 - BRIGHTNESS, 1 + BRIGHTNESS)
            scaled = np.asarray(image, np.float32) * factor
            image = Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))
        if "flip" in names:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if "jpeg" in names:
            buffer = io.BytesIO()
            quality = int(rng.integers(JPEG_QUALITY[0], JPEG_QUALITY[1] + 1))
            image.save(buffer, "JPEG", quality=quality)
            buffer.seek(0)
            image = Image.open(buffer)
            image.load()
        altered[i] = np.asarray(image)
        applied.append(names)
    return altered, applied


def recall_at(ranked_ids: np.ndarray, originals: np.ndarray, ks=(1, 10)) -> dict:
    """Share of queries whose original is among their first `k` results.

    Args:
        ranked_ids: `(nq, >= max(ks))` result ids, best first.
        originals: `(nq,)` the id of each query's original.

    Returns:
        `{"recall@1": ..., "recall@10": ...}` for each `k` of `ks`.
    """
    ranked_ids = np.asarray(ranked_ids)
    originals = np.asarray(originals)
    if ranked_ids.ndim != 2 or originals.shape != (len(ranked_ids),):
        raise ValueError(
            f"ranked_ids must be (nq, k) and originals (nq,), received "
            f"{ranked_ids.shape} and {originals.shape}"
        )
    hits = ranked_ids == originals[:, None]
    return {f"recall@{k}": float(hits[:, :k].any(axis=1).mean()) for k in ks}
