"""Views, scores and writers at the same time: no deadlock, no mixed state."""

import threading
import time

import numpy as np
import pytest

from subic_keras.search import ShardedSubicIndex, SubicIndex, merge_results

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

M, K = 4, 16


def _filled(rng, start, n=300):
    index = SubicIndex(M, K)
    index.add(rng.integers(0, K, (n, M)), ids=np.arange(start, start + n))
    return index


def _run_for(seconds, *loops):
    """Runs each loop in a thread until `seconds` pass; returns whether all
    threads finished (no deadlock) and the errors they raised."""
    stop, errors = threading.Event(), []

    def forever(loop):
        try:
            while not stop.is_set():
                loop()
        except Exception as error:  # reported by the test
            errors.append(error)

    threads = [threading.Thread(target=forever, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=20)
    return not any(thread.is_alive() for thread in threads), errors


def test_views_in_both_orders_with_writers_never_deadlock(rng):
    a, b = _filled(rng, 0), _filled(rng, 10_000)
    forward, backward = ShardedSubicIndex([a, b]), ShardedSubicIndex([b, a])
    queries = rng.random((4, M * K)).astype(np.float32)
    next_ids = {id(a): 1_000_000, id(b): 2_000_000}

    def writer(index):
        def write():
            new = next_ids[id(index)]
            next_ids[id(index)] += 1
            index.add(rng.integers(0, K, (1, M)), ids=[new])
            index.remove([new])

        return write

    finished, errors = _run_for(
        2.0,
        lambda: forward.search(queries, 5),
        lambda: backward.search(queries, 5),
        writer(a),
        writer(b),
    )
    assert finished, "a view or a writer never returned: deadlock"
    assert not errors


def test_score_all_sees_one_state_while_items_come_and_go(rng):
    index = _filled(rng, 0, 200)
    queries = rng.random((3, M * K)).astype(np.float32)
    codes = dict(zip(index.get_ids().tolist(), index.get_codes()))
    counter = iter(range(10_000, 10**9))
    wrong = []

    def write():
        new = next(counter)
        code = rng.integers(0, K, (1, M))
        codes[new] = code[0]
        index.add(code, ids=[new])
        index.remove([new])

    def score():
        scores, ids = index.score_all(queries)
        # Each column must be its own id's score: Σ_m q[m*K + c_m].
        expected = np.stack(
            [queries[:, np.arange(M) * K + codes[i]].sum(axis=1) for i in ids], 1
        )
        if not np.allclose(scores, expected, rtol=1e-5, atol=1e-5):
            wrong.append(ids)

    finished, errors = _run_for(1.5, write, score)
    assert finished and not errors and not wrong


def test_a_real_item_scoring_minus_infinity_is_not_missing():
    first = (np.array([[3.0, -np.inf]], np.float32), np.array([[7, 8]]))
    second = (np.array([[2.0, -np.inf]], np.float32), np.array([[9, -1]]))
    scores, ids = merge_results([first, second], 4)
    assert ids.tolist() == [[7, 9, 8, -1]]
    assert scores.tolist() == [[3.0, 2.0, -np.inf, -np.inf]]
    wide = (np.array([[1.0 + 1e-9, 1.0]]), np.array([[1, 2]]))  # float64 kept
    scores, ids = merge_results([wide], 2)
    assert scores.dtype == np.float64 and scores[0, 0] > scores[0, 1]


def test_queries_beyond_float32_are_refused_as_such(rng):
    index = _filled(rng, 0, 10)
    huge = np.zeros((1, M * K))
    huge[0, 0] = 1e39
    with pytest.raises(ValueError, match="within float32's range"):
        index.search(huge, 3)
    huge[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        index.search(huge, 3)
