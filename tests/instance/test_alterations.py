"""`subic_keras.instance.alterations`: the family of alterations copies go through."""

import numpy as np
import pytest

from subic_keras.instance import alterations


@pytest.fixture(scope="module")
def pictures():
    rng = np.random.default_rng(0)
    smooth = rng.integers(0, 256, (6, 8, 8, 3)).repeat(4, 1).repeat(4, 2)
    return smooth.astype(np.uint8)  # 32 x 32, blocks of 4 x 4


def test_each_family_alters_a_picture_and_keeps_its_form(pictures):
    import tensorflow as tf

    for name in alterations.FAMILIES:
        function = getattr(alterations, name)
        changed = []
        for i, picture in enumerate(pictures[:3]):
            image = tf.constant(picture / 255.0, tf.float32)
            copy = function(image, tf.constant([7, i], tf.int64)).numpy()
            assert copy.shape == picture.shape and copy.dtype == np.float32, name
            changed.append(np.abs(copy - image.numpy()).mean())
        assert np.mean(np.array(changed) > 0.002) >= 2 / 3, (name, changed)


def test_copies_are_reproducible_and_differ_by_seed(pictures):
    once = alterations.alter_batch(pictures, 3)
    np.testing.assert_array_equal(once, alterations.alter_batch(pictures, 3))
    assert not np.array_equal(once, alterations.alter_batch(pictures, 4))
    # Grey pictures stay grey, in their own shape.
    grey = alterations.alter_batch(pictures[..., 0], 3)
    assert grey.shape == pictures.shape[:3]


def test_held_out_families_and_mistakes_are_named():
    assert "rotation" not in alterations.without("rotation")
    assert set(alterations.without("crop")).isdisjoint({"crop", "aspect", "border"})
    with pytest.raises(ValueError, match="held_out must be one of"):
        alterations.without("blur")
    with pytest.raises(ValueError, match="families must be distinct names"):
        alterations.check_families(["crop", "swirl"])
    with pytest.raises(TypeError, match="one string"):
        alterations.check_families("crop")
    with pytest.raises(ValueError, match="pictures must be uint8"):
        alterations.alter_batch(np.zeros((2, 8, 8, 3), np.float32))
