"""The input checks every backend shares: block shapes, codes, queries, ids.

Each raises `ValueError` naming the argument and what was received, before
an index changes or a scan starts.
"""

from __future__ import annotations

import re

import numpy as np

from subic_keras._validation import check_finite, check_int

MAX_BLOCK_SIZE = 1024
# The native scan sums 8-bit table entries of up to 16 blocks in 16 bits;
# 4,096 blocks (over 4,000 bytes a code) is far beyond any SuBiC model.
MAX_NUM_BLOCKS = 4096


def check_num_blocks(num_blocks: int) -> int:
    """`num_blocks` must be at most `MAX_NUM_BLOCKS`."""
    if num_blocks > MAX_NUM_BLOCKS:
        raise ValueError(
            f"num_blocks={num_blocks} is too large: search supports up to "
            f"{MAX_NUM_BLOCKS} blocks"
        )
    return num_blocks


def check_block_size(block_size, name: str = "block_size") -> int:
    """`block_size` must be an integer power of two in `[2, MAX_BLOCK_SIZE]`."""
    block_size = check_int(name, block_size, minimum=2)
    if block_size & (block_size - 1) or block_size > MAX_BLOCK_SIZE:
        raise ValueError(
            f"{name} must be a power of two between 2 and "
            f"{MAX_BLOCK_SIZE} (codes are stored with log2(block_size) bits "
            f"per block), received {block_size}"
        )
    return block_size


def _as_2d(name: str, array) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array, received shape {array.shape}; "
            "reshape a single item with .reshape(1, -1)"
        )
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, received dtype {array.dtype}")
    return array


def check_codes(
    name: str, codes, num_blocks: int, block_size: int, chunk: int = 65_536
) -> np.ndarray:
    """Integer codes `(n, M)`, or per-block vectors `(n, M*K)` -> argmax.

    Example:

    >>> check_codes("codes", [[0.1, 0.9, 0.8, 0.2]], num_blocks=2, block_size=2)
    array([[1, 0]], dtype=uint8)

    Returns:
        uint8 codes (uint16 for `K > 256`), `(n, M)`.

    Raises:
        ValueError: naming `name`, for a wrong shape or dtype, values outside
            `[0, K)`, NaN or inf.
    """
    codes = _as_2d(name, codes)
    width = codes.shape[1]
    dtype = np.uint8 if block_size <= 256 else np.uint16
    if width == num_blocks * block_size:
        out = np.empty((len(codes), num_blocks), dtype=dtype)
        # In chunks: the finiteness mask and argmax temporaries stay small.
        for start in range(0, len(codes), chunk):
            part = codes[start : start + chunk]
            if part.dtype.kind == "f":
                check_finite(name, part)
            blocks = part.reshape(len(part), num_blocks, block_size)
            # argmax keeps the lowest index among equal maxima.
            out[start : start + chunk] = blocks.argmax(axis=-1)
        return out
    if width != num_blocks:
        raise ValueError(
            f"{name} must have width num_blocks = {num_blocks} (integer codes) "
            f"or num_blocks * block_size = {num_blocks * block_size} (per-block "
            f"vectors), received shape {codes.shape}"
        )
    if codes.dtype.kind not in "iu":
        raise ValueError(
            f"{name} of width num_blocks = {num_blocks} must be integer codes, "
            f"received dtype {codes.dtype}"
        )
    if codes.size:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= block_size:
            raise ValueError(
                f"{name} must hold values in [0, block_size) = [0, {block_size}), "
                f"received values in [{low}, {high}]"
            )
    return codes.astype(dtype)


def check_queries(name: str, queries, num_blocks: int, block_size: int) -> np.ndarray:
    """Finite real queries `(nq, M*K)` as C-contiguous float32."""
    queries = _as_2d(name, queries)
    width = num_blocks * block_size
    if queries.shape[1] != width:
        raise ValueError(
            f"{name} must have width num_blocks * block_size = {num_blocks} * "
            f"{block_size} = {width}, received shape {queries.shape}"
        )
    if queries.dtype.kind == "f" and queries.dtype.itemsize > 4:
        # Finite, but beyond float32 (the precision every scan sums in):
        # say so, rather than calling them infinite after the cast.
        check_finite(name, queries)
        largest = float(np.abs(queries).max()) if queries.size else 0.0
        if largest > float(np.finfo(np.float32).max):
            raise ValueError(
                f"{name} must lie within float32's range (|x| <= 3.4e38), "
                f"received a value of magnitude {largest:.3g}"
            )
    with np.errstate(over="ignore"):  # overflow to inf is reported just below
        queries = np.ascontiguousarray(queries, dtype=np.float32)
    check_finite(name, queries)
    return queries


def check_ids(name: str, ids, length: int | None = None) -> np.ndarray:
    """Ids as a 1-D int64 array of values >= 0 (`length` of them if given)."""
    ids = np.asarray(ids)
    if ids.ndim == 0:
        ids = ids.reshape(1)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(
            f"{name} must be a 1-D array of integers, received shape "
            f"{ids.shape} and dtype {ids.dtype}"
        )
    if length is not None and len(ids) != length:
        raise ValueError(
            f"{name} must have one id per code ({length}), received {len(ids)}"
        )
    if ids.size and ids.dtype.kind == "u" and int(ids.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64, received {int(ids.max())}")
    ids = ids.astype(np.int64)
    if ids.size and int(ids.min()) < 0:
        raise ValueError(
            f"{name} must be >= 0 (-1 marks missing results), received "
            f"{preview(ids[ids < 0])}"
        )
    return ids


def preview(values: np.ndarray, limit: int = 10) -> str:
    """The first distinct `values`, for an error message: `[1, 2, ... (n in all)]`."""
    values = np.unique(values)
    shown = ", ".join(str(int(v)) for v in values[:limit])
    more = f", ... ({len(values)} in all)" if len(values) > limit else ""
    return f"[{shown}{more}]"


def duplicates(ids: np.ndarray) -> np.ndarray:
    """The values that occur more than once in `ids`."""
    if len(ids) < 2 or np.all(np.diff(ids) > 0):
        return ids[:0]  # increasing, as default ids are: no sort needed
    values, counts = np.unique(ids, return_counts=True)
    return values[counts > 1]


def one_hot(codes: np.ndarray, block_size: int) -> np.ndarray:
    """Integer codes `(n, M)` to their one-hot vectors `(n, M*K)`, float32."""
    n, num_blocks = codes.shape
    out = np.zeros((n, num_blocks * block_size), dtype=np.float32)
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    np.put_along_axis(out, columns, 1.0, axis=1)
    return out


def check_model_record(name: str, record) -> dict | None:
    """What an index records of the model that wrote its codes, or None.

    A record is a JSON object with a `"digest"` (64 hexadecimal digits, the
    SHA-256 of the model's configuration and weights) and, for messages,
    the model's `"file"` name, `"num_blocks"`, `"block_size"`,
    `"input_shape"` and `"query"` kind.
    """
    if record is None:
        return None
    digest = record.get("digest") if isinstance(record, dict) else None
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or any(c not in "0123456789abcdef" for c in digest)
    ):
        raise ValueError(
            f"{name} must be a model record with a 64-digit hexadecimal digest, "
            f"received {str(record)[:200]}"
        )
    return dict(record)


# A build's token (`manifests`): what a manifest and its shards' labels hold.
BUILD = re.compile(r"[0-9a-f]{8,32}")


def check_shard_label(name: str, label) -> tuple[str, int] | None:
    """A shard's `(build, number)` (`SubicIndex.shard_label`), or None."""
    if label is None:
        return None
    if (
        not isinstance(label, (tuple, list))
        or len(label) != 2
        or not isinstance(label[0], str)
        or not BUILD.fullmatch(label[0])
        or isinstance(label[1], (bool, np.bool_))
        or not isinstance(label[1], (int, np.integer))
        or not 0 <= label[1] < 1 << 31
    ):
        raise ValueError(
            f"{name} must be a (build, number) pair, a build token of 8 to 32 "
            f"hexadecimal digits and a count, received {str(label)[:200]}"
        )
    return (label[0], int(label[1]))


def model_writer(record: dict, model: str) -> str:
    """How messages name the model an index's `record` says wrote it, beside
    `model`, the one given now: its path (or file name), and "an earlier
    training of" it where both are the same file."""
    writer = record.get("path") or record.get("file") or "another model"
    return f"an earlier training of {writer}" if writer == model else writer


def check_fingerprints(fingerprints, n: int) -> np.ndarray:
    """The queries' pixel fingerprints as uint64 `(n,)`, one per query."""
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    if fingerprints.shape != (n,):
        raise ValueError(
            f"fingerprints must have shape ({n},), one per query, "
            f"received {fingerprints.shape}"
        )
    return fingerprints
