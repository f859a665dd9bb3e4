"""Tests of the threads kept for searches."""

import os
import threading
import time

import pytest

from subic_keras.search import workers


def test_split_run_runs_every_part_once_on_at_most_a_thread_a_core():
    where, lock = {}, threading.Lock()

    def run(part):
        with lock:
            assert part not in where
            where[part] = threading.get_ident()
        time.sleep(0.01)
        return part * part

    assert workers.split_run(run, range(9), workers.cores()) == [
        p * p for p in range(9)
    ]
    assert sorted(where) == list(range(9))
    assert len(set(where.values())) <= workers.cores()
    # One thread asked for: every part in the calling thread.
    where.clear()
    assert workers.split_run(run, range(4), 1) == [0, 1, 4, 9]
    assert set(where.values()) == {threading.get_ident()}
    assert workers.split_run(run, [], workers.cores()) == []


def test_the_threads_are_kept_between_searches():
    assert workers.pool("subic-scan") is workers.pool("subic-scan")
    assert workers.pool("subic-scan") is not workers.pool("subic-beside")
    before = threading.active_count()
    for _ in range(20):
        workers.split_run(
            lambda part: part, range(workers.cores() + 1), workers.cores()
        )
    assert threading.active_count() <= before + workers.cores()


def test_a_failing_part_waits_for_the_others_then_raises():
    started, finished = [], []

    def run(part):
        started.append(part)
        if part == 0:
            raise ValueError("part 0")
        time.sleep(0.05)
        finished.append(part)

    with pytest.raises(ValueError, match="part 0"):
        workers.split_run(run, range(6), workers.cores())
    # None still writing: every part begun has ended.
    assert sorted(finished) == sorted(p for p in started if p != 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_its_own_threads():
    workers.split_run(lambda part: part, range(3), 2)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the parent's threads do not exist here
        try:
            ok = workers.split_run(lambda part: part + 1, range(3), 2) == [1, 2, 3]
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(child, 0)
