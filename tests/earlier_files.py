"""Index files as earlier versions wrote them, for the tests that read them."""

import hashlib
import struct

import numpy as np

_HEADER = struct.Struct("<8sIIIIQII")  # magic, version, M, K, flags, n, size, shortlist
_LOOKS, _GROUPS, _INSTANCE = 4, 8, 16


def add_looks(path, size: int = 108, seed: int = 0) -> None:
    """Rewrites the `.subic` file at `path` with a look of `size` random
    bytes per item, where versions 4 to 6 put them (after the item table,
    before a grouping and instance codes), header flag bit 2 set and the
    checksum made again: a file of an earlier version that kept looks."""
    data = bytearray(open(path, "rb").read()[:-32])
    _, version, _, _, flags, n, _, _ = _HEADER.unpack_from(data)
    assert version >= 3 and not flags & _LOOKS, (version, flags)
    end = len(data)
    if flags & _INSTANCE:  # packed codes, then M' and K' (uint32 each)
        m, k = struct.unpack_from("<II", data, end - 8)
        end -= 8 + n * -(-m * (k.bit_length() - 1) // 8)
    if flags & _GROUPS:  # members, starts, then the count of groups
        (groups,) = struct.unpack_from("<Q", data, end - 8)
        end -= 8 + 4 * (groups + 1) + 4 * n
    looks = np.random.default_rng(seed).integers(-127, 128, (n, size), np.int8)
    data[end:end] = looks.tobytes() + struct.pack("<Q", size)
    struct.pack_into("<I", data, 8, max(version, 4))
    struct.pack_into("<I", data, 20, flags | _LOOKS)
    data += hashlib.sha256(data).digest()
    with open(path, "wb") as f:
        f.write(data)
