"""Argument checks shared by every module.

Each check raises an error that names the argument and the value received,
so bad input fails at the public API rather than deep in TensorFlow or faiss.
"""

from __future__ import annotations

import json
import numbers

import numpy as np


def check_pictures(name: str, pictures) -> np.ndarray:
    """`pictures` as an array, if uint8 `(n, H, W)` or `(n, H, W, C)`.

    Raises:
        ValueError: naming `name` and what was received.
    """
    pictures = np.asarray(pictures)
    if pictures.dtype != np.uint8 or pictures.ndim not in (3, 4):
        raise ValueError(
            f"{name} must be uint8 (n, H, W) or (n, H, W, C), received "
            f"{pictures.dtype} {pictures.shape}"
        )
    return pictures


def check_int(name: str, value, minimum: int | None = None) -> int:
    """Returns `value` as a Python int, or raises naming `name`.

    Booleans are rejected: `True` is an `int` in Python but never a count.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer, received {value!r} "
            f"of type {type(value).__name__}"
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, received {value}")
    return value


def check_power_of_two(name: str, value) -> int:
    """Returns `value`, an integer >= 2 and a power of two, or raises naming
    `name`: a block size whose codes are whole bits."""
    value = check_int(name, value, minimum=2)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, received {value}")
    return value


def check_non_negative(name: str, value) -> float:
    """Returns `value` as a float >= 0 (finite), or raises naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, received {value!r} "
            f"of type {type(value).__name__}"
        )
    value = float(value)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, received {value}")
    return value


def check_block_shape(num_blocks, block_size) -> tuple[int, int]:
    """Validates SuBiC's `(M, K)`: `M >= 1` blocks of size `K >= 2`."""
    return (
        check_int("num_blocks", num_blocks, minimum=1),
        check_int("block_size", block_size, minimum=2),
    )


def check_width(name: str, width, num_blocks: int, block_size: int) -> None:
    """Raises unless the last dimension `width` equals `M * K`."""
    expected = num_blocks * block_size
    if width is not None and int(width) != expected:
        raise ValueError(
            f"{name} must have last dimension num_blocks * block_size = "
            f"{num_blocks} * {block_size} = {expected}, received {width}"
        )


def check_finite(name: str, array: np.ndarray) -> None:
    """Raises if a NumPy array holds NaN or infinite values."""
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise ValueError(
            f"{name} must be finite, received an array with {bad} NaN or "
            "infinite values"
        )


def check_features(name: str, features, dim: int | None = None) -> np.ndarray:
    """Returns `features` as a C-contiguous float32 `(n, d)` array, or raises."""
    array = np.asarray(features)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, received dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty 2-D array (n, d), received shape {array.shape}"
        )
    if dim is not None and array.shape[1] != dim:
        raise ValueError(
            f"{name} must have {dim} columns, the dimension of the fitted "
            f"features, received {array.shape[1]}"
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    # Checked after the cast: float64 values beyond float32's range become inf.
    if not np.all(np.isfinite(array)):
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise ValueError(
            f"{name} must be finite (in float32), received {bad} NaN or infinite values"
        )
    return array


# What `load_json` accepts: deeper nesting or longer numbers are refused
# before Python's parser would recurse or convert them (a RecursionError,
# or int()'s 4,300-digit limit, would otherwise escape as a crash).
MAX_JSON_DEPTH = 32
MAX_JSON_NUMBER_CHARS = 40


def _json_number(text: str) -> str:
    if len(text) > MAX_JSON_NUMBER_CHARS:
        raise ValueError(
            f"a number of {len(text)} characters (at most {MAX_JSON_NUMBER_CHARS})"
        )
    return text


def _json_constant(name: str):
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def _json_depth(text: np.ndarray) -> int:
    """The deepest nesting of brackets outside strings, in linear time."""
    if not len(text):
        return 0
    backslash = text == ord("\\")
    count = np.cumsum(backslash)
    # Backslashes in a row just before each byte: a quote after an odd
    # number of them is escaped.
    run = count - np.maximum.accumulate(np.where(backslash, 0, count))
    before = np.concatenate([[0], run[:-1]])
    quote = (text == ord('"')) & (before % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0
    steps = (np.isin(text, (ord("["), ord("{"))) & outside).astype(np.int64)
    steps -= np.isin(text, (ord("]"), ord("}"))) & outside
    return int(np.cumsum(steps).max())


def load_json(data: bytes | bytearray | str):
    """Parses JSON with bounded nesting and number sizes.

    Returns:
        The value, with numbers of at most `MAX_JSON_NUMBER_CHARS`
        characters (floats may still be beyond float32: callers check the
        range they need) and no `NaN` or `Infinity`.

    Raises:
        ValueError: not UTF-8 JSON, nested deeper than `MAX_JSON_DEPTH`,
            or a number too long; the message says which.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    depth = _json_depth(np.frombuffer(raw, np.uint8))
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested {depth} deep (at most {MAX_JSON_DEPTH})")
    try:
        return json.loads(
            raw.decode(),
            parse_int=lambda text: int(_json_number(text)),
            parse_float=lambda text: float(_json_number(text)),
            parse_constant=_json_constant,
        )
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 ({error})") from None
    except RecursionError:
        raise ValueError(f"JSON nested too deep (at most {MAX_JSON_DEPTH})") from None


def check_image_shape(name: str, shape) -> tuple[int, int, int]:
    """Returns `shape` as a `(height, width, channels)` tuple of positive ints."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(
            f"{name} must be a (height, width, channels) tuple, received {shape!r}"
        )
    height, width, channels = (
        check_int(f"{name}[{i}]", v, minimum=1) for i, v in enumerate(shape)
    )
    return height, width, channels
