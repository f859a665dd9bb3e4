"""`subic_keras.search.locks`: many readers or one writer."""

import threading
import time

from subic_keras.search import locks


def test_read_write_lock_lets_readers_share_and_writers_wait():
    lock, events = locks.ReadWriteLock(), []

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
