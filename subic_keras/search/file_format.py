"""The `.subic` index file: a versioned, checksummed, pickle-free layout.

Version 1, little-endian:

    offset  size          field
    0       8             magic b"SUBICIDX"
    8       4   uint32    format version (1)
    12      4   uint32    M, num_blocks
    16      4   uint32    K, block_size (a power of two)
    20      4   uint32    flags: bit 0 = exact scan; other bits must be 0
    24      8   uint64    n, number of items
    32      4   uint32    code_size = ceil(M * log2(K) / 8)
    36      4   uint32    shortlist (0 = default)
    40      n*code_size   codes, each M blocks of log2(K) bits packed least
                          significant bit first (faiss's bit-string layout),
                          unused trailing bits zero
    ...     8*n  int64    ids, in insertion order
    ...     32            SHA-256 of every byte before it

`read` checks the size and the checksum before any byte reaches faiss, so a
truncated or corrupted file raises `ValueError` naming the path. `write`
writes to a temporary file beside the destination and renames it into place,
so the destination is never half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from collections.abc import Iterable

import numpy as np

from subic_keras._io import atomic_path
from subic_keras.search import packing
from subic_keras.search.base import MAX_BLOCK_SIZE, duplicates

MAGIC = b"SUBICIDX"
VERSION = 1
# magic, version, M, K, flags, n, code_size, shortlist
_HEADER = struct.Struct("<8sIIIIQII")
_DIGEST_SIZE = 32
_FLAG_EXACT = 1


@dataclasses.dataclass(frozen=True)
class Header:
    """The settings an index file records."""

    num_blocks: int
    block_size: int
    exact: bool
    size: int
    shortlist: int | None

    @property
    def nbits(self) -> int:
        return self.block_size.bit_length() - 1

    @property
    def code_size(self) -> int:
        return packing.code_size(self.num_blocks, self.nbits)


def write(
    path: str | os.PathLike,
    header: Header,
    packed_chunks: Iterable[np.ndarray],
    ids: np.ndarray,
) -> None:
    """Writes an index file atomically.

    Args:
        path: destination; replaced only once fully written.
        header: the index's settings; `header.size` items follow.
        packed_chunks: packed codes `(rows, code_size)` uint8, in insertion
            order, `header.size` rows in all.
        ids: int64 ids `(header.size,)`, in insertion order.
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        digest = hashlib.sha256()

        def put(data: bytes) -> None:
            digest.update(data)
            f.write(data)

        put(
            _HEADER.pack(
                MAGIC,
                VERSION,
                header.num_blocks,
                header.block_size,
                _FLAG_EXACT if header.exact else 0,
                header.size,
                header.code_size,
                header.shortlist or 0,
            )
        )
        for chunk in packed_chunks:
            put(np.ascontiguousarray(chunk, dtype=np.uint8).tobytes())
        put(np.asarray(ids).astype("<i8").tobytes())
        f.write(digest.digest())


def read(path: str | os.PathLike) -> tuple[Header, np.ndarray, np.ndarray]:
    """Reads and verifies an index file.

    Returns:
        `(header, packed, ids)`: packed codes `(n, code_size)` uint8 (a
        read-only view of the file's bytes, padding bits zero), and int64
        ids `(n,)`.

    Raises:
        ValueError: naming the path, if the file is not a SuBiC index, has an
            unsupported version, is truncated, fails its checksum, or holds
            non-zero padding bits or negative or repeated ids.
    """
    path = os.fspath(path)

    def fail(reason: str) -> ValueError:
        return ValueError(f"{path!r} is not a valid SuBiC index file: {reason}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw_header = f.read(_HEADER.size)
        if len(raw_header) < len(MAGIC) or raw_header[: len(MAGIC)] != MAGIC:
            raise fail(f"missing magic bytes {MAGIC!r}")
        if len(raw_header) < _HEADER.size:
            raise fail(f"truncated header ({size} bytes)")
        _, version, m, k, flags, n, code_size, shortlist = _HEADER.unpack(raw_header)
        if version != VERSION:
            raise fail(
                f"format version {version} is not supported (this code "
                f"reads version {VERSION})"
            )
        if not (1 <= m and 2 <= k <= MAX_BLOCK_SIZE and not k & (k - 1)):
            raise fail(f"invalid block shape num_blocks={m}, block_size={k}")
        header = Header(m, k, bool(flags & _FLAG_EXACT), int(n), shortlist or None)
        if code_size != header.code_size or flags & ~_FLAG_EXACT:
            raise fail(f"inconsistent header: code_size={code_size}, flags={flags}")
        expected = _HEADER.size + n * (code_size + 8) + _DIGEST_SIZE
        if size != expected:
            raise fail(
                f"size is {size} bytes, the header announces {expected} "
                f"({n} items); the file is truncated or has trailing data"
            )
        body = f.read(expected - _HEADER.size)
    if len(body) != expected - _HEADER.size:
        raise fail("the file changed while it was read")
    digest = hashlib.sha256(raw_header)
    digest.update(memoryview(body)[:-_DIGEST_SIZE])
    if digest.digest() != body[-_DIGEST_SIZE:]:
        raise fail("checksum mismatch (the file is corrupted)")
    packed = np.frombuffer(body, dtype=np.uint8, count=n * code_size)
    packed = packed.reshape(n, code_size)
    used = (m * header.nbits) % 8
    if n and used and np.any(packed[:, -1] >> used):
        # `write` stores zeros there; other bits would decode to other codes
        # depending on the engine, so they are refused rather than dropped.
        bad = int(np.count_nonzero(packed[:, -1] >> used))
        raise fail(f"{bad} codes have non-zero padding bits")
    ids = np.frombuffer(body, dtype="<i8", count=n, offset=n * code_size)
    ids = ids.astype(np.int64)
    if n and (int(ids.min()) < 0 or duplicates(ids).size):
        raise fail("ids are negative or repeated")
    return header, packed, ids
