"""pymilvus, imported where a Milvus index is used, and its errors named.

pymilvus and Milvus Lite are an extra (`pip install "subic-keras[milvus]"`):
the package imports them only when a Milvus URI is opened, and a request
that fails raises `MilvusError`, naming the URI and the collection, rather
than pymilvus's own exception.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from subic_keras.search.addresses import is_local

BATCH = 10_000  # rows per insert, delete or lookup request

# Milvus Lite serves a `.db` file from a server inside this process that
# pymilvus starts and never stops: it keeps the file locked and writes it
# again at exit, even where the file was removed after `close`. The clients
# open on each file are counted, and the last one closed stops its server.
_LITE_CLIENTS: dict[int, str] = {}
_LITE_LOCK = threading.Lock()


class MilvusError(OSError):
    """A Milvus request that failed, named with its URI and collection."""


def pymilvus_module():
    """The `pymilvus` module, or an ImportError that says how to install it."""
    try:
        import pymilvus
    except ImportError as error:
        raise ImportError(
            "the Milvus backend needs pymilvus and Milvus Lite: "
            'pip install "subic-keras[milvus]"'
        ) from error
    return pymilvus


def open_client(uri: str, token: str, timeout: float | None) -> Any:
    """A `pymilvus.MilvusClient` on `uri`, counted where it is a Milvus
    Lite file (`close_client` stops the file's server with the last)."""
    pymilvus = pymilvus_module()
    if is_local(uri):
        # Milvus Lite logs a failed start with its traceback: said here instead.
        logging.getLogger("milvus_lite.server_manager").setLevel(logging.CRITICAL)
    try:
        client = pymilvus.MilvusClient(uri=uri, token=token, timeout=timeout)
    except pymilvus.exceptions.MilvusException:
        if is_local(uri) and _locked_elsewhere(uri):
            raise ConnectionError(
                f"the Milvus Lite database {uri!r} is open in another process; "
                "Milvus Lite serves a file to one process at a time (close it "
                "there, or serve the collection from a Milvus server)"
            ) from None
        raise
    if is_local(uri):
        with _LITE_LOCK:
            _LITE_CLIENTS[id(client)] = os.path.abspath(uri)
    return client


def _locked_elsewhere(uri: str) -> bool:
    """Whether another process holds the lock of the Milvus Lite file."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: Milvus Lite's lock is unknown here
        return False
    try:
        descriptor = os.open(os.path.join(uri, "LOCK"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # and with it the lock, where it was taken
    return False


def close_client(client: Any) -> None:
    """Closes `client`; the last client of a Milvus Lite file also stops its
    server, which writes the file and unlocks it. Closing twice is a no-op."""
    client.close()
    with _LITE_LOCK:
        path = _LITE_CLIENTS.pop(id(client), None)
        if path is None or path in _LITE_CLIENTS.values():
            return
    try:
        from milvus_lite.server_manager import server_manager_instance
    except ImportError:  # a pymilvus that serves `.db` files another way
        return
    server_manager_instance.release_server(path)


@contextlib.contextmanager
def milvus_errors(uri: str, collection: str) -> Iterator[None]:
    """Raises Milvus's errors inside as `MilvusError`s that name the URI and
    the collection."""
    pymilvus = pymilvus_module()
    try:
        yield
    except pymilvus.exceptions.MilvusException as error:
        message = " ".join(str(getattr(error, "message", None) or error).split())
        if "not supported" in message and "index" in message:
            # Milvus before 2.4 has no sparse vectors to index.
            message += (
                " (this Milvus server cannot index sparse vectors, which "
                "SuBiC's collections are: Milvus 2.4 or later can)"
            )
        raise MilvusError(
            f"Milvus at {uri!r}, collection {collection!r}: {message}"
        ) from error


def get_rows(
    client: Any, collection: str, ids: np.ndarray, output_fields: list[str]
) -> list[dict[str, Any]]:
    """The rows of those of `ids` that `collection` holds (with their `id`
    and `output_fields`), asked for `BATCH` ids at a time."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(ids), BATCH):
        rows += client.get(
            collection,
            ids=ids[start : start + BATCH].tolist(),
            output_fields=output_fields,
        )
    return rows
