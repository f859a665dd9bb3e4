import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from swapping import outside_folder

from subic_keras._io import (
    TEMPORARY_MARK,
    atomic_directory,
    atomic_path,
    remove_stale_temporaries,
)
from subic_keras.search import SubicIndex


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_path_writes_with_ordinary_permissions(tmp_path):
    target = tmp_path / "out.json"
    with atomic_path(target) as tmp:
        with open(tmp, "w") as handle:
            handle.write("{}")
        assert not target.exists()
    assert target.read_text() == "{}"
    mask = os.umask(0)
    os.umask(mask)
    assert _mode(target) == 0o666 & ~mask
    assert os.listdir(tmp_path) == ["out.json"]


def test_atomic_path_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "index.subic"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        with open(tmp, "w") as handle:
            handle.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["index.subic"]


def test_atomic_directory(tmp_path):
    target = tmp_path / "1"
    with atomic_directory(target) as tmp:
        (open(os.path.join(tmp, "saved_model.pb"), "w")).close()
    assert (target / "saved_model.pb").exists()
    mask = os.umask(0)
    os.umask(mask)
    assert _mode(target) == 0o777 & ~mask
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        with atomic_directory(target):
            pass
    with pytest.raises(RuntimeError), atomic_directory(target, overwrite=True) as tmp:
        raise RuntimeError("failed export")
    assert (target / "saved_model.pb").exists()
    assert sorted(os.listdir(tmp_path)) == ["1"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_gone_writers_are_removed(tmp_path):
    target = tmp_path / "db.subic"
    stale = tmp_path / f".db.subic{TEMPORARY_MARK}{_dead_pid()}-abc.tmp"
    live = tmp_path / f".db.subic{TEMPORARY_MARK}{os.getpid()}-def.tmp"
    other = tmp_path / f".other.subic{TEMPORARY_MARK}{_dead_pid()}-ghi.tmp"
    for path in (stale, live, other):
        path.write_text("partial")
    with atomic_path(target) as tmp, open(tmp, "w") as handle:
        handle.write("new")
    # Only the dead writer's temporary of this destination goes.
    assert sorted(os.listdir(tmp_path)) == sorted(["db.subic", live.name, other.name])


def test_directory_save_killed_midway_is_restored(tmp_path):
    # Killed after moving the old version aside, before moving the new one in.
    target = tmp_path / "1"
    old = tmp_path / f".1{TEMPORARY_MARK}{_dead_pid()}-xyz.old"
    old.mkdir()
    (old / "saved_model.pb").write_text("old")
    assert remove_stale_temporaries(target) == [old.name]
    assert (target / "saved_model.pb").read_text() == "old"


def test_a_link_planted_as_a_backup_is_removed_not_restored(tmp_path):
    """A link named as a killed save's backup of a version folder is not
    made the version (the export would write through it): it is removed,
    and what it points at is left alone."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("theirs")
    target = tmp_path / "1"
    planted = tmp_path / f".1{TEMPORARY_MARK}{_dead_pid()}-xyz.old"
    planted.symlink_to(elsewhere, target_is_directory=True)
    assert remove_stale_temporaries(target) == [planted.name]
    assert not os.path.lexists(target) and not os.path.lexists(planted)
    with atomic_directory(target) as tmp:
        (Path(tmp) / "saved_model.pb").write_text("new")
    assert not target.is_symlink() and (target / "saved_model.pb").exists()
    assert sorted(os.listdir(elsewhere)) == ["keep.txt"]


_SAVER = """
import os, sys
import numpy as np
from subic_keras._io import atomic_directory
from subic_keras.search import SubicIndex

path, folder = sys.argv[1], sys.argv[2]
versions = []
for value in (3, 5):
    index = SubicIndex(8, 16)
    index.add(np.full((100_000, 8), value, np.int32))
    versions.append(index)
print("ready", flush=True)
for i in range(10**6):
    versions[i % 2].save(path)
    with atomic_directory(folder, overwrite=True) as tmp:
        for part in range(20):
            with open(os.path.join(tmp, f"part{part}"), "w") as handle:
                handle.write(str(i % 2) * 20_000)
"""


def _check_complete(path, folder) -> None:
    if path.exists():
        values = np.unique(SubicIndex.load(path).get_codes())
        assert values.tolist() in ([3], [5])
    remove_stale_temporaries(folder)  # what the next save does first
    if folder.exists():
        contents = {(folder / f"part{part}").read_text() for part in range(20)}
        assert len(contents) == 1 and contents.pop() in ("0" * 20_000, "1" * 20_000)


@pytest.mark.slow
def test_saves_killed_at_random_points_leave_a_complete_file(tmp_path):
    path, folder = tmp_path / "db.subic", tmp_path / "export"
    rng = np.random.default_rng(0)
    litter = 0
    for _ in range(30):
        saver = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(path), str(folder)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert saver.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        litter += sum(TEMPORARY_MARK in name for name in os.listdir(tmp_path))
        _check_complete(path, folder)
    # The next saves leave no temporary behind, whatever the kills left.
    index = SubicIndex(8, 16)
    index.add(np.zeros((10, 8), np.int32))
    index.save(path)
    with atomic_directory(folder, overwrite=True) as tmp:
        (open(os.path.join(tmp, "part0"), "w")).close()
    assert sorted(os.listdir(tmp_path)) == ["db.subic", "export"]
    assert litter > 0  # the kills did interrupt saves


def test_outputs_are_regular_files_only(tmp_path):
    from subic_keras._io import check_output_path

    # Devices, FIFOs and link loops are refused before anything is written.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for path, error, message in (
        (fifo, ValueError, "not a regular file"),
        ("/dev/null", ValueError, "not a regular file"),
        (loop, FileExistsError, "a symbolic link"),
    ):
        with pytest.raises(error, match=message):
            check_output_path(path)
        with pytest.raises(error, match=message):
            with atomic_path(path):
                pass
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(IsADirectoryError):
        check_output_path(tmp_path)


def _listing(folder) -> dict:
    return {
        os.path.relpath(os.path.join(top, name), folder): os.path.getsize(
            os.path.join(top, name)
        )
        for top, _, names in os.walk(folder)
        for name in names
    }


def test_a_save_never_writes_through_a_link(tmp_path):
    outside = outside_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    planted = {
        "to-file.json": outside / "victim",
        "dangling.keras": outside / "new",
        "to-folder.subic": outside,
    }
    for name, target in planted.items():
        (out / name).symlink_to(target)
    before = _listing(outside)
    for name in planted:
        with pytest.raises(FileExistsError, match="never writes through a link"):
            with atomic_path(out / name) as tmp, open(tmp, "wb") as handle:
                handle.write(b"ours")
        assert (out / name).is_symlink()
    # Replacing (the command line's --overwrite) replaces the link itself.
    for name in planted:
        with atomic_path(out / name, replace=True) as tmp, open(tmp, "wb") as handle:
            handle.write(b"ours")
        assert not (out / name).is_symlink()
        assert (out / name).read_bytes() == b"ours"
    assert _listing(outside) == before and sorted(os.listdir(out)) == sorted(planted)


def test_a_link_swapped_in_for_the_destination_is_replaced_not_followed(tmp_path):
    # A link planted after the check: the rename replaces the name itself.
    outside = outside_folder(tmp_path)
    target = tmp_path / "index.subic"
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(b"new")
        target.symlink_to(outside / "victim")
    assert target.read_bytes() == b"new" and not target.is_symlink()
    assert (outside / "victim").read_bytes() == b"the user's"


def test_folders_of_ours_are_made_without_following_links(tmp_path):
    from subic_keras._io import make_folders

    outside = outside_folder(tmp_path)
    out = tmp_path / "out"
    assert make_folders(out, "logs", "subic") == str(out / "logs" / "subic")
    assert (out / "logs" / "subic").is_dir()
    (out / "logs" / "pretrain").symlink_to(outside)
    (out / "file").write_text("mine")
    refused = ((("logs", "pretrain"), "a symbolic link"), (("file",), "a file"))
    for parts, what in refused:
        with pytest.raises(FileExistsError, match=f"{what} stands where a folder"):
            make_folders(out, *parts)
    made = make_folders(out, "logs", "pretrain", replace=True)
    assert os.path.isdir(made) and not os.path.islink(made)
    assert _listing(outside) == {"victim": 10}


def test_every_small_file_is_read_bounded_and_never_waited_on(tmp_path):
    from subic_keras.data.paths import read_bytes

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: a plain open() would block for ever
    start = time.perf_counter()
    with pytest.raises(OSError, match="not a regular file"):
        read_bytes(fifo, 100, "progress file")
    assert time.perf_counter() - start < 1
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 101)
    with pytest.raises(ValueError, match="progress file larger than 100 bytes"):
        read_bytes(big, 100, "progress file")
    assert read_bytes(big, 101, "progress file") == b" " * 101
