"""`subic_keras.search.checks`: the input checks every backend shares."""

import numpy as np
import pytest

from subic_keras.search import checks


def test_check_codes_accepts_integer_codes_and_block_vectors():
    codes = checks.check_codes("codes", [[3, 0]], num_blocks=2, block_size=4)
    assert codes.dtype == np.uint8 and codes.tolist() == [[3, 0]]
    vectors = [[0.0, 0.0, 0.0, 1.0, 5.0, 5.0, 0.0, 0.0]]  # tie: lowest index
    assert checks.check_codes("codes", vectors, 2, 4).tolist() == [[3, 0]]
    wide = checks.check_codes("codes", [[1000, 3]], num_blocks=2, block_size=1024)
    assert wide.dtype == np.uint16


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        ([[4, 0]], r"values in \[0, block_size\) = \[0, 4\), received .*\[0, 4\]"),
        ([[0, 1, 2]], "width num_blocks = 2"),
        ([[0.0, 1.0]], "must be integer codes, received dtype float64"),
        ([0, 1], "must be a 2-D array, received shape \\(2,\\)"),
        ([[np.nan] * 8], "NaN or infinite"),
    ],
)
def test_check_codes_names_what_was_received(codes, message):
    with pytest.raises(ValueError, match=message):
        checks.check_codes("codes", codes, num_blocks=2, block_size=4)


def test_check_queries_and_ids():
    queries = checks.check_queries("queries", np.ones((2, 8)), 2, 4)
    assert queries.dtype == np.float32 and queries.flags.c_contiguous
    with pytest.raises(ValueError, match="2 \\* 4 = 8, received shape \\(2, 7\\)"):
        checks.check_queries("queries", np.ones((2, 7)), 2, 4)
    with pytest.raises(ValueError, match="within float32's range"):
        checks.check_queries("queries", np.full((1, 8), 1e39), 2, 4)  # finite, huge
    with pytest.raises(ValueError, match="NaN or infinite"):
        checks.check_queries("queries", np.full((1, 8), np.inf), 2, 4)
    assert checks.check_ids("ids", 7).tolist() == [7]
    with pytest.raises(ValueError, match="ids"):
        checks.check_ids("ids", [-1])
    with pytest.raises(ValueError, match="ids"):
        checks.check_ids("ids", [1, 2], length=3)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        checks.check_block_size(12)


def test_one_hot_and_duplicates():
    np.testing.assert_array_equal(
        checks.one_hot(np.array([[1, 0]]), 2), [[0.0, 1.0, 1.0, 0.0]]
    )
    assert checks.duplicates(np.array([3, 1, 3, 2, 1])).tolist() == [1, 3]
