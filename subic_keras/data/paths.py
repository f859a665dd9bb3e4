"""The files of a folder: walked once, each opened safely inside it.

A folder of pictures is data a user hands us, and a server reads from it on
request, so two rules hold wherever a file of it is found or read:

- **Walking** (`find_files`): every real file is listed once, whatever
  links lead to it. Folders are walked first as they are; links are
  followed afterwards, only where they lead inside the folder, and a folder
  or file already reached (by its device and inode) is not reached again,
  so a link loop (`ln -s . self`) adds nothing. Hidden names are passed
  over; FIFOs, sockets and devices, links out of the folder or to nowhere,
  and entries that vanish while the folder is walked are listed as skipped.
- **Opening** (`open_in_folder`, `open_regular`, and for the package's
  own small files `read_bytes`): a file is opened once,
  without blocking (a FIFO never hangs a reader), and refused unless the
  opened descriptor is a regular file whose real path lies inside the
  folder. The check is made on the descriptor, not on the name, so
  swapping a file for a link between a check and a read cannot serve
  anything outside the folder.

NumPy-free and TensorFlow-free: the standard library only.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Iterator

# How a descriptor's path is read back: Linux's /proc, or macOS's F_GETPATH.
_PROC_FD = "/proc/self/fd"
_F_GETPATH = 50
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    """A file of a folder that was not indexed, and why."""

    path: str
    reason: str


def check_folder(root: str | os.PathLike) -> str:
    """`root` if it is a folder; otherwise the error that says what it is."""
    root = os.fspath(root)
    if not os.path.exists(root):
        raise FileNotFoundError(errno.ENOENT, "image folder not found", root)
    if not os.path.isdir(root):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder of images", root)
    return root


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of `path`, refused unless it is a regular file.

    Opened with `O_NONBLOCK`, so that a FIFO (or a device) put where a
    picture was expected is refused at once instead of blocking the reader.

    Raises:
        OSError: the file cannot be opened, or is not a regular file
            (`EINVAL`, "not a regular file").
    """
    return _regular(os.open(path, _READ | _NONBLOCK), path)


def open_file(path: str | os.PathLike):
    """`open(path, "rb")` through `open_regular`: the one way the package
    opens a file it reads (a FIFO or a device is refused, never waited on)."""
    return open(open_regular(path), "rb")


def read_bytes(path: str | os.PathLike, limit: int, kind: str) -> bytes:
    """The bytes of the regular file `path`, refused past `limit` bytes.

    For the small files the package reads whole (manifests, progress files,
    records): opened as `open_regular` opens (a FIFO never hangs the
    reader), and read to at most `limit + 1` bytes (a huge file, or a
    device, never fills memory).

    Raises:
        OSError: `open_regular`'s, naming `path`.
        ValueError: more than `limit` bytes, naming `kind` and `path`.
    """
    with open_file(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{kind} larger than {limit:,} bytes ({os.fspath(path)})")
    return data


def _regular(fd: int, name: str | os.PathLike) -> int:
    """`fd` set back to blocking reads if it is a regular file; otherwise
    closed, and the error that says what `name` is."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(
                errno.EINVAL, "not a regular file (a FIFO, socket or device)", name
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _descriptor_path(fd: int) -> str | None:
    """The real path of an open descriptor, or `None` where the system does
    not say (then `open_in_folder` walks without following links)."""
    if os.path.isdir(_PROC_FD):
        path = os.readlink(f"{_PROC_FD}/{fd}")
        return path.removesuffix(" (deleted)")
    try:
        import fcntl

        raw = fcntl.fcntl(fd, _F_GETPATH, bytes(4096))  # macOS
    except (ImportError, OSError):
        return None
    return os.fsdecode(raw.split(b"\0", 1)[0])


def relative_parts(relative: str) -> list[str]:
    """The parts of a POSIX path relative to a folder; `PermissionError` for
    one that is empty, absolute, holds a NUL or an empty, `.` or `..` part."""
    parts = relative.split("/")
    if (
        not relative
        or "\0" in relative
        or os.path.isabs(relative)
        or any(part in ("", os.curdir, os.pardir) for part in parts)
    ):
        raise PermissionError(errno.EACCES, "path outside the image folder", relative)
    return parts


def _inside(path: str, real_root: str) -> bool:
    return os.path.commonpath([path, real_root]) == real_root


def open_in_folder(real_root: str, relative: str, *, follow: bool = True) -> int:
    """A descriptor of the regular file `relative` under `real_root`.

    Links are followed as the system follows them, then the descriptor's
    real path is checked to lie inside `real_root`: a link (or a swap of a
    file for a link while this runs) that leads out of the folder is
    refused, and nothing outside is ever read. Where the system cannot say
    a descriptor's path (or with `follow=False`), each component is opened
    with `O_NOFOLLOW` under the previous one's descriptor instead, so no
    link is followed at all.

    Args:
        real_root: the folder, as `os.path.realpath` gives it.
        relative: a POSIX path relative to it.
        follow: follow links that stay inside the folder.

    Raises:
        PermissionError: `relative` leads out of the folder.
        FileNotFoundError: no such file.
        OSError: not a regular file, or it cannot be read.
    """
    parts = relative_parts(relative)
    if follow:
        fd = open_regular(os.path.join(real_root, *parts))
        real = _descriptor_path(fd)
        if real is not None:
            if not _inside(real, real_root):
                os.close(fd)
                raise PermissionError(
                    errno.EACCES, "path outside the image folder", relative
                )
            return fd
        os.close(fd)
    return _open_without_links(real_root, parts, relative)


def _open_without_links(real_root: str, parts: list[str], relative: str) -> int:
    directory = os.open(real_root, _READ | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(
                    part, _READ | os.O_DIRECTORY | _NOFOLLOW, dir_fd=directory
                )
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PermissionError(
                        errno.EACCES, "a link on the way is not followed", relative
                    ) from None
                raise
            os.close(directory)
            directory = inner
        try:
            fd = os.open(parts[-1], _READ | _NONBLOCK | _NOFOLLOW, dir_fd=directory)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise PermissionError(
                    errno.EACCES, "a link is not followed", relative
                ) from None
            raise
    finally:
        os.close(directory)
    return _regular(fd, relative)


def resolve(root: str | os.PathLike, relative: str) -> str:
    """The real path of `relative` under `root`, refused if it leads outside.

    For messages and for tools that need a name: to read the file, use
    `open_in_folder`, which checks what it opened.

    Raises:
        PermissionError: for an absolute path, `..` components or a link
            that leads out of `root`.
        FileNotFoundError: the file does not exist (any more).
    """
    real_root = os.path.realpath(root)
    parts = relative_parts(relative)
    real = os.path.realpath(os.path.join(real_root, *parts))
    if not _inside(real, real_root):
        raise PermissionError(errno.EACCES, "path outside the image folder", relative)
    if not os.path.isfile(real):
        raise FileNotFoundError(errno.ENOENT, "image file not found", relative)
    return real


def is_utf8(name: str) -> bool:
    """Whether `name` encodes as UTF-8 (Python keeps undecodable bytes of a
    file name, and JSON a lone `\\ud800`, as surrogates)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


class _Walk:
    """The state of one `find_files`: what was reached, and what is left."""

    def __init__(self, root: str):
        self.root = root
        self.real_root = os.path.realpath(root)
        self.paths: list[str] = []
        self.skipped: list[SkippedFile] = []
        self.folders: set[tuple[int, int]] = set()
        self.files: dict[tuple[int, int], str] = {}
        self.links: list[str] = []

    def folder(self, relative: str) -> None:
        """Walks one folder and every folder under it, depth first in name
        order, with a stack of listings rather than recursion (a tree
        thousands of folders deep is walked like any other)."""
        stack = [self.listing(relative)]
        while stack:
            path = next(stack[-1], None)
            if path is None:
                stack.pop()
            elif self.entry(path, follow=False):
                stack.append(self.listing(path))

    def visit(self, path: str, follow: bool) -> None:
        """One entry, and the folder under it if it is one."""
        if self.entry(path, follow):
            self.folder(path)

    def listing(self, relative: str) -> Iterator[str]:
        """The entries of one folder to look at: files and folders, in name
        order; links are put aside, hidden and undecodable names passed."""
        directory = os.path.join(self.root, relative) if relative else self.root
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            reason = f"folder cannot be read ({error.strerror or error})"
            self.skipped.append(SkippedFile(relative or ".", reason))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = f"{relative}/{entry.name}" if relative else entry.name
            if not is_utf8(path):
                self.skipped.append(SkippedFile(repr(path), "name is not UTF-8"))
            elif entry.is_symlink():
                self.links.append(path)
            else:
                yield path

    def entry(self, path: str, follow: bool) -> bool:
        """Keeps a file, or says whether `path` is a folder to walk."""
        full = os.path.join(self.root, path)
        try:
            info = os.stat(full, follow_symlinks=follow)
        except OSError as error:
            reasons = {
                errno.ELOOP: "a loop of links",
                errno.ENOENT: "link to nothing"
                if follow
                else "vanished during the walk",
            }
            reason = reasons.get(error.errno or 0, error.strerror or str(error))
            self.skipped.append(SkippedFile(path, reason))
            return False
        if follow and not _inside(os.path.realpath(full), self.real_root):
            self.skipped.append(SkippedFile(path, "link out of the folder"))
            return False
        key = (info.st_dev, info.st_ino)
        if stat.S_ISDIR(info.st_mode):
            if key in self.folders:
                self.skipped.append(SkippedFile(path, "a folder already walked"))
                return False
            self.folders.add(key)
            return True
        if not stat.S_ISREG(info.st_mode):
            self.skipped.append(
                SkippedFile(path, "not a regular file (a FIFO, socket or device)")
            )
        elif key in self.files:
            self.skipped.append(
                SkippedFile(path, f"the same file as {self.files[key]}")
            )
        else:
            self.files[key] = path
            self.paths.append(path)
        return False


def find_files(root: str | os.PathLike) -> tuple[list[str], list[SkippedFile]]:
    """Every regular file under `root`, each once, as sorted relative paths.

    The folders are walked first as they are, then the links found are
    followed in sorted order where they lead inside `root` (module doc): a
    file or folder reached twice, through a link or a loop, is kept under
    the first path that reached it and listed as skipped under the others.

    Returns:
        `(paths, skipped)`: POSIX-style paths relative to `root`, and what
        was passed over, with the reason.

    Raises:
        NotADirectoryError, FileNotFoundError: `root` is not a folder.
    """
    root = check_folder(root)
    walk = _Walk(root)
    top = os.stat(root)
    walk.folders.add((top.st_dev, top.st_ino))
    walk.folder("")
    while walk.links:
        pending, walk.links = sorted(walk.links), []
        for path in pending:
            walk.visit(path, follow=True)
    return sorted(walk.paths), walk.skipped
