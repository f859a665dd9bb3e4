"""`subic_keras.search.locks`: many readers or one writer."""

import threading
import time

from subic_keras.search import locks


def test_read_write_lock_lets_readers_share_and_writers_wait():
    lock, events = locks.ReadWriteLock(), []
    both_in, leave = threading.Barrier(3), threading.Event()

    def reader(name):
        with lock.read():
            events.append(f"{name} in")
            both_in.wait(timeout=30)  # both readers inside at once
            leave.wait(timeout=30)
            events.append(f"{name} out")

    def writer():
        with lock.write():
            events.append("writer")

    readers = [threading.Thread(target=reader, args=(n,)) for n in ("a", "b")]
    for thread in readers:
        thread.start()
    both_in.wait(timeout=30)
    writing = threading.Thread(target=writer)
    writing.start()
    time.sleep(0.1)
    assert "writer" not in events  # it waits while readers are in
    leave.set()
    for thread in (*readers, writing):
        thread.join(timeout=30)
    assert sorted(events[:2]) == ["a in", "b in"]
    assert events[-1] == "writer"
