"""Atomic file and directory writes: nothing saved is ever half-written.

Every save writes a temporary beside its destination, named
`.<destination name>.subic-tmp-<pid>-<random>`, and renames it into place
when complete. A save killed before the rename (SIGKILL, power loss) leaves
its temporary behind; the next save to the same destination removes every
temporary whose writing process is gone (`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator

# Marks the temporaries of `atomic_path` and `atomic_directory` in their names.
TEMPORARY_MARK = ".subic-tmp-"
# Suffix of the previous version that `atomic_directory` moves aside.
_OLD = ".old"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_stem(path: str) -> str:
    return "." + os.path.basename(path) + TEMPORARY_MARK


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Removes the temporaries that killed saves to `path` left behind.

    A temporary is stale when the process that wrote it no longer runs
    (its pid is in the name), so saves running concurrently keep theirs. A
    directory save killed between moving the old version aside and moving
    the new one in has left no `path`: the old version is moved back.

    Returns:
        The names removed (or restored), for logging.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    stem = _temporary_stem(path)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if not name.startswith(stem):
            continue
        writer = name[len(stem) :].split("-", 1)[0]
        if not writer.isdigit() or _process_alive(int(writer)):
            continue
        stale = os.path.join(directory, name)
        if name.endswith(_OLD) and os.path.isdir(stale) and not os.path.exists(path):
            os.replace(stale, path)
        elif os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        removed.append(name)
    return removed


def _temporary_prefix(path: str) -> str:
    return f"{_temporary_stem(path)}{os.getpid()}-"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` on success.

    The temporary file lives in the destination's directory so that the final
    `os.replace` is a same-filesystem rename, which POSIX makes atomic. On any
    exception the temporary file is removed and `path` is left untouched;
    temporaries of earlier, killed saves to `path` are removed first.

    Args:
        path: the final destination.
        suffix: a suffix for the temporary name; some writers (Keras's
            `model.save`) choose the format from the extension.
    """
    path = output_target(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(
        prefix=_temporary_prefix(path), suffix=suffix or ".tmp", dir=directory
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
    parent = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(
            f"path already exists: {path!r}; pass overwrite=True to replace it"
        )
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=_temporary_prefix(path), dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide it
        if os.path.exists(path):
            old = tempfile.mkdtemp(
                prefix=_temporary_prefix(path), suffix=_OLD, dir=parent
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


def check_file(path: str | os.PathLike, kind: str) -> str:
    """`path` if it names a file; otherwise the `OSError` that says which
    `kind` of file was expected (`"model file not found (m.keras)"`)."""
    path = os.fspath(path)
    try:
        os.stat(path)
    except OSError as error:
        # Name the real cause: a loop of links, a folder without permission
        # to enter, a file where a folder belongs on the way.
        causes = {
            errno.ELOOP: (OSError, "a loop of symbolic links"),
            errno.EACCES: (PermissionError, "permission denied"),
            errno.ENOTDIR: (NotADirectoryError, "a file where a folder belongs"),
        }
        kind_of_error, what = causes.get(error.errno or 0, (FileNotFoundError, ""))
        if not what:
            raise FileNotFoundError(errno.ENOENT, f"{kind} not found", path) from None
        raise kind_of_error(error.errno, f"{kind}: {what}", path) from None
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"a directory, not a {kind}", path)
    if not os.access(path, os.R_OK):
        raise PermissionError(errno.EACCES, f"{kind}: permission denied", path)
    if not os.path.isfile(path):
        # A FIFO or a device would block or never end when read.
        raise OSError(errno.EINVAL, f"{kind}: not a regular file", path)
    return path


def check_keras_file(path: str | os.PathLike, members: bool = True) -> str:
    """`path` if it is a readable `.keras` archive (a zip holding
    `config.json`, and with `members` every member intact: a read of the
    whole file, which the loader does, so a quick early check skips it);
    checked without TensorFlow.

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError: `path` is no
            readable file (`check_file`).
        ValueError: not a zip archive, no `config.json`, or a corrupt member.
    """
    import zipfile

    path = check_file(path, "model file")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            corrupt = archive.testzip() if members else None
    except (zipfile.BadZipFile, EOFError) as error:
        raise ValueError(
            f"not a Keras model file: not a zip archive, or truncated ({error}) "
            f"({path})"
        ) from None
    if "config.json" not in names:
        raise ValueError(
            f"not a Keras model file: no config.json in the archive ({path})"
        )
    if corrupt is not None:
        raise ValueError(
            f"not a Keras model file: corrupt archive member {corrupt} ({path})"
        )
    return path


def load_keras_file(path: str | os.PathLike, compile: bool = True):
    """`keras.saving.load_model(path)`, with errors that say what the file is.

    Keras reports a truncated or non-zip file as "File not found"; this
    checks the archive first, so that a user learns what is wrong with it.
    Keras's safe mode stays on: a file cannot run code (no `Lambda` layers).

    Raises:
        FileNotFoundError, IsADirectoryError: `path` is no file.
        ValueError: `path` is not a readable `.keras` archive, or Keras
            cannot rebuild the model it holds.
    """
    import keras

    import subic_keras

    # The package's classes (`SubicTrainModel`, its layers) must be known to
    # Keras before a file that names them is read, whatever was imported.
    subic_keras._register_keras_objects()
    path = check_keras_file(path)
    try:
        return keras.saving.load_model(path, compile=compile)
    except Exception as error:
        # Keras raises anything from TypeError to h5py's OSError for a
        # well-formed archive it cannot rebuild, its message often followed
        # by the model's whole configuration: the first 300 characters say it.
        reason = " ".join(str(error).split())
        if len(reason) > 300:
            reason = reason[:300] + " …"
        raise ValueError(
            f"cannot load the Keras model in {path!r}: {type(error).__name__}: {reason}"
        ) from error


def output_target(path: str | os.PathLike) -> str:
    """The file a save to `path` replaces: `path`, or the file a symbolic
    link there leads to (the link is kept and its target replaced).

    Only a regular file is ever replaced; anything else at the path is
    refused before a byte is written.

    Raises:
        IsADirectoryError: a directory is there.
        ValueError: a device, FIFO or socket is there, or a link loop.
    """
    path = os.fspath(path)
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ValueError(f"a loop of symbolic links ({path})") from None
        path = os.path.realpath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "a directory, not an output file", path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(
            f"not a regular file (a device, FIFO or socket), refused as an output "
            f"({path})"
        )
    return path


def check_output_path(path: str | os.PathLike) -> str:
    """`path` if a file can be written there: its folder exists and it is
    not a directory (checked before any long work that would end in a save).

    Raises:
        IsADirectoryError: `path` is a directory.
        ValueError: `path` is a device, FIFO or socket (`output_target`).
        FileNotFoundError: the folder that would hold it does not exist.
    """
    path = output_target(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(
            errno.ENOENT, "the folder of the output file does not exist", parent
        )
    return path
