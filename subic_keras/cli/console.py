"""What the `subic` command line shows a person: quiet start-up, one-line errors.

TensorFlow prints a dozen start-up lines (CUDA drivers, oneDNN, absl's
`InitializeLog`) from C++ when it loads, some before any Python setting can
reach them; `quiet_imports` hides them by pointing the process's standard
error at `/dev/null` while the heavy modules load. Errors a user can fix
become one line (`describe`).
"""

from __future__ import annotations

import os

from subic_keras._quiet import quiet_imports as quiet_imports

# A user's mistake, reported in one line: bad values, wrong types, every
# failure to read or write a file or reach the network (OSError covers
# FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError,
# PermissionError, ConnectionError), and a missing optional dependency.
USER_ERRORS = (ValueError, TypeError, OSError, ImportError, MemoryError)


def debug_requested(verbose: bool = False) -> bool:
    """`--verbose`, or `SUBIC_DEBUG` set to anything but empty or `0`."""
    return verbose or os.environ.get("SUBIC_DEBUG", "") not in ("", "0")


def describe(error: BaseException) -> str:
    """One line saying what went wrong, with the file's path when known."""
    if isinstance(error, OSError) and error.filename is not None:
        what = error.strerror or str(error)
        return f"{what} ({error.filename})"
    if isinstance(error, MemoryError) and not str(error):
        return "out of memory"
    return " ".join(str(error).split()) or type(error).__name__


def printable(text: str) -> str:
    """`text` safe to print on a terminal: control characters (escape
    sequences, newlines, carriage returns), format characters and the
    surrogates that stand for undecodable bytes are shown escaped, as
    Python writes them (`\\x1b`, `\\n`, `\\udce9`), so a file name cannot
    move the cursor, recolour the screen or fake a line of output."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def plural(count: int, word: str, words: str | None = None) -> str:
    """`"1 picture"`, `"2 pictures"`: a count and its noun, in agreement."""
    return f"{count:,} {word if count == 1 else words or word + 's'}"
