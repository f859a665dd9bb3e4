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
    bad[8:12] = struct.pack("<I", 5)
    with pytest.raises(ValueError, match="version 5 is not supported"):
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

    def broken(positions):
        raise OSError("disk full (simulated)")

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
