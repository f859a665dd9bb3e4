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
