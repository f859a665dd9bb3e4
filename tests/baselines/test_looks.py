"""Tests for subic_keras.baselines.looks: the look, a peer of the instance code."""

import numpy as np
import pytest

from subic_keras.baselines import looks


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _pictures(rng, n, side=32):
    return rng.integers(0, 256, (n, side, side, 3), np.uint8)


def _smooth(rng, n, side=32):
    """Pictures with shapes larger than a pixel, as photographs have."""
    from PIL import Image

    coarse = rng.integers(0, 256, (n, 6, 6, 3), np.uint8)
    bicubic = Image.Resampling.BICUBIC
    return np.stack(
        [np.asarray(Image.fromarray(c).resize((side, side), bicubic)) for c in coarse]
    )


def test_a_look_is_the_centre_and_bounded(rng):
    pictures = _pictures(rng, 5)
    these = looks.look(pictures)
    assert these.shape == (5, looks.LOOK_SIZE) and these.dtype == np.int8
    assert np.abs(these).max() == 127
    grey = looks.look(pictures[..., 0])
    assert np.array_equal(grey, looks.look(np.repeat(pictures[..., :1], 3, -1)))
    assert np.allclose(np.diag(looks.similarity(these, these)), 1.0, atol=1e-6)
    # Only the centre counts: a new border leaves the look as it was.
    framed = pictures.copy()
    framed[:, :4], framed[:, -4:], framed[:, :, :4], framed[:, :, -4:] = 0, 9, 50, 7
    likeness = np.diag(looks.similarity(these, looks.look(framed)))
    assert np.allclose(likeness, 1, atol=1e-3)
    # Any size: a picture and its double-size copy look alike.
    double = pictures.repeat(2, axis=1).repeat(2, axis=2)
    likeness = np.diag(looks.similarity(these, looks.look(double)))
    assert np.allclose(likeness, 1, atol=1e-3)
    # A large picture is read a block of rows at a time: no float copy of it.
    import tracemalloc

    large = np.repeat(pictures[:1], 100, axis=1).repeat(60, axis=2)  # 3200 x 1920
    tracemalloc.start()
    try:
        views = looks.query_look(large)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 * 2**20, peak  # the picture as float32 alone: 70 MB
    assert np.diag(looks.similarity(views, these[:1]))[0] > 0.99
    flat = looks.look(np.full((1, 8, 8, 3), 100, np.uint8))  # no variation at all
    assert not flat.any()
    with pytest.raises(ValueError, match=r"pictures must be uint8.*float32"):
        looks.look(pictures.astype(np.float32))
    with pytest.raises(ValueError, match=r"received uint8 \(5, 32, 32, 2\)"):
        looks.look(pictures[..., :2])
    with pytest.raises(ValueError, match=r"received uint8 \(1, 0, 4, 3\)"):
        looks.query_look(np.zeros((1, 0, 4, 3), np.uint8))


def test_a_query_is_seen_as_a_crop_or_a_mirror_image_of_its_original(rng):
    from PIL import Image

    pictures = _smooth(rng, 40)
    items = looks.look(pictures)
    views = looks.query_look(pictures)
    assert views.shape == (40, looks.VIEWS, looks.LOOK_SIZE) and views.dtype == np.int8
    # The first view is the item's own look; the mirrored picture's views
    # hold it too.
    assert np.array_equal(views[:, 0], items)
    mirrored = looks.similarity(looks.query_look(pictures[:, :, ::-1]), items)
    assert np.allclose(np.diag(mirrored), 1, atol=1e-3)
    # Crops keeping 64-90 % of the area, resized back: the original is the
    # most alike picture, found by a view and not by the query's own look.
    crops = []
    for i, picture in enumerate(pictures):
        side = round(32 * np.sqrt(0.64 + 0.26 * i / 39))
        top, left = rng.integers(0, 33 - side, 2)
        crop = Image.fromarray(picture).crop((left, top, left + side, top + side))
        crops.append(np.asarray(crop.resize((32, 32), Image.Resampling.BILINEAR)))
    crop_views = looks.query_look(np.stack(crops))
    by_views = looks.similarity(crop_views, items)
    by_own_look = looks.similarity(crop_views[:, 0], items)
    assert (by_views.argmax(axis=1) == np.arange(40)).all()
    assert np.diag(by_views).min() > 0.9
    assert (np.diag(by_views) > np.diag(by_own_look)).mean() > 0.9
