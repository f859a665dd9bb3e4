"""`search.milvus_client`: pymilvus on demand, its errors named."""

import sys

import pytest

from subic_keras.search import milvus_client


@pytest.fixture(autouse=True)
def scanner():
    """No scan here: run once, not once per scanner."""


def test_without_pymilvus_the_import_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymilvus", None)
    with pytest.raises(ImportError, match=r"pip install \"subic-keras\[milvus\]\""):
        milvus_client.pymilvus_module()


def test_milvus_errors_name_the_uri_and_the_collection():
    pymilvus = pytest.importorskip("pymilvus", reason="the [milvus] extra")
    with pytest.raises(milvus_client.MilvusError) as info:
        with milvus_client.milvus_errors("codes.db", "photos"):
            raise pymilvus.exceptions.MilvusException(message="index  not supported")
    message = str(info.value)
    assert message.startswith("Milvus at 'codes.db', collection 'photos': index")
    assert "Milvus 2.4 or later" in message and isinstance(info.value, OSError)


# A process that closes its Milvus Lite index, lets another process read
# the file, then removes it.
_CLOSE_THEN_REMOVE = """
import shutil, subprocess, sys, threading
import numpy as np
from subic_keras.search.milvus import MilvusIndex
index = MilvusIndex(sys.argv[1], "codes", 4, 16)
index.add(np.zeros((3, 4), np.int64))
index.close()
other = "import sys; from subic_keras.search.milvus import MilvusIndex; "
other += "print(len(MilvusIndex(sys.argv[1], 'codes')))"
read = subprocess.run([sys.executable, "-c", other, sys.argv[1]],
                      capture_output=True, text=True, timeout=120)
shutil.rmtree(sys.argv[1])
print(read.stdout.strip(), sorted(t.name for t in threading.enumerate()))
"""


def test_the_last_close_stops_milvus_lites_server(tmp_path):
    """Closed, a Milvus Lite file is written and unlocked: another process
    reads it, no server thread stays, and a file removed after `close` is not
    written again at exit."""
    import subprocess

    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    uri = tmp_path / "codes.db"
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_THEN_REMOVE, str(uri)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "3 ['MainThread']", done.stderr[-2000:]
    assert not uri.exists()


def test_a_file_stays_served_while_one_of_its_indexes_is_open(tmp_path):
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    import numpy as np

    from subic_keras.search.milvus import MilvusIndex

    uri = str(tmp_path / "codes.db")
    first = MilvusIndex(uri, "a", 4, 16)
    second = MilvusIndex(uri, "b", 4, 16)
    first.add(np.zeros((2, 4), np.int64))
    first.close()
    first.close()  # twice: a no-op
    second.add(np.ones((3, 4), np.int64))
    assert len(second) == 3
    second.close()
    with MilvusIndex(uri, "a") as reopened:  # a new server, the same rows
        assert len(reopened) == 2


def test_a_file_open_in_another_process_is_named_without_a_traceback(tmp_path, capfd):
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    import fcntl
    import os

    import numpy as np

    from subic_keras.search.milvus import MilvusIndex

    uri = str(tmp_path / "codes.db")
    with MilvusIndex(uri, "a", 4, 16) as index:
        index.add(np.zeros((2, 4), np.int64))
    capfd.readouterr()
    # Milvus Lite's own lock, as another process running it holds it.
    descriptor = os.open(os.path.join(uri, "LOCK"), os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(ConnectionError, match="is open in another process"):
            MilvusIndex(uri, "a")
    finally:
        os.close(descriptor)
    assert "Traceback" not in capfd.readouterr().err
    with MilvusIndex(uri, "a") as reopened:  # freed, it opens
        assert len(reopened) == 2


def test_a_missing_collection_frees_the_file(tmp_path):
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    import numpy as np

    from subic_keras.search.milvus import MilvusIndex

    uri = str(tmp_path / "codes.db")
    MilvusIndex(uri, "a", 4, 16).close()
    with pytest.raises(ValueError, match="collection 'b' does not exist"):
        MilvusIndex(uri, "b")
    # Its client closed: no client left on the file, which is freed.
    assert uri not in milvus_client._LITE_CLIENTS.values()
    with MilvusIndex(uri, "a") as index:
        index.add(np.zeros((1, 4), np.int64))
