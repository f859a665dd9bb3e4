"""Index addresses: which name a Milvus database (a Milvus Lite path, a
server URL) rather than a `.subic` file, and whether a server address is
one pymilvus can connect to. No import of pymilvus.
"""

from __future__ import annotations

import os
import re
import urllib.parse

# How a Milvus server's address starts; `grpc://` is recognised only to be
# refused with the forms pymilvus takes.
SERVER_PREFIXES = ("http://", "https://", "tcp://", "unix:", "grpc://")


def is_local(uri: str) -> bool:
    """Whether `uri` names a Milvus Lite database (a path), not a server."""
    return not uri.startswith(SERVER_PREFIXES)


def check_server_uri(uri: str) -> str:
    """`uri` if it is a Milvus server address pymilvus can connect to.

    Raises:
        ValueError: naming what is wrong with the address: its scheme, a
            missing host or socket path, or a bad port.
    """
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme == "unix":
        if not parsed.path:
            raise ValueError(
                "a unix: address names the server's socket, e.g. "
                f"unix:/run/milvus.sock, received {uri!r}"
            )
        return uri
    if parsed.scheme not in ("http", "https", "tcp"):
        raise ValueError(
            f"{parsed.scheme}:// is not an address pymilvus takes: use http://, "
            f"https:// or tcp://HOST:PORT, or unix:PATH, received {uri!r}"
        )
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or any(ch.isspace() for ch in parsed.netloc):
        raise ValueError(f"the Milvus address names no valid host: {uri!r}")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"the Milvus address's port must be in [1, 65535]: {uri!r}")
    return uri


# Milvus's rule for a collection's name, checked before Milvus sees it.
COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


def check_location(uri: str | os.PathLike, collection) -> str:
    """`uri` as a string, where it and `collection` can name a collection:
    a Milvus Lite path ending in `.db` that is no symbolic link, or a server
    address (`check_server_uri`), and a non-empty name.

    Raises:
        ValueError: naming what is wrong.
        FileExistsError: a symbolic link at the path.
    """
    uri = os.fspath(uri)
    if not isinstance(collection, str) or not collection:
        raise ValueError(
            f"collection must be a non-empty string, received {collection!r}"
        )
    if not COLLECTION_NAME.fullmatch(collection):
        raise ValueError(
            "collection must be a name Milvus takes: a letter or _ first, then "
            f"letters, digits and _ (ASCII), at most 255 in all; received "
            f"{collection[:80]!r}"
        )
    if is_local(uri) and not uri.endswith(".db"):
        raise ValueError(
            "uri must be a Milvus Lite path ending in .db or a server URL "
            f"such as http://localhost:19530, received {uri!r}"
        )
    if not is_local(uri):
        check_server_uri(uri)
    elif os.path.islink(uri):
        # Milvus Lite writes its database (and files beside it) where a link
        # leads; the package never writes through one.
        raise FileExistsError(
            17,
            "a symbolic link where the Milvus Lite database goes; it is never "
            "written through: give the database's own path",
            uri,
        )
    return uri


def check_database_exists(uri: str | os.PathLike, collection: str) -> None:
    """Raises `ValueError` where `uri` is a Milvus Lite path with no database
    (opening one: Milvus Lite would make an empty database there), or a
    server address that is not one (`check_server_uri`)."""
    uri = os.fspath(uri)
    if not is_local(uri):
        check_server_uri(uri)
    if is_local(uri) and not os.path.exists(uri):
        raise ValueError(
            f"collection {collection!r} does not exist at {uri!r}: there is no "
            "Milvus Lite database at that path"
        )


def is_database(uri: str | os.PathLike) -> bool:
    """Whether `uri` names a Milvus database (else a `.subic` file)."""
    uri = os.fspath(uri)
    return uri.startswith(SERVER_PREFIXES) or uri.endswith(".db")
