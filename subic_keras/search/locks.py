"""`ReadWriteLock`: many concurrent searches, or one change to an index."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator


class ReadWriteLock:
    """Many concurrent readers or one writer; waiting writers go first."""

    _ranks = itertools.count()

    def __init__(self):
        # A total order over every lock, in which code that takes several
        # (`ShardedSubicIndex`) takes them, so that no two can deadlock.
        self.rank = next(ReadWriteLock._ranks)
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class ReadOnly:
    """A `ReadWriteLock` whose holder only reads: `write()` raises. What a
    view of an index's instance codes (`ImageIndex.by_instance`) locks with,
    so that nothing is written past the index that keeps both codes."""

    def __init__(self, lock: ReadWriteLock):
        self._lock = lock

    def read(self):
        return self._lock.read()

    def write(self):
        raise ValueError(
            "this is a view of an index's instance codes, for searching: add and "
            "remove pictures through the index itself"
        )
