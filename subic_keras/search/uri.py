"""One address for every backend: `open(uri)` and `add_codes(uri, ...)`.

An index is named by a URI:

- a path to a `.subic` file (`SubicIndex.save`, or `ImageIndex.save` for
  a folder's pictures): opened in memory;
- a path ending in `.shards.json`: a shard manifest, its `.subic` shards
  searched by Ray actors (`ray_index.RayIndex`), on one machine or a
  cluster;
- a path ending in `.db`: a Milvus Lite database (embedded, local);
- `http://host:19530`, `https://...`, `tcp://host:port` or
  `unix:/path/to/milvus.sock`: a Milvus server or cluster.

Milvus holds several collections at one address; `collection` names one.
"""

from __future__ import annotations

import os

import numpy as np

from subic_keras.search.addresses import is_database as is_database
from subic_keras.search.base import Searcher
from subic_keras.search.image_index import read_file
from subic_keras.search.manifests import is_manifest
from subic_keras.search.subic_index import SubicIndex

DEFAULT_COLLECTION = "subic"


def open(  # the package's `open`: `sk.search.open(uri)`
    uri: str | os.PathLike,
    *,
    collection: str = DEFAULT_COLLECTION,
    scanner: str = "auto",
    folder: str | None = None,
) -> Searcher:
    """Opens the index at `uri` for searching: the one place that tells
    the kinds of index apart.

    Example:

    >>> import tempfile
    >>> index = SubicIndex(num_blocks=4, block_size=16)
    >>> ids = index.add(np.random.default_rng(0).integers(0, 16, (100, 4)))
    >>> path = os.path.join(tempfile.mkdtemp(), "codes.subic")
    >>> index.save(path)
    >>> len(open(path))
    100

    Args:
        uri: a `.subic` file, a Milvus Lite `.db` path, or a Milvus server
            URL (module doc).
        collection: the Milvus collection (Milvus URIs only).
        scanner: what scans a `.subic` file's codes (`SubicIndex`'s
            argument; files only).
        folder: a real folder a `.subic` file must lie in, links leading
            out of it refused (`image_index.read_file`; a manifest's shards).

    Returns:
        A `Searcher`: a `SubicIndex` (codes and ids), an `ImageIndex` (a
        file that records its items: a folder's pictures), a `RayIndex` (a
        shard manifest), a `MilvusIndex` or a `MilvusPictures` (a
        collection of a folder's pictures).

    Raises:
        ValueError: for a file that is not an index, an unknown collection,
            or a `scanner` this machine cannot run.
        ImportError: for a Milvus URI without pymilvus installed.
    """
    if is_database(uri):
        from subic_keras.search.milvus_pictures import open_collection

        return open_collection(uri, collection)
    if is_manifest(uri):
        from subic_keras.search.ray_index import RayIndex

        return RayIndex(uri, scanner=scanner)
    return read_file(uri, scanner=scanner, folder=folder)


def add_codes(
    uri: str | os.PathLike,
    codes: np.ndarray,
    ids: np.ndarray | None,
    *,
    num_blocks: int,
    block_size: int,
    collection: str = DEFAULT_COLLECTION,
    model: dict | None = None,
) -> tuple[np.ndarray, int]:
    """Stores codes at `uri`: added to a Milvus collection (created if it
    does not exist), or written as a new `.subic` file (atomically).

    Args:
        uri: where (module doc).
        codes: integer codes `(n, M)` or per-block vectors `(n, M*K)`.
        ids: their ids (`None`: consecutive ids after the largest present).
        num_blocks, block_size: `M` and `K`.
        collection: the Milvus collection (Milvus URIs only).
        model: the model that wrote the codes (`retrieval.model_record`),
            recorded by a `.subic` file or a new Milvus collection; an
            existing collection that records another model is refused.

    Returns:
        The ids added, and the number of items at `uri` now.
    """
    if is_database(uri):
        from subic_keras.search.milvus import MilvusIndex

        with MilvusIndex(
            uri, collection, num_blocks, block_size, model=model
        ) as database:
            recorded = database.model
            if model is not None and recorded and recorded["digest"] != model["digest"]:
                wrote = recorded.get("path") or recorded.get("file")
                this = model.get("path") or model.get("file") or "this model"
                raise ValueError(
                    f"collection {collection!r} at {os.fspath(uri)!r} holds codes "
                    f"of {wrote or 'another model'} (digest "
                    f"{recorded['digest'][:12]}), not of {this} (digest "
                    f"{model['digest'][:12]}): add them to a new collection"
                )
            return database.add(codes, ids=ids), len(database)
    index = SubicIndex(num_blocks, block_size)
    index.model = model
    added = index.add(codes, ids=ids)
    index.save(uri)
    return added, len(index)
