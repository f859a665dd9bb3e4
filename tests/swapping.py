"""A file of a folder swapped, as fast as possible, between itself and a
link out of the folder: the race a server must never lose."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def link_swapped(target: Path, inside: bytes, outside: Path) -> Iterator[None]:
    """While the block runs, `target` is, in turns, a file holding `inside`
    and a link to `outside`; each swap is an atomic rename."""
    stop = threading.Event()

    def swap() -> None:
        link, plain = target.parent / ".link", target.parent / ".plain"
        while not stop.is_set():
            link.symlink_to(outside)
            os.replace(link, target)
            plain.write_bytes(inside)
            os.replace(plain, target)

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def outside_folder(tmp_path: Path) -> Path:
    """A folder beside the one a test writes to, holding one file of the
    user's (`victim`), where a planted link leads: it must stay as it is."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("the user's")
    return outside
