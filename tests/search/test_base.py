"""The picture interface: what the server and the command line ask of an
index of pictures, whichever kind it is."""

import numpy as np
import pytest

from subic_keras.search import ImageIndex, RayIndex, SubicIndex
from subic_keras.search.base import PictureIndex, Searcher
from subic_keras.search.order import best_first, best_order


def test_both_picture_indexes_are_one_interface(tmp_path):
    assert issubclass(ImageIndex, PictureIndex)
    assert issubclass(RayIndex, PictureIndex)
    assert not issubclass(SubicIndex, PictureIndex)
    index = ImageIndex(2, 4, root=tmp_path)
    index.add([[0, 1]], ["a/one.png"])
    assert isinstance(index, PictureIndex) and isinstance(index, Searcher)
    assert index.holds_pictures and index.root == str(tmp_path)
    assert index.paths([0]) == ["a/one.png"] and index.folders() == ["a"]
    assert index.unavailable == {}  # one file: nothing to be unreachable


def test_a_picture_index_must_say_where_its_pictures_are():
    class Partial(PictureIndex):
        num_blocks = block_size = 2

        def __len__(self):
            return 0

        def _search(self, queries, k, where):
            raise AssertionError

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_every_merge_orders_as_one_scan():
    scores = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0]])
    positions = np.array([[4, 9, 2, 0, 7]])
    np.testing.assert_array_equal(best_order(scores, positions), [[2, 1, 4, 0, 3]])
    np.testing.assert_array_equal(best_order(scores, positions, 2), [[2, 1]])
    top, where = best_first(scores, positions, 3)
    np.testing.assert_array_equal(top, [[3.0, 3.0, 2.0]])
    np.testing.assert_array_equal(where, [[2, 9, 7]])
