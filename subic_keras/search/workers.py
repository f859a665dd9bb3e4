"""Threads kept for a process's searches.

A scan splits a batch of queries among the cores. Threads started for
each search cost it about as much as ordering a batch's ties, so they are
started once in a process (again in a forked child, which inherits no
threads) and kept, one pool per use: a task of one pool may wait on
another's, never on its own.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

Part = TypeVar("Part")
Result = TypeVar("Result")

_pools: dict[str, tuple[int, concurrent.futures.ThreadPoolExecutor]] = {}
_lock = threading.Lock()


def cores() -> int:
    """Threads a search uses: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def pool(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The kept pool `name` of this process: a thread a core (several
    searches at once share it)."""
    with _lock:
        kept = _pools.get(name)
        if kept is None or kept[0] != os.getpid():
            kept = (os.getpid(), concurrent.futures.ThreadPoolExecutor(cores(), name))
            _pools[name] = kept
        return kept[1]


def split_run(
    run: Callable[[Part], Result], parts: Sequence[Part], threads: int
) -> list[Result]:
    """`[run(part) for part in parts]` on up to `threads` threads: the
    calling thread and kept scan threads each take the next part left.

    Every part has finished or was never started when it returns or raises
    (a part may write into the caller's arrays); the first error raised is
    raised again.
    """
    results: list = [None] * len(parts)
    taken = itertools.count()  # (next() of a count is atomic)
    failed: list[BaseException] = []

    def drain() -> None:
        for at in taken:
            if at >= len(parts) or failed:
                return
            try:
                results[at] = run(parts[at])
            except BaseException as error:
                failed.append(error)
                return

    helpers = min(threads, len(parts)) - 1
    futures = [pool("subic-scan").submit(drain) for _ in range(helpers)]
    drain()
    concurrent.futures.wait(futures)
    if failed:
        raise failed[0]
    return results
