"""Tests for subic_keras.search.file_format through save and load."""

import hashlib
import os
import struct

import numpy as np
import pytest
from search_reference import (
    random_codes,
)

from subic_keras.search import (
    SubicIndex,
    file_format,
    native,
)


@pytest.fixture(autouse=True)
def scanner():
    """One run: the file holds codes and ids, whatever scans them (the
    round trip names its scanners)."""
    return None


# Persistence -------------------------------------------------------------


@pytest.mark.parametrize(
    "num_blocks, block_size, kwargs",
    [
        (8, 256, {}),
        (5, 16, {"scanner": "faiss-fastscan", "shortlist": 90}),
        (5, 16, {"scanner": "faiss"}),
        (3, 64, {}),
    ],
)
def test_save_load_round_trip(rng, tmp_path, num_blocks, block_size, kwargs):
    codes = random_codes(rng, 700, num_blocks, block_size)
    index = SubicIndex(num_blocks, block_size, add_chunk_size=64, **kwargs)
    index.add(codes, ids=rng.permutation(10_000)[:700])
    index.remove(index.get_ids()[::5])
    path = tmp_path / "index.subic"
    index.save(path)
    assert path.stat().st_size == 40 + len(index) * (index.code_size + 8) + 32
    with open(path, "rb") as f:
        assert f.read(8) == b"SUBICIDX"
    loaded = SubicIndex.load(str(path), scanner=index.scanner, add_chunk_size=50)
    assert (loaded.scanner, loaded.shortlist) == (index.scanner, index.shortlist)
    np.testing.assert_array_equal(loaded.get_ids(), index.get_ids())
    np.testing.assert_array_equal(loaded.get_codes(), index.get_codes())
    queries = rng.random((5, num_blocks * block_size)).astype(np.float32)
    for a, b in zip(loaded.search(queries, 12), index.search(queries, 12)):
        np.testing.assert_array_equal(a, b)
    assert not [p for p in os.listdir(tmp_path) if p != "index.subic"]
    new_id = loaded.add(codes[:1])
    np.testing.assert_array_equal(new_id, [index.get_ids().max() + 1])


def test_the_model_record_is_loaded_by_every_way_of_opening(tmp_path):
    from subic_keras.search import open as open_index

    index = SubicIndex(4, 16)
    index.add(np.zeros((3, 4), int))
    index.model = {"digest": "c" * 64, "file": "best.keras"}
    index.save(tmp_path / "m.subic")
    for loaded in (
        SubicIndex.load(tmp_path / "m.subic"),
        open_index(tmp_path / "m.subic"),
    ):
        assert loaded.model == index.model


def test_a_scanner_this_machine_lacks_is_not_the_files_fault(tmp_path):
    SubicIndex(4, 16).save(tmp_path / "good")
    with pytest.raises(ValueError, match="^scanner must be one of auto"):
        SubicIndex.load(tmp_path / "good", scanner="fast")


def test_save_load_empty_index(tmp_path):
    SubicIndex(4, 16).save(tmp_path / "empty")
    loaded = SubicIndex.load(tmp_path / "empty")
    assert len(loaded) == 0 and loaded.scanner == SubicIndex(4, 16).scanner


@pytest.fixture
def saved(rng, tmp_path):
    index = SubicIndex(4, 64)
    index.add(random_codes(rng, 50, 4, 64))
    path = tmp_path / "good.subic"
    index.save(path)
    return index, path, path.read_bytes()


def _rewrite(path, data):
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("cut", [0, 5, 39, 40, 200, -33, -1])
def test_truncated_file_raises_naming_path(saved, cut):
    _, path, data = saved
    _rewrite(path, data[:cut] if cut else b"")
    with pytest.raises(ValueError, match=r"good\.subic"):
        SubicIndex.load(path)


@pytest.mark.parametrize("offset", [45, 300, -40, -3])
def test_bit_flip_fails_checksum(saved, offset):
    _, path, data = saved
    data = bytearray(data)
    data[offset] ^= 0x10
    _rewrite(path, data)
    with pytest.raises(ValueError, match="checksum"):
        SubicIndex.load(path)


def test_header_problems_raise(saved, tmp_path):
    index, path, data = saved
    bad = bytearray(data)
    bad[:8] = b"NOTANIDX"
    with pytest.raises(ValueError, match="magic"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[8:12] = struct.pack("<I", 7)
    with pytest.raises(ValueError, match="version 7 is not supported"):
        SubicIndex.load(_rewrite(path, bad))
    # Version 2 announces an item table after the ids: without one, the
    # file is too short for what its header says.
    bad = bytearray(data)
    bad[8:12] = struct.pack("<I", 2)
    with pytest.raises(ValueError, match="announces at least .* truncated"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[16:20] = struct.pack("<I", 48)
    with pytest.raises(ValueError, match="block shape"):
        SubicIndex.load(_rewrite(path, bad))
    bad = bytearray(data)
    bad[24:32] = struct.pack("<Q", 10**15)  # huge n: rejected before reading
    with pytest.raises(ValueError, match="truncated"):
        SubicIndex.load(_rewrite(path, bad))
    # A well-formed file (valid checksum) announcing an absurd block shape.
    header = struct.pack("<8sIIIIQII", b"SUBICIDX", 1, 10**6, 256, 1, 0, 10**6, 0)
    crafted = header + hashlib.sha256(header).digest()
    with pytest.raises(ValueError, match=r"good\.subic.*too large"):
        SubicIndex.load(_rewrite(path, crafted))
    text = tmp_path / "notes.txt"
    text.write_text("not an index at all, just some text " * 5)
    with pytest.raises(ValueError, match=r"notes\.txt"):
        SubicIndex.load(text)
    with pytest.raises(ValueError, match="trailing"):
        SubicIndex.load(_rewrite(path, data + b"\0"))
    # The in-memory index is untouched by failed loads.
    assert len(index) == 50


def test_nonzero_padding_bits_are_refused(rng, tmp_path):
    index = SubicIndex(3, 8)  # 9 bits: 7 padding bits in each code's 2nd byte
    index.add(random_codes(rng, 5, 3, 8))
    path = tmp_path / "padded.subic"
    index.save(path)
    data = bytearray(path.read_bytes())
    header_size, code_size = 40, 2
    data[header_size + code_size - 1] |= 0x80  # the first code's last bit
    data[-32:] = hashlib.sha256(bytes(data[:-32])).digest()  # checksum still valid
    with pytest.raises(ValueError, match=r"padded\.subic.*1 codes have non-zero"):
        SubicIndex.load(_rewrite(path, data))


def test_failed_save_keeps_previous_file(saved, monkeypatch):
    index, path, data = saved
    index.add(np.zeros((1, 4), dtype=int))

    whole = index._store.packed

    def broken(positions=slice(None)):
        if positions == slice(None):  # the grouping, found before writing
            return whole()
        raise OSError("disk full (simulated)")  # a chunk, being written

    monkeypatch.setattr(index._store, "packed", broken)
    with pytest.raises(OSError, match="disk full"):
        index.save(path)
    assert path.read_bytes() == data
    assert os.listdir(path.parent) == ["good.subic"]


@pytest.mark.slow
def test_a_sparse_file_claiming_gigabytes_costs_no_memory(tmp_path):
    """A file whose header and size announce 2.5 GB of codes, all zeros (a
    sparse file): refused by its checksum under a 4 GB address-space limit,
    without allocating its body; the command line says so in one line."""
    import subprocess
    import sys

    from subic_keras.search import file_format

    n = 2_500_000_000 // (1 + 8)  # M = 4, K = 4: one byte of code and an id
    path = tmp_path / "sparse.subic"
    with open(path, "wb") as handle:
        handle.write(file_format._HEADER.pack(b"SUBICIDX", 1, 4, 4, 0, n, 1, 0))
        handle.truncate(file_format._HEADER.size + n * 9 + 32)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from subic_keras.search import file_format\n"
        "try:\n"
        f"    file_format.read({str(path)!r})\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        # VmHWM: this process's own peak (ru_maxrss would count the parent's,
        # shared until exec when Python spawns with vfork).
        "print(next(line.split()[1] for line in open('/proc/self/status') "
        "if line.startswith('VmHWM')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    message, peak_kb = done.stdout.strip().splitlines()
    assert "checksum mismatch" in message
    assert int(peak_kb) < 500_000  # the 2.5 GB body was never allocated


# The grouping of equal codes (version 5) --------------------------------


def _repeating_codes(rng, n=600, distinct=40, num_blocks=6, block_size=64):
    return random_codes(rng, distinct, num_blocks, block_size)[
        rng.integers(0, distinct, n)
    ]


@pytest.mark.skipif(not native.kernels(), reason="the native scan is not built")
@pytest.mark.parametrize("scanner", [None, "faiss"])
def test_a_file_keeps_the_grouping_and_a_load_needs_no_regrouping(
    rng, tmp_path, monkeypatch, scanner
):
    codes = _repeating_codes(rng)
    index = SubicIndex(6, 64, **({"scanner": scanner} if scanner else {}))
    index.add(codes, ids=rng.permutation(5_000)[:600])
    index.remove(index.get_ids()[::7])
    index.save(tmp_path / "g.subic")
    header = (tmp_path / "g.subic").read_bytes()[:40]
    version, flags = header[8], header[20]
    assert (version, flags) == (5, 8)  # version 5, flag bit 3 alone
    _, _, _, items = file_format.read(tmp_path / "g.subic")
    expected = native.group_equal(index._store.packed())
    np.testing.assert_array_equal(items.groups[0], expected[1])
    np.testing.assert_array_equal(items.groups[1], expected[2])

    def no_regrouping(rows):
        raise AssertionError("grouped again after loading")

    loaded = SubicIndex.load(tmp_path / "g.subic")
    queries = rng.random((4, 6 * 64)).astype(np.float32)
    with monkeypatch.context() as patch:
        patch.setattr(native, "group_equal", no_regrouping)
        found = loaded.search(queries, 20)
    fresh = SubicIndex(6, 64)
    fresh.add(index.get_codes(), ids=index.get_ids())
    for a, b in zip(found, fresh.search(queries, 20)):
        np.testing.assert_array_equal(a, b)
    # Changed after loading: grouped anew, still exact.
    loaded.add(codes[:30])
    loaded.remove(loaded.get_ids()[:50])
    fresh = SubicIndex(6, 64)
    fresh.add(loaded.get_codes(), ids=loaded.get_ids())
    for a, b in zip(loaded.search(queries, 20), fresh.search(queries, 20)):
        np.testing.assert_array_equal(a, b)


def test_codes_that_hardly_repeat_write_no_grouping(rng, tmp_path, monkeypatch):
    index = SubicIndex(6, 64)
    index.add(random_codes(rng, 300, 6, 64))
    index.save(tmp_path / "r.subic")
    assert (tmp_path / "r.subic").read_bytes()[8:12] == struct.pack("<I", 1)
    # Laid out when loaded all the same: the first search lays out nothing.
    loaded = SubicIndex.load(tmp_path / "r.subic")
    queries = rng.random((2, 6 * 64)).astype(np.float32)
    expected = index.search(queries, 5)

    def no_layout(*args):
        raise AssertionError("laid out on the first search")

    monkeypatch.setattr(type(loaded._scanner), "_lay_out", no_layout)
    for a, b in zip(loaded.search(queries, 5), expected):
        np.testing.assert_array_equal(a, b)


def _with_groups(data, n, starts, members):
    """`data` (a version 5 file of `n` items) with another grouping."""
    distinct = struct.unpack_from("<Q", data, len(data) - 40)[0]
    body = bytes(data[: len(data) - 40 - 4 * (n + distinct + 1)])
    body += np.asarray(members, "<u4").tobytes() + np.asarray(starts, "<u4").tobytes()
    body += struct.pack("<Q", len(starts) - 1)
    return body + hashlib.sha256(body).digest()


@pytest.mark.skipif(not native.kernels(), reason="the native scan is not built")
def test_a_crafted_grouping_is_refused(tmp_path):
    # Items 0, 2 and 4 share a code, 1 and 3 another.
    index = SubicIndex(2, 16)
    index.add(np.array([[1, 2], [3, 4], [1, 2], [3, 4], [1, 2]] * 4))
    path = tmp_path / "crafted.subic"
    index.save(path)
    data = path.read_bytes()
    starts, members = file_format.read(path)[3].groups
    n = len(members)
    np.testing.assert_array_equal(starts, [0, 12, 20])
    bad = {
        "beyond the codes": (starts, [*members[:-1], n]),
        # The last item, 19, twice, and 18 not at all.
        "every item once": (starts, [*members[:-1], 19]),
        "out of bounds": ([0, 12, 21], members),
        "increasing positions": ([0, 8, 20], [*members[12:], *members[:12]]),
        # Items 18 and 19 swapped between the groups.
        "different codes": (starts, [*members[:11], 18, *members[12:-1], 19]),
    }
    for reason, (s, m) in bad.items():
        path.write_bytes(_with_groups(data, n, s, m))
        with pytest.raises(ValueError, match=rf"crafted\.subic.*{reason}"):
            SubicIndex.load(path)
    path.write_bytes(_with_groups(data, n, [0, n], np.arange(n))[:-40] + b"")
    with pytest.raises(ValueError, match=r"crafted\.subic"):
        SubicIndex.load(path)
    # A count of groups the file cannot hold.
    forged = bytearray(_with_groups(data, n, starts, members))
    forged[-40:-32] = struct.pack("<Q", 10**12)
    forged[-32:] = hashlib.sha256(bytes(forged[:-32])).digest()
    path.write_bytes(bytes(forged))
    with pytest.raises(ValueError, match="overruns the file"):
        SubicIndex.load(path)


@pytest.mark.parametrize("kind", ["codes", "pictures", "pictures with instance codes"])
def test_looks_of_an_earlier_version_are_read_past(rng, tmp_path, kind):
    """Versions 4 to 6 kept a look of every item (flag bit 2); this one
    reads past them and searches by the codes alone, and a file saved
    again is the one it writes itself."""
    from earlier_files import add_looks

    from subic_keras.search import ImageIndex

    codes = _repeating_codes(rng)  # grouped: a section after the looks
    if kind == "codes":
        index = SubicIndex(6, 64)
        index.add(codes)
    else:
        instance = (4, 16) if "instance" in kind else None
        index = ImageIndex(6, 64, tmp_path, (8, 8, 3), instance=instance)
        more = {"instance_codes": rng.integers(0, 16, (600, 4))} if instance else {}
        index.add(codes, [f"a/{i}.png" for i in range(600)], **more)
    path = tmp_path / "x.subic"
    index.save(path)
    written = path.read_bytes()
    add_looks(path)
    assert path.read_bytes()[20] & 4 and len(path.read_bytes()) > len(written)
    loaded = type(index).load(path)
    assert loaded.written_with_looks and not index.written_with_looks
    queries = rng.random((3, 6 * 64)).astype(np.float32)
    for a, b in zip(loaded.search(queries, 30), index.search(queries, 30)):
        np.testing.assert_array_equal(a, b)
    loaded.save(path)
    assert path.read_bytes() == written


def test_crafted_looks_of_an_earlier_version_are_refused(rng, tmp_path):
    from earlier_files import add_looks

    index = SubicIndex(2, 4)
    index.add(np.stack(np.divmod(np.arange(10), 4), 1))  # distinct: no grouping
    index.model = {"digest": "0" * 64, "path": None, "file": None}
    path = tmp_path / "x.subic"
    index.save(path)
    add_looks(path, size=108)
    body = bytearray(path.read_bytes()[:-32])
    for size in (0, 2**40, 200, 4097):
        crafted = body[:-8] + size.to_bytes(8, "little")
        path.write_bytes(bytes(crafted) + hashlib.sha256(crafted).digest())
        with pytest.raises(ValueError, match="looks of .* bytes each overrun"):
            SubicIndex.load(path)
