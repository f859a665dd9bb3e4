"""`subic_keras.search.base`: the input checks and lock every backend shares."""

import threading
import time

import numpy as np
import pytest

from subic_keras.search import base


def test_check_codes_accepts_integer_codes_and_block_vectors():
    codes = base.check_codes("codes", [[3, 0]], num_blocks=2, block_size=4)
    assert codes.dtype == np.uint8 and codes.tolist() == [[3, 0]]
    vectors = [[0.0, 0.0, 0.0, 1.0, 5.0, 5.0, 0.0, 0.0]]  # tie: lowest index
    assert base.check_codes("codes", vectors, 2, 4).tolist() == [[3, 0]]
    wide = base.check_codes("codes", [[1000, 3]], num_blocks=2, block_size=1024)
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
        base.check_codes("codes", codes, num_blocks=2, block_size=4)


def test_check_queries_and_ids():
    queries = base.check_queries("queries", np.ones((2, 8)), 2, 4)
    assert queries.dtype == np.float32 and queries.flags.c_contiguous
    with pytest.raises(ValueError, match="2 \\* 4 = 8, received shape \\(2, 7\\)"):
        base.check_queries("queries", np.ones((2, 7)), 2, 4)
    with pytest.raises(ValueError, match="within float32's range"):
        base.check_queries("queries", np.full((1, 8), 1e39), 2, 4)  # finite, huge
    with pytest.raises(ValueError, match="NaN or infinite"):
        base.check_queries("queries", np.full((1, 8), np.inf), 2, 4)
    assert base.check_ids("ids", 7).tolist() == [7]
    with pytest.raises(ValueError, match="ids"):
        base.check_ids("ids", [-1])
    with pytest.raises(ValueError, match="ids"):
        base.check_ids("ids", [1, 2], length=3)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        base.check_block_size(12)


def test_one_hot_and_duplicates():
    np.testing.assert_array_equal(
        base.one_hot(np.array([[1, 0]]), 2), [[0.0, 1.0, 1.0, 0.0]]
    )
    assert base.duplicates(np.array([3, 1, 3, 2, 1])).tolist() == [1, 3]


def test_read_write_lock_lets_readers_share_and_writers_wait():
    lock, events = base.ReadWriteLock(), []

    def reader(name):
        with lock.read():
            events.append(f"{name} in")
            time.sleep(0.3)
            events.append(f"{name} out")

    def writer():
        with lock.write():
            events.append("writer")

    readers = [threading.Thread(target=reader, args=(n,)) for n in ("a", "b")]
    for thread in readers:
        thread.start()
    time.sleep(0.01)
    writing = threading.Thread(target=writer)
    writing.start()
    for thread in (*readers, writing):
        thread.join(timeout=5)
    # Both readers were inside at once; the writer ran after both left.
    assert events.index("b in") < events.index("a out")
    assert events[-1] == "writer"
