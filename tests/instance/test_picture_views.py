"""`picture_views`: crops of a picture as views of it, answers by picture."""

import numpy as np
import pytest

from subic_keras.instance.picture_views import (
    ViewIndex,
    by_picture,
    choose_gate,
    crop_boxes,
    encode_views,
    gated,
    picture_views,
)


def test_crop_boxes_are_the_picture_its_centre_and_its_corners():
    boxes = crop_boxes(0.8)
    assert boxes.shape == (6, 4) and boxes.dtype == np.float32
    np.testing.assert_allclose(boxes[0], [0, 0, 1, 1])
    np.testing.assert_allclose(boxes[1], [0.1, 0.1, 0.9, 0.9])
    np.testing.assert_allclose(boxes[2:, 2] - boxes[2:, 0], 0.8, atol=1e-6)
    corners = {tuple(np.round(box[:2].astype(float), 6)) for box in boxes[2:]}
    assert corners == {(0, 0), (0, 0.2), (0.2, 0), (0.2, 0.2)}
    assert crop_boxes(0.5, corners=False).shape == (2, 4)
    for side in (0, 1, 1.5):
        wanted = f"side must be in \\(0, 1\\), received {side}"
        with pytest.raises(ValueError, match=wanted):
            crop_boxes(side)


def test_views_are_the_parts_of_the_picture_resized_back():
    # A ramp along the width: each view is a ramp over the part it keeps.
    ramp = np.tile(np.arange(32, dtype=np.uint8) * 8, (32, 1))
    pictures = np.stack([ramp, 255 - ramp])
    views = picture_views(pictures, crop_boxes(0.8))
    assert views.shape == (12, 32, 32) and views.dtype == np.uint8
    np.testing.assert_array_equal(views[0], pictures[0])
    np.testing.assert_array_equal(views[6], pictures[1])
    # Corner (top 0.2, left 0.2): columns 0.2 * 31 to 31 of the ramp.
    columns = np.linspace(0.2 * 31, 31, 32) * 8
    corners = [tuple(np.round(b[:2].astype(float), 6)) for b in crop_boxes()]
    right = views[corners.index((0.2, 0.2))]
    np.testing.assert_allclose(right[5], columns, atol=0.51)
    colour = np.repeat(pictures[..., None], 3, -1)
    assert picture_views(colour, crop_boxes(0.8, False)).shape == (4, 32, 32, 3)
    wanted = r"boxes must have shape \(V, 4\), received \(4,\)"
    with pytest.raises(ValueError, match=wanted):
        picture_views(pictures, np.zeros(4))


def test_answers_keep_each_picture_once_by_its_best_view():
    values = np.array([[1.0, 9.0, 8.0, 7.0, 3.0], [2.0, 2.0, 1.0, 0.0, 5.0]])
    pictures = np.array([[4, 2, 2, 4, -1], [3, 3, -1, -1, -1]])
    best, found = by_picture(values, pictures, 3)
    np.testing.assert_array_equal(found, [[2, 4, -1], [3, -1, -1]])
    np.testing.assert_array_equal(best, [[9.0, 7.0, -np.inf], [2.0, -np.inf, -np.inf]])
    with pytest.raises(ValueError, match=r"received \(2, 5\) and \(5,\)"):
        by_picture(values, pictures[0], 3)
    with pytest.raises(ValueError, match="k must be >= 1, received 0"):
        by_picture(values, pictures, 0)


def test_a_corner_crop_finds_its_picture_in_a_view_index():
    """Each picture's views indexed (`encode_views`, `ViewIndex`): an exact
    corner crop of one is found first as that picture, each picture once;
    the gate chosen on copies of its pictures is one of those tried."""
    from subic_keras.instance import alterations
    from subic_keras.instance.instance_code import pretrained

    code = pretrained()
    code.show_progress = False
    rng = np.random.default_rng(3)
    smooth = rng.integers(0, 256, (40, 8, 8, 3)).astype(np.uint8)
    pictures = np.repeat(np.repeat(smooth, 4, 1), 4, 2)
    codes = encode_views(code, pictures)
    assert codes.shape == (40, 6, code.num_blocks)
    np.testing.assert_array_equal(codes[:, 0], code.encode(pictures))
    index = ViewIndex(code.num_blocks, code.block_size)
    np.testing.assert_array_equal(index.add(codes[:30]), np.arange(30))
    index.add(codes[30:])
    assert len(index) == 40
    queries = code.query(picture_views(pictures[[7, 21, 36]], crop_boxes()[[5]]))
    margins, found = index.search(queries, 5)
    np.testing.assert_array_equal(found[:, 0], [7, 21, 36])
    assert all(len(set(row)) == 5 for row in found)
    assert np.all(np.diff(margins, axis=1) <= 0)
    copies = code.query(alterations.alter_batch(pictures, seed=2))
    gate = index.choose_gate(copies, np.arange(40), gates=(0, 50, 100))
    assert gate in (0, 50, 100) and index.gate == gate
    assert max(index.gates_tried.values()) == index.gates_tried[gate]
    with pytest.raises(ValueError, match=r"codes must have 6 views .* received 2"):
        index.add(codes[:, :2])
    with pytest.raises(
        ValueError, match=r"shape \(n, V >= 2, 64\), received \(40, 64\)"
    ):
        index.add(codes[:, 0])
    with pytest.raises(
        ValueError, match=r"one id per copy, shape \(40,\), received \(3,\)"
    ):
        index.choose_gate(copies, np.arange(3))
    with pytest.raises(
        ValueError, match=r"gate must be a finite number >= 0, received -2\.0"
    ):
        ViewIndex(code.num_blocks, code.block_size, gate=-2)
    with pytest.raises(ValueError, match="holds no picture to search"):
        ViewIndex(code.num_blocks, code.block_size).search(queries, 5)


def test_a_gate_keeps_crops_from_outranking_pictures_by_less_than_it():
    own = (np.array([[-30.0, -50.0], [-5.0, -6.0]]), np.array([[4, 9], [2, 3]]))
    crops = (np.array([[-10.0, -12.0], [-3.0, -70.0]]), np.array([[9, 9], [8, 2]]))
    _, open_gate = gated(own, crops, 0.0, 3)
    np.testing.assert_array_equal(open_gate, [[9, 4, -1], [8, 2, 3]])
    values, shut = gated(own, crops, 1000.0, 3)
    np.testing.assert_array_equal(shut, [[4, 9, -1], [2, 3, 8]])
    np.testing.assert_array_equal(values[0, :2], [-30.0, -50.0])
    gate, tried = choose_gate(own, crops, np.array([9, 2]), gates=(0, 10, 15, 30))
    # 10 and 15 both find both originals: the larger, crops winning least.
    assert (gate, tried) == (15, {0: 0.5, 10: 1.0, 15: 1.0, 30: 0.5})
    with pytest.raises(
        ValueError, match=r"gate must be a finite number >= 0, received -1\.0"
    ):
        gated(own, crops, -1, 3)
