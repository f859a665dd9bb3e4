"""Bit packing of SuBiC codes: `M` blocks of `log2 K` bits per item.

Bits are written least significant first, block after block, which is
faiss's `BitstringWriter` layout (and so `ProductQuantizer`'s); unused
trailing bits of the last byte are zero.
"""

from __future__ import annotations

import numpy as np


def code_size(num_blocks: int, nbits: int) -> int:
    """Bytes of one packed code: `ceil(num_blocks * nbits / 8)`."""
    return (num_blocks * nbits + 7) // 8


def pack(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Packs integer codes `(n, M)` into `(n, code_size(M, nbits))` uint8 bytes.

    Example:

    >>> pack(np.array([[1, 2, 3]]), nbits=4)
    array([[33,  3]], dtype=uint8)
    """
    if nbits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    n, num_blocks = codes.shape
    shifts = np.arange(nbits, dtype=np.uint16)
    bits = (codes.astype(np.uint16)[:, :, None] >> shifts) & 1
    return np.packbits(
        bits.astype(np.uint8).reshape(n, num_blocks * nbits), axis=1, bitorder="little"
    )


def unpack(
    packed: np.ndarray, num_blocks: int, nbits: int, dtype=np.int64
) -> np.ndarray:
    """Inverse of `pack`: `(n, code_size)` bytes to `(n, M)` integer codes.

    Example:

    >>> unpack(np.array([[33, 3]], dtype=np.uint8), num_blocks=3, nbits=4)
    array([[1, 2, 3]])
    """
    if nbits == 8:
        return packed[:, :num_blocks].astype(dtype)
    n = packed.shape[0]
    offsets = np.arange(num_blocks) * nbits
    mask = (1 << nbits) - 1
    if packed.shape[1] <= 8:
        # Up to 64 bits: one little-endian word per item, shifted as a whole
        # rather than bit by bit.
        words = np.zeros((n, 8), dtype=np.uint8)
        words[:, : packed.shape[1]] = packed
        words = words.view("<u8")
        return ((words >> offsets.astype(np.uint64)) & np.uint64(mask)).astype(dtype)
    # A block of <= 10 bits starting at bit offset % 8 <= 7 lies inside three
    # consecutive bytes, so one 24-bit word per block holds it.
    padded = np.zeros((n, packed.shape[1] + 2), dtype=np.uint32)
    padded[:, :-2] = packed
    first = offsets // 8
    words = (
        padded[:, first] | (padded[:, first + 1] << 8) | (padded[:, first + 2] << 16)
    )
    shifts = (offsets % 8).astype(np.uint32)
    return ((words >> shifts) & mask).astype(dtype)
