import os
import stat

import pytest

from subic_keras._io import atomic_directory, atomic_path


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
