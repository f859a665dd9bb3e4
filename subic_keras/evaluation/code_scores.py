"""Scores of database codes for queries: Hamming scores of binary codes and
SuBiC's asymmetric scores (paper Sec. 3.3, Eq. 8), computed in bounded
chunks for the exact metrics of `evaluation`.
"""

from __future__ import annotations

import numpy as np

from subic_keras._validation import check_block_shape, check_finite, check_width
from subic_keras.evaluation.ranking import _CHUNK_ELEMENTS

# ---------------------------------------------------------------------------
# Scores from codes.


def _check_matrix(name: str, array) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, received shape {array.shape}")
    return array


def _chunk_rows_for(width: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, width))


def hamming_scores(
    query_bits: np.ndarray,
    database_bits: np.ndarray,
    *,
    packed: bool = False,
) -> np.ndarray:
    """Negated Hamming distances, so that higher is better.

    `score[i, j] = -Σ_b [q_i[b] != d_j[b]]`, computed as
    `-(|q_i| + |d_j| - 2 q_i·d_j)` with one exact float32 matrix product.

    Example:

    >>> hamming_scores(np.array([[1, 0, 1]]), np.array([[1, 0, 1], [0, 1, 1]]))
    array([[ 0, -2]], dtype=int32)

    Args:
        query_bits: `(num_queries, num_bits)` of 0/1 (any integer, bool or
            float dtype), or with `packed=True` uint8 bytes from `np.packbits`
            along axis 1.
        database_bits: `(num_database, num_bits)`, in the same form.
        packed: whether the bits are packed 8 per uint8 byte. It is never
            guessed, since a packed byte may itself be 0 or 1.

    Returns:
        Int32 array `(num_queries, num_database)`.

    Raises:
        ValueError: on non-2-D inputs, different widths, or values other
            than 0/1 when `packed=False`.
        TypeError: on a non-uint8 dtype when `packed=True`.
    """
    query = _check_matrix("query_bits", query_bits)
    database = _check_matrix("database_bits", database_bits)
    if query.shape[1] != database.shape[1]:
        raise ValueError(
            "query_bits and database_bits must have the same number of "
            f"columns, received {query.shape[1]} and {database.shape[1]}"
        )
    if packed:
        for name, array in (("query_bits", query), ("database_bits", database)):
            if array.dtype != np.uint8:
                raise TypeError(
                    f"{name} must have dtype uint8 when packed=True, "
                    f"received {array.dtype}"
                )
        # Padding bits are zero on both sides, so they never differ.
        query = np.unpackbits(query, axis=1)
        database = np.unpackbits(database, axis=1)
    else:
        for name, array in (("query_bits", query), ("database_bits", database)):
            if array.dtype.kind not in "biuf" or not np.all(
                (array == 0) | (array == 1)
            ):
                raise ValueError(
                    f"{name} must hold bits 0 or 1 (pass packed=True for bytes "
                    "from np.packbits)"
                )
    if query.shape[1] >= 1 << 24:
        raise ValueError(
            f"query_bits must have fewer than 2**24 bits, received {query.shape[1]}"
        )
    query = query.astype(np.float32)
    database = database.astype(np.float32)
    # Integer-valued float32 products are exact below 2**24 bits.
    common = query @ database.T
    distance = query.sum(axis=1)[:, None] + database.sum(axis=1)[None, :] - 2 * common
    return -np.rint(distance).astype(np.int32)


def asymmetric_scores(
    queries_z: np.ndarray,
    database_codes: np.ndarray,
    num_blocks: int,
    block_size: int,
) -> np.ndarray:
    """SuBiC's asymmetric score of real queries against integer codes.

    `score(z*, c) = (z*)ᵀ b(c) = Σ_m z*_m[c_m]`: a table look-up per block,
    `M` additions per database item, never a dense `(n, M*K)` one-hot matrix.

    Example:

    >>> z = np.array([[0.0, 1.0, 2.0, 3.0]])
    >>> asymmetric_scores(z, np.array([[1, 0], [0, 1]]), num_blocks=2, block_size=2)
    array([[3., 3.]])

    Args:
        queries_z: `(num_queries, M*K)` real query vectors (the ReLU output of
            `FC0`), block m in columns `[m*K, (m+1)*K)`.
        database_codes: `(num_database, M)` integer codes in `[0, K)`.
        num_blocks: M.
        block_size: K.

    Returns:
        `(num_queries, num_database)` scores in the floating dtype of
        `queries_z` (float64 for integer input).

    Raises:
        ValueError: on bad shapes, non-finite `queries_z`, or codes outside
            `[0, K)`.
        TypeError: on non-integer codes.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    z = _check_matrix("queries_z", queries_z)
    codes = _check_matrix("database_codes", database_codes)
    check_width("queries_z", z.shape[1], num_blocks, block_size)
    if z.dtype.kind not in "biuf":
        raise TypeError(f"queries_z must hold real numbers, received dtype {z.dtype}")
    if z.dtype.kind != "f":
        z = z.astype(np.float64)
    check_finite("queries_z", z)
    if codes.dtype.kind not in "iu":
        raise TypeError(
            f"database_codes must have an integer dtype, received {codes.dtype}"
        )
    if codes.shape[1] != num_blocks:
        raise ValueError(
            f"database_codes must have num_blocks = {num_blocks} columns, "
            f"received {codes.shape[1]}"
        )
    if codes.size and (codes.min() < 0 or codes.max() >= block_size):
        raise ValueError(
            f"database_codes must lie in [0, block_size) = [0, {block_size}), "
            f"received values in [{codes.min()}, {codes.max()}]"
        )
    # Column of z holding block m's entry for every database item.
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    result = np.empty((z.shape[0], codes.shape[0]), dtype=z.dtype)
    step = _chunk_rows_for(codes.shape[0])
    for begin in range(0, z.shape[0], step):
        block = z[begin : begin + step]
        out = result[begin : begin + step]
        np.take(block, columns[:, 0], axis=1, out=out)
        for m in range(1, num_blocks):
            out += np.take(block, columns[:, m], axis=1)
    return result
