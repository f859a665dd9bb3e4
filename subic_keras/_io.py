"""One way to write a file: atomic, and never through a link.

Every save writes a temporary beside its destination, inside a private
folder named `.<destination name>.subic-tmp-<pid>-<random>` (mode 0700,
made by this process, so nobody can plant a link in it), and renames it
into place when complete. A save killed before the rename (SIGKILL, power
loss) leaves its temporary behind; the next save to the same destination
removes every temporary whose writing process is gone
(`remove_stale_temporaries`).

No save follows a link. The rename replaces the name itself, never a
file a link there leads to; a link where a file is to be saved is refused
unless the caller replaces it (`replace=True`, the command line's
`--overwrite`), and then the link itself goes; a directory, FIFO, socket or
device there is always refused. The folders a save makes inside its output folder
(`make_folders`) are made one by one under the previous one's descriptor,
refusing links and files on the way. The output folder a user names may
itself be a link: that is their choice, not a planted one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
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
        folder = os.path.isdir(stale) and not os.path.islink(stale)
        # Only a real folder is restored: a link planted under a backup's
        # name would become the version, and be written through.
        if name.endswith(_OLD) and folder and not os.path.lexists(path):
            os.replace(stale, path)
        elif folder:
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        removed.append(name)
    return removed


def _temporary_prefix(path: str) -> str:
    return f"{_temporary_stem(path)}{os.getpid()}-"


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike, suffix: str = "", *, replace: bool = False
) -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` on success.

    The temporary lives in a private folder inside the destination's folder,
    so that the final `os.replace` is a same-filesystem rename, which POSIX
    makes atomic, and nobody else can put a link where it is written. The
    rename replaces the name `path`: a link there is replaced itself, never
    followed. On any exception the temporary is removed and `path` is left
    untouched; temporaries of earlier, killed saves to `path` are removed
    first.

    Args:
        path: the final destination: a new name, or a regular file.
        suffix: a suffix for the temporary name; some writers (Keras's
            `model.save`) choose the format from the extension.
        replace: replace a link at `path` itself, instead of refusing it
            (`output_target`).

    Raises:
        FileExistsError: a link is at `path`, and not `replace`.
        IsADirectoryError, ValueError: `output_target`'s refusals.
    """
    path = output_target(path, replace=replace)
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(path)
    private = tempfile.mkdtemp(prefix=_temporary_prefix(path), dir=directory)
    tmp = os.path.join(private, name + (suffix or ".tmp"))
    try:
        # Made here, so that a writer that opens it by name finds a regular
        # file of ours.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600))
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"the save did not write a file ({path})")
            os.fsync(fd)
            # A private file (0600) gets the permissions an ordinary open()
            # would give, so other users (a serving container) can read it.
            os.fchmod(fd, 0o666 & ~_umask())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _sync_folder(directory)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _sync_folder(directory: str) -> None:
    """Makes a rename in `directory` durable (a power loss keeps it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, _DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_folders(folder: str | os.PathLike, *parts: str, replace: bool = False) -> str:
    """`folder/parts…`, made where missing, each part a real folder.

    `folder` (the output folder a user names) is made as `os.makedirs`
    makes it; each of `parts` is made or opened under the previous part's
    descriptor without following a link, so a link planted inside the
    output folder (`logs -> /elsewhere`) never receives a file.

    Args:
        folder: the output folder.
        parts: names of folders inside it, outermost first.
        replace: remove a link or a file that stands where a part belongs
            (the link itself, never what it leads to) instead of refusing it.

    Returns:
        The path of the innermost folder.

    Raises:
        FileExistsError: a link or a file stands where a part belongs, and
            not `replace`.
    """
    path = os.fspath(folder)
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, _DIRECTORY)
    try:
        for part in parts:
            path = os.path.join(path, part)
            inner = _open_folder(fd, part, path, replace)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return path


def _open_folder(parent: int, name: str, path: str, replace: bool) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=parent)
    try:
        return os.open(name, _DIRECTORY | _NOFOLLOW, dir_fd=parent)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    if not replace:
        what = "a symbolic link" if os.path.islink(path) else "a file"
        raise FileExistsError(
            errno.EEXIST,
            f"{what} stands where a folder of ours belongs; it is never written "
            "through: remove it, or pass --overwrite to replace it",
            path,
        )
    os.unlink(name, dir_fd=parent)
    os.mkdir(name, 0o777, dir_fd=parent)
    return os.open(name, _DIRECTORY | _NOFOLLOW, dir_fd=parent)


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
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(
            f"path already exists: {path!r}; pass overwrite=True to replace it"
        )
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=_temporary_prefix(path), dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide it
        if os.path.lexists(path):
            old = tempfile.mkdtemp(
                prefix=_temporary_prefix(path), suffix=_OLD, dir=parent
            )
            os.rmdir(old)
            os.replace(path, old)  # a link is moved, never followed
            os.replace(tmp, path)
            if os.path.islink(old) or not os.path.isdir(old):
                os.remove(old)
            else:
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


def output_target(path: str | os.PathLike, *, replace: bool = False) -> str:
    """`path`, if a save may write there: a new name or a regular file.

    Nothing is followed: a link at `path` is refused (its target is never
    written), unless `replace`, which replaces the link itself.

    Raises:
        FileExistsError: a symbolic link is at `path`, and not `replace`.
        IsADirectoryError: a directory is there.
        ValueError: a device, FIFO or socket is there.
    """
    path = os.fspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(mode) and not replace:
        raise FileExistsError(
            errno.EEXIST,
            f"a symbolic link (to {os.readlink(path)!r}) is where the file would "
            "be saved; a save never writes through a link: remove it, or name "
            "the file itself",
            path,
        )
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "a directory, not an output file", path)
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
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
