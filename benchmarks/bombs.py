"""Pictures that are small files and huge decodes, written without ever
holding their pixels: a PNG's rows of zeros are compressed as they go."""

from __future__ import annotations

import struct
import zlib

# PNG colour types: grey, RGB.
GREY, RGB = 0, 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_bomb(width: int, height: int, bit_depth: int = 8, colour: int = RGB) -> bytes:
    """A valid PNG of `width x height` zero pixels (a few hundred KB at most)."""
    channels = 3 if colour == RGB else 1
    row = bytes(1 + width * channels * bit_depth // 8)  # filter byte 0, zeros
    compressor = zlib.compressobj(9)
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", b"".join(parts))
        + _chunk(b"IEND", b"")
    )
