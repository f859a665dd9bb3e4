"""Tests for subic_keras.instance.near_duplicates: altered copies and their recall."""

import numpy as np
import pytest

from subic_keras.instance import near_duplicates


def test_alterations_are_seeded_mixed_and_keep_the_shape():
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 256, (200, 32, 32, 3), np.uint8)
    altered, applied = near_duplicates.alter(pictures, seed=3)
    again, applied_again = near_duplicates.alter(pictures, seed=3)
    assert altered.shape == pictures.shape and altered.dtype == np.uint8
    np.testing.assert_array_equal(altered, again)
    assert applied == applied_again and all(applied)
    for name in near_duplicates.ALTERATIONS:  # each about half of the time
        assert 60 < sum(name in a for a in applied) < 140
    flipped_only = [i for i, a in enumerate(applied) if a == ("flip",)]
    assert flipped_only
    i = flipped_only[0]
    np.testing.assert_array_equal(altered[i], pictures[i][:, ::-1])
    grey, _ = near_duplicates.alter(pictures[:3, ..., 0], seed=1)
    assert grey.shape == (3, 32, 32)
    with pytest.raises(ValueError, match=r"uint8 .*received float32"):
        near_duplicates.alter(pictures.astype(np.float32))


def test_recall_at():
    ranked = np.array([[5, 1, 2], [3, 4, 0], [7, 8, 9]])
    recall = near_duplicates.recall_at(ranked, np.array([5, 0, 1]), ks=(1, 3))
    assert recall == {
        "recall@1": pytest.approx(1 / 3),
        "recall@3": pytest.approx(2 / 3),
    }
    with pytest.raises(ValueError, match=r"received \(3, 3\) and \(2,\)"):
        near_duplicates.recall_at(ranked, np.array([1, 2]))
