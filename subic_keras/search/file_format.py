"""The `.subic` index file: a versioned, checksummed, pickle-free layout.

Version 1, little-endian (an index of codes and ids):

    offset  size          field
    0       8             magic b"SUBICIDX"
    8       4   uint32    format version (1)
    12      4   uint32    M, num_blocks
    16      4   uint32    K, block_size (a power of two)
    20      4   uint32    flags: bit 0 was set by writers of an exact scan
                          (read and ignored); other bits must be 0
    24      8   uint64    n, number of items
    32      4   uint32    code_size = ceil(M * log2(K) / 8)
    36      4   uint32    shortlist (0 = default)
    40      n*code_size   codes, each M blocks of log2(K) bits packed least
                          significant bit first (faiss's bit-string layout),
                          unused trailing bits zero
    ...     8*n  int64    ids, in insertion order
    ...     32            SHA-256 of every byte before it

Version 2 (an index of image files, `ImageIndex`) is version 1 with an item
table between the ids and the checksum:

    size          field
    8   uint64    J, bytes of the metadata
    J             metadata: a UTF-8 JSON object (the image folder, the
                  model's input shape)
    8*n uint64    fingerprints of the items' pixels, in insertion order
    8   uint64    P, bytes of the path table
    P             n paths relative to the folder, UTF-8, each followed by
                  a NUL byte, in insertion order

Version 3 holds metadata in every file, and the item table where header
flag bit 1 is set (an index of image files); after the ids:

    size          field
    8   uint64    J, bytes of the metadata
    J             metadata: a UTF-8 JSON object (the model that wrote the
                  codes; for image files also the folder and input shape)
    with flag bit 1 only:
    8*n uint64    fingerprints of the items' pixels, in insertion order
    8   uint64    P, bytes of the path table
    P             n paths, as in version 2
    8*n float64   when each item was added, seconds since 1970 (0: unknown)
    8   uint64    A, bytes of the attributes
    A             a UTF-8 JSON array of n values, each null or a flat
                  object of the item's attributes (`items.check_attributes`)

Version 4 is version 3 with each item's *look* where header flag bit 2
is set, after everything else: a descriptor of the picture that earlier
versions ordered tie groups by, since retired for the instance code.
Files that hold looks are still read, the looks checked and dropped:

    size          field
    n*D int8      the looks, in insertion order
    8   uint64    D, bytes of one look (at most 4096), last so that it is
                  found from the end

Version 5 is version 4 with the grouping of the items' equal codes
(`native.group_equal`'s: what the native scan scores once per distinct
code) where header flag bit 3 is set, after everything else, so that a
loaded index is searched at once instead of first finding it:

    size          field
    4*n     uint32  members: the items of each distinct code in increasing
                    positions, distinct code after distinct code, in the
                    order of their first items
    4*(G+1) uint32  starts: distinct code `r` holds the items
                    `members[starts[r]:starts[r+1]]`
    8       uint64  G, the number of distinct codes, last

Version 6 is version 5 with a second code of every item, an instance code
(`ImageIndex`'s, beside its class code), where header flag bit 4 is set,
after everything else:

    size          field
    n*S     bytes   the instance codes, packed as the codes are, in the
                    items' order (`S = ceil(M' * log2(K') / 8)`)
    4       uint32  M', their blocks
    4       uint32  K', their block size (a power of two), last

`read` checks every grouping it reads (a permutation of the items, each
group's codes equal, in canonical order), so a crafted one cannot make the
scan read out of bounds or rank wrongly. Where codes hardly repeat, or an
index holds 2**32 items or more, no grouping is written.

`write` writes version 1 when it is given neither metadata nor an item
table, version 6 with instance codes, version 5 with a grouping, and
version 3 otherwise (never looks); `read` reads all six (a version 2
file's items were added at an unknown time, 0, and have no attributes;
files before version 5 are grouped on their first search).

`read` checks the size and the checksum before any byte reaches faiss, so a
truncated or corrupted file raises `ValueError` naming the path. `write`
writes to a temporary file beside the destination and renames it into place,
so the destination is never half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Iterable

import numpy as np

from subic_keras._io import atomic_path
from subic_keras._validation import load_json
from subic_keras.data.paths import open_in_folder, open_regular
from subic_keras.search import packing
from subic_keras.search.checks import MAX_BLOCK_SIZE, duplicates
from subic_keras.search.native import checked_groups

MAGIC = b"SUBICIDX"
VERSION = 1
VERSION_WITH_PATHS = 2
VERSION_WITH_ITEMS = 3
VERSION_WITH_LOOKS = 4
VERSION_WITH_GROUPS = 5
VERSION_WITH_INSTANCE = 6
_VERSIONS = (
    VERSION,
    VERSION_WITH_PATHS,
    VERSION_WITH_ITEMS,
    VERSION_WITH_LOOKS,
    VERSION_WITH_GROUPS,
    VERSION_WITH_INSTANCE,
)
# Members and starts are stored as uint32.
MAX_GROUPED_ITEMS = 2**32 - 1
# magic, version, M, K, flags, n, code_size, shortlist
_HEADER = struct.Struct("<8sIIIIQII")
_CHUNK = 1 << 20  # bytes read at a time to verify a file
_DIGEST_SIZE = 32
_FLAG_EXACT = 1
_FLAG_ITEMS = 2
_FLAG_LOOKS = 4
_FLAG_GROUPS = 8
_FLAG_INSTANCE = 16
# The longest look a version 4 file may hold (what its writers allowed).
_MAX_LOOK_SIZE = 4096
_LENGTH = struct.Struct("<Q")
_SHAPE = struct.Struct("<II")


@dataclasses.dataclass(frozen=True)
class Header:
    """The settings an index file records."""

    num_blocks: int
    block_size: int
    size: int
    shortlist: int | None

    @property
    def nbits(self) -> int:
        return self.block_size.bit_length() - 1

    @property
    def code_size(self) -> int:
        return packing.code_size(self.num_blocks, self.nbits)


@dataclasses.dataclass(frozen=True)
class Items:
    """What versions 2 to 6 record beside the codes and ids: metadata, and
    of each item (an index of image files; None otherwise) its path,
    fingerprint, time added and attributes, the grouping of equal codes
    (version 5; None otherwise), and its instance code (version 6:
    `(M', K', packed)`, the packed codes `(n, S)` uint8; None otherwise).
    `earlier_looks` says a file held looks, read past (version 4)."""

    metadata: dict
    paths: list[str] | None = None
    fingerprints: np.ndarray | None = None  # uint64 (n,)
    added: np.ndarray | None = None  # float64 (n,)
    attributes: list[dict | None] | None = None
    groups: tuple[np.ndarray, np.ndarray] | None = None  # int64 starts, members
    instance: tuple[int, int, np.ndarray] | None = None
    earlier_looks: bool = False


def write(
    path: str | os.PathLike,
    header: Header,
    packed_chunks: Iterable[np.ndarray],
    ids: np.ndarray,
    items: Items | None = None,
) -> None:
    """Writes an index file atomically.

    Args:
        path: destination; replaced only once fully written.
        header: the index's settings; `header.size` items follow.
        packed_chunks: packed codes `(rows, code_size)` uint8, in insertion
            order, `header.size` rows in all.
        ids: int64 ids `(header.size,)`, in insertion order.
        items: the metadata and item table of version 3 (item columns in
            insertion order, or None for metadata alone), the grouping of
            version 5 and the instance codes of version 6; `None` writes
            version 1.
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        digest = hashlib.sha256()

        def put(data: bytes) -> None:
            digest.update(data)
            f.write(data)

        groups = None if items is None else items.groups
        if header.size > MAX_GROUPED_ITEMS:
            groups = None
        flags, version = 0, VERSION_WITH_ITEMS
        if items is not None and items.paths is not None:
            flags |= _FLAG_ITEMS
        if groups is not None:
            flags, version = flags | _FLAG_GROUPS, VERSION_WITH_GROUPS
        instance = None if items is None else items.instance
        if instance is not None:
            flags, version = flags | _FLAG_INSTANCE, VERSION_WITH_INSTANCE
        put(
            _HEADER.pack(
                MAGIC,
                VERSION if items is None else version,
                header.num_blocks,
                header.block_size,
                flags,
                header.size,
                header.code_size,
                header.shortlist or 0,
            )
        )
        for chunk in packed_chunks:
            put(np.ascontiguousarray(chunk, dtype=np.uint8).tobytes())
        put(np.asarray(ids).astype("<i8").tobytes())
        if items is not None:
            metadata = json.dumps(items.metadata, sort_keys=True).encode()
            put(_LENGTH.pack(len(metadata)) + metadata)
        if items is not None and items.paths is not None:
            put(np.asarray(items.fingerprints).astype("<u8").tobytes())
            table = b"".join(p.encode() + b"\0" for p in items.paths)
            put(_LENGTH.pack(len(table)) + table)
            put(np.asarray(items.added).astype("<f8").tobytes())
            attributes = json.dumps(items.attributes, sort_keys=True).encode()
            put(_LENGTH.pack(len(attributes)) + attributes)
        if groups is not None:
            starts, members = groups
            put(np.asarray(members).astype("<u4").tobytes())
            put(np.asarray(starts).astype("<u4").tobytes())
            put(_LENGTH.pack(len(starts) - 1))
        if instance is not None:
            num_blocks, block_size, packed = instance
            put(np.ascontiguousarray(packed, dtype=np.uint8).tobytes())
            put(_SHAPE.pack(num_blocks, block_size))
        f.write(digest.digest())


def _checksum(f, raw_header: bytes, expected: int) -> bytes:
    """SHA-256 of the header and the body up to the stored digest, read from
    `f` (placed after the header) a chunk at a time."""
    digest = hashlib.sha256(raw_header)
    remaining = expected - _HEADER.size - _DIGEST_SIZE
    while remaining:
        chunk = f.read(min(_CHUNK, remaining))
        if not chunk:
            break  # shorter than announced: the digest cannot match
        digest.update(chunk)
        remaining -= len(chunk)
    return digest.digest()


def recorded_metadata(path: str | os.PathLike) -> dict | None:
    """An index file's metadata (version 3 on), read without reading the
    codes or verifying the file: for a check before anything loads (`read`
    verifies the file when it is opened). None when there is none, or the
    file is not one to read so."""
    try:
        with open(open_regular(path), "rb") as f:
            magic, version, _, _, _, n, code_size, _ = _HEADER.unpack(
                f.read(_HEADER.size)
            )
            if magic != MAGIC or version not in _VERSIONS[2:]:
                return None
            f.seek(_HEADER.size + n * (code_size + 8))
            (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
            if length > 1 << 20:
                return None
            metadata = load_json(f.read(length))
    except (OSError, ValueError, struct.error, OverflowError):
        return None
    return metadata if isinstance(metadata, dict) else None


def read(
    path: str | os.PathLike, *, folder: str | None = None
) -> tuple[Header, np.ndarray, np.ndarray, Items | None]:
    """Reads and verifies an index file of either version.

    Args:
        path: the file.
        folder: a real folder the file must lie in (a shard manifest's):
            opened by `paths.open_in_folder`, which refuses on the opened
            descriptor a link that leads out of it.

    Returns:
        `(header, packed, ids, items)`: packed codes `(n, code_size)` uint8
        (a read-only view of the file's bytes, padding bits zero), int64
        ids `(n,)`, and the item table of a version 2 file (`None` for
        version 1).

    Raises:
        ValueError: naming the path, if the file is not a SuBiC index, has an
            unsupported version, is truncated, fails its checksum, or holds
            non-zero padding bits, negative or repeated ids, or an item table
            that does not match its items.
    """
    path = os.fspath(path)

    def fail(reason: str) -> ValueError:
        return ValueError(f"{path!r} is not a valid SuBiC index file: {reason}")

    # Opened without blocking and refused unless a regular file: a FIFO or a
    # device put in an index file's place would hang a reader for good.
    if folder is None:
        fd = open_regular(path)
    else:
        fd = open_in_folder(folder, os.path.relpath(path, folder))
    with open(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw_header = f.read(_HEADER.size)
        if len(raw_header) < len(MAGIC) or raw_header[: len(MAGIC)] != MAGIC:
            raise fail(f"missing magic bytes {MAGIC!r}")
        if len(raw_header) < _HEADER.size:
            raise fail(f"truncated header ({size} bytes)")
        _, version, m, k, flags, n, code_size, shortlist = _HEADER.unpack(raw_header)
        if version not in _VERSIONS:
            raise fail(
                f"format version {version} is not supported (this code "
                f"reads versions {', '.join(map(str, _VERSIONS))})"
            )
        if not (1 <= m and 2 <= k <= MAX_BLOCK_SIZE and not k & (k - 1)):
            raise fail(f"invalid block shape num_blocks={m}, block_size={k}")
        header = Header(m, k, int(n), shortlist or None)
        if code_size != header.code_size or flags & ~_known_flags(version):
            raise fail(f"inconsistent header: code_size={code_size}, flags={flags}")
        with_items = version == VERSION_WITH_PATHS or bool(flags & _FLAG_ITEMS)
        expected = _least_size(version, flags, n, code_size, with_items)
        if version != VERSION:
            if size < expected:
                raise fail(
                    f"size is {size} bytes, the header announces at least "
                    f"{expected} ({n} items); the file is truncated"
                )
            expected = size
        if size != expected:
            raise fail(
                f"size is {size} bytes, the header announces {expected} "
                f"({n} items); the file is truncated or has trailing data"
            )
        # Verified in chunks before anything is allocated for it: a file
        # that only claims to be large (sparse, or corrupted) costs no memory.
        if _checksum(f, raw_header, expected) != f.read(_DIGEST_SIZE):
            raise fail("checksum mismatch (the file is corrupted)")
        f.seek(_HEADER.size)
        try:
            body = bytearray(expected - _HEADER.size)
        except MemoryError:
            raise MemoryError(
                f"not enough memory to load {path!r}: its {n} items take "
                f"{expected / 1e9:.2f} GB"
            ) from None
        if f.readinto(body) != len(body):
            raise fail("the file changed while it was read")
    digest = hashlib.sha256(raw_header)
    digest.update(memoryview(body)[:-_DIGEST_SIZE])
    if digest.digest() != body[-_DIGEST_SIZE:]:
        raise fail("the file changed while it was read")
    packed = np.frombuffer(body, dtype=np.uint8, count=n * code_size)
    packed = packed.reshape(n, code_size)
    packed.flags.writeable = False
    used = (m * header.nbits) % 8
    if n and used and np.any(packed[:, -1] >> used):
        # `write` stores zeros there; other bits would decode to other codes
        # depending on the scanner, so they are refused rather than dropped.
        bad = int(np.count_nonzero(packed[:, -1] >> used))
        raise fail(f"{bad} codes have non-zero padding bits")
    ids = np.frombuffer(body, dtype="<i8", count=n, offset=n * code_size)
    ids = ids.astype(np.int64)
    if n and (int(ids.min()) < 0 or duplicates(ids).size):
        raise fail("ids are negative or repeated")
    items = None
    if version != VERSION:
        try:
            items = _read_items(
                body,
                n * (code_size + 8),
                len(body) - _DIGEST_SIZE,
                n,
                version,
                with_items,
                bool(flags & _FLAG_LOOKS),
                bool(flags & _FLAG_GROUPS),
                bool(flags & _FLAG_INSTANCE),
            )
            if items.groups is not None:
                items = dataclasses.replace(
                    items, groups=checked_groups(packed, *items.groups)
                )
        except ValueError as error:
            raise fail(str(error)) from None
    return header, packed, ids, items


def _known_flags(version: int) -> int:
    """The flags a file of `version` may set."""
    known = _FLAG_EXACT
    if version >= VERSION_WITH_ITEMS:
        known |= _FLAG_ITEMS
    if version >= VERSION_WITH_LOOKS:
        known |= _FLAG_LOOKS
    if version >= VERSION_WITH_GROUPS:
        known |= _FLAG_GROUPS
    if version >= VERSION_WITH_INSTANCE:
        known |= _FLAG_INSTANCE
    return known


def _least_size(version, flags, n, code_size, with_items: bool) -> int:
    """The size of a file of `n` items: exact for version 1, at the least
    (the metadata's length, the item table's lengths and fixed-size
    columns) for the others."""
    expected = _HEADER.size + n * (code_size + 8) + _DIGEST_SIZE
    if version == VERSION:
        return expected
    expected += _LENGTH.size
    if with_items:
        expected += _LENGTH.size + 8 * n
    if with_items and version >= VERSION_WITH_ITEMS:
        expected += _LENGTH.size + 8 * n
    if flags & _FLAG_LOOKS:
        expected += _LENGTH.size + n
    if flags & _FLAG_GROUPS:
        expected += _LENGTH.size + 4 * n + 4
    if flags & _FLAG_INSTANCE:
        expected += _SHAPE.size
    return expected


def _read_items(
    body: bytes | bytearray,
    start: int,
    end: int,
    n: int,
    version: int,
    with_items: bool,
    with_looks: bool = False,
    with_groups: bool = False,
    with_instance: bool = False,
) -> Items:
    """The item table in `body[start:end]`, every length checked first (a
    grouping is returned as stored, for `native.checked_groups`)."""
    groups = instance = None
    if with_instance:  # the last section, its shape at its end
        instance, end = _read_instance(body, start, end, n)
    if with_groups:  # the last section, its count at its end
        if end - start < _LENGTH.size:
            raise ValueError("the grouping of equal codes is truncated")
        end -= _LENGTH.size
        (distinct,) = _LENGTH.unpack_from(body, end)
        if not 1 <= distinct <= n or 4 * (n + distinct + 1) > end - start:
            raise ValueError(
                f"a grouping of {distinct} distinct codes overruns the file"
            )
        end -= 4 * (distinct + 1)
        starts = np.frombuffer(body, "<u4", count=distinct + 1, offset=end)
        end -= 4 * n
        groups = (starts, np.frombuffer(body, "<u4", count=n, offset=end))
    if with_looks:  # the last section, its size at its end: read past
        if end - start < _LENGTH.size:
            raise ValueError("the looks are truncated")
        end -= _LENGTH.size
        (size,) = _LENGTH.unpack_from(body, end)
        if not 1 <= size <= _MAX_LOOK_SIZE or size * n > end - start:
            raise ValueError(f"looks of {size} bytes each overrun the file")
        end -= size * n

    def section(offset: int) -> tuple[bytes | bytearray, int]:
        if end - offset < _LENGTH.size:
            raise ValueError("the item table is truncated")
        (length,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if length > end - offset:
            raise ValueError(f"a section of {length} bytes overruns the file")
        return body[offset : offset + length], offset + length

    raw_metadata, offset = section(start)
    try:
        metadata = load_json(raw_metadata)
    except ValueError as error:
        raise ValueError(f"metadata is not valid JSON ({error})") from None
    if not isinstance(metadata, dict):
        raise ValueError("metadata is not a JSON object")
    if not with_items:
        if offset != end:
            raise ValueError(
                f"{end - offset} bytes of trailing data after the metadata"
            )
        return Items(
            metadata, groups=groups, instance=instance, earlier_looks=with_looks
        )
    if end - offset < 8 * n + _LENGTH.size:
        raise ValueError("the fingerprints are truncated")
    fingerprints = np.frombuffer(body, dtype="<u8", count=n, offset=offset)
    table, offset = section(offset + 8 * n)
    if n != table.count(b"\0") or (n and not table.endswith(b"\0")):
        raise ValueError(f"the path table does not hold {n} paths")
    try:
        paths = table.decode().split("\0")[:-1] if n else []
    except UnicodeDecodeError as error:
        raise ValueError(f"paths are not UTF-8 ({error})") from None
    if len(set(paths)) != len(paths):
        raise ValueError("paths are repeated")
    added = np.zeros(n, np.float64)
    attributes: list = [None] * n
    if version >= VERSION_WITH_ITEMS:
        if end - offset < 8 * n:
            raise ValueError("the times added are truncated")
        added = np.frombuffer(body, dtype="<f8", count=n, offset=offset).astype(
            np.float64
        )
        if not np.isfinite(added).all():
            raise ValueError("the times added are not finite")
        raw_attributes, offset = section(offset + 8 * n)
        try:
            attributes = load_json(raw_attributes)
        except ValueError as error:
            raise ValueError(f"attributes are not valid JSON ({error})") from None
        if not isinstance(attributes, list) or len(attributes) != n:
            raise ValueError(f"attributes are not a JSON array of {n} values")
    if offset != end:
        raise ValueError(f"{end - offset} bytes of trailing data after the items")
    return Items(
        metadata,
        paths,
        fingerprints.astype(np.uint64),
        added,
        attributes,
        groups,
        instance,
        with_looks,
    )


def _read_instance(
    body: bytes | bytearray, start: int, end: int, n: int
) -> tuple[tuple[int, int, np.ndarray], int]:
    """The instance codes that end at `body[end]`, checked as the codes are
    (block shape, size, zero padding bits), and where the sections before
    them end."""
    if end - start < _SHAPE.size:
        raise ValueError("the instance codes are truncated")
    end -= _SHAPE.size
    num_blocks, block_size = _SHAPE.unpack_from(body, end)
    if not (
        1 <= num_blocks <= 1 << 16
        and 2 <= block_size <= MAX_BLOCK_SIZE
        and not block_size & (block_size - 1)
    ):
        raise ValueError(
            f"invalid instance code shape num_blocks={num_blocks}, "
            f"block_size={block_size}"
        )
    nbits = block_size.bit_length() - 1
    size = packing.code_size(num_blocks, nbits)
    if size * n > end - start:
        raise ValueError(f"instance codes of {size} bytes each overrun the file")
    end -= size * n
    packed = np.frombuffer(body, np.uint8, count=size * n, offset=end)
    packed = packed.reshape(n, size)
    used = (num_blocks * nbits) % 8
    if n and used and np.any(packed[:, -1] >> used):
        raise ValueError("instance codes have non-zero padding bits")
    return (num_blocks, block_size, packed), end
