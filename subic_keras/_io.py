"""Atomic file and directory writes: nothing saved is ever half-written."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` on success.

    The temporary file lives in the destination's directory so that the final
    `os.replace` is a same-filesystem rename, which POSIX makes atomic. On any
    exception the temporary file is removed and `path` is left untouched.

    Args:
        path: the final destination.
        suffix: a suffix for the temporary name; some writers (Keras's
            `model.save`) choose the format from the extension.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".",
        suffix=suffix or ".tmp",
        dir=directory,
    )
    os.close(fd)
    try:
        yield tmp
        if os.path.exists(tmp):
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            # mkstemp makes the file private (0600); give it the permissions
            # an ordinary open() would, so other users (a serving container)
            # can read it.
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False) -> Iterator[str]:
    """Yields a temporary directory beside `path`; moves it to `path` on success.

    Args:
        path: the final directory. It must not exist unless `overwrite`.
        overwrite: replace an existing directory (the old one is removed only
            after the new one is complete).
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(
            f"path already exists: {path!r}; pass overwrite=True to replace it"
        )
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(path) + ".", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide it
        if os.path.exists(path):
            old = tempfile.mkdtemp(
                prefix="." + os.path.basename(path) + ".old.", dir=parent
            )
            os.rmdir(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
