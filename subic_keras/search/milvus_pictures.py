"""`MilvusPictures`: a folder's pictures in a Milvus collection, searched
by picture and answered by path, as an `ImageIndex` is.

A collection of a folder (format 3, `milvus_schema`) records the folder
and the pictures' decoded shape, and holds beside each picture's codes
the fields of an `ImageIndex`'s item table (`items`): its path relative to
the folder, its class (the path's top folder), a fingerprint of its
decoded pixels, when it was added and the user's attributes. The class
code, and the instance code where the collection keeps one, are searched
by Milvus as `MilvusIndex` searches them; on top of that, as in an
`ImageIndex`:

- an exact copy of the query (the same fingerprint) is listed first;
- every filter runs inside Milvus's search (`filter_terms`), attributes
  too: each value is kept under its kind and name (`"number:year"`), so
  that a test reads the values of its own kind, as an `ImageIndex` does;
- `duplicates()` groups copies by the instance codes, exact, all pairs
  (`copies.duplicate_groups`, the codes read from the collection).

Paths are unique in a collection: an `add` that repeats one is refused
whole. `subic index build MODEL DIR --output photos.db` writes one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Sequence

import numpy as np

from subic_keras.search import filter_terms, filters, milvus_client, milvus_schema
from subic_keras.search.base import PictureIndex, answer_rows
from subic_keras.search.checks import check_fingerprints, check_ids, preview
from subic_keras.search.copy_rules import duplicate_groups, recorded_copy_blocks
from subic_keras.search.filter_terms import milvus_attribute_key, milvus_literal
from subic_keras.search.items import (
    check_attributes,
    check_item_fingerprints,
    check_paths,
    class_of,
    described,
    folders_of,
)
from subic_keras.search.milvus import MilvusIndex
from subic_keras.search.milvus_client import get_rows, milvus_errors
from subic_keras.search.views import exact_first

_PATHS_A_QUERY = 1_000  # paths named in one Milvus filter expression


class MilvusPictures(MilvusIndex, PictureIndex):
    """A folder's pictures, their codes and paths, in a Milvus collection.

    Example:

    >>> index = MilvusPictures("photos.db", "photos", 2, 4, root="photos")
    >>> ids = index.add([[0, 1], [2, 3]], ["cats/tom.jpg", "dogs/rex.png"])
    >>> z_star = np.array([[1.0, 0.0, 5.0, 0.0, 0.0, 2.0, 0.0, 1.0]])
    >>> [(row["path"], row["score"]) for row in index.answer(z_star, 2)[0]]
    [('dogs/rex.png', 6.0), ('cats/tom.jpg', 3.0)]
    >>> [row["path"] for row in index.answer(z_star, 2, where="class == 'cats'")[0]]
    ['cats/tom.jpg']

    Args:
        uri: a Milvus Lite path ending in `.db`, or a Milvus server URL
            (`MilvusIndex`).
        collection: the collection's name.
        num_blocks, block_size: `M` and `K`, with `root` to create the
            collection; when it exists they must match what it records
            (or be None).
        root: the pictures' folder (kept absolute); a collection that
            exists must record this folder (None: whichever it records).
        image_shape: the model input `(H, W, C)` the pictures were decoded
            to, recorded by a new collection.
        **options: `MilvusIndex`'s other keyword arguments (`token`,
            `shards`, `model`, `instance`, `instance_model`, ...).

    Raises:
        ValueError: the collection holds codes without paths, records
            another folder, or `num_blocks` came without `root`; and
            `MilvusIndex`'s errors.
    """

    def __init__(
        self,
        uri: str | os.PathLike,
        collection: str,
        num_blocks: int | None = None,
        block_size: int | None = None,
        *,
        root: str | os.PathLike | None = None,
        image_shape: Sequence[int] | None = None,
        **options,
    ):
        if root is None and (num_blocks is not None or block_size is not None):
            raise ValueError(
                "root must be given with num_blocks and block_size: the folder "
                "of the pictures of a collection to create"
            )
        self._folder: tuple = (None, None)
        if root is not None:
            shape = None if image_shape is None else np.asarray(image_shape).tolist()
            try:
                self._folder = milvus_schema.check_folder(
                    os.path.abspath(os.fspath(root)), shape
                )
            except ValueError as error:
                raise ValueError(f"root and image_shape: {error}") from None
        super().__init__(uri, collection, num_blocks, block_size, **options)
        try:
            self._check_folder(self._folder[0])
        except ValueError:
            self.close()
            raise

    @classmethod
    def from_index(cls, index: MilvusIndex) -> MilvusPictures:
        """The collection `index` has open, as a collection of pictures
        (sharing its connection).

        Raises:
            ValueError: it holds codes without paths.
        """
        pictures = cls.__new__(cls)
        pictures.__dict__.update(vars(index))
        pictures._check_folder(None)
        return pictures

    def _check_folder(self, root: str | None) -> None:
        recorded = self._recorded.root
        if recorded is None:
            raise ValueError(
                f"collection {self._name!r} at {self._uri!r} holds codes without "
                "image paths (of a dataset split, not of a folder); build one "
                "from a folder with `subic index build MODEL DIR --output URI "
                "--collection NAME`"
            )
        if root is not None and os.path.realpath(root) != os.path.realpath(recorded):
            raise ValueError(
                f"collection {self._name!r} holds pictures of {recorded}, "
                f"received root={root!r}"
            )

    # Properties -----------------------------------------------------------

    @property
    def root(self) -> str:
        """The absolute path of the folder."""
        root = self._recorded.root
        assert root is not None
        return root

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self._recorded.image_shape

    @property
    def written_with_looks(self) -> bool:
        return False  # looks were retired before Milvus kept folders

    def __repr__(self) -> str:
        return (
            f"MilvusPictures(uri={self._uri!r}, collection={self._name!r}, "
            f"num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"root={self.root!r})"
        )

    def by_instance(self) -> MilvusPictures:
        """The same pictures searched by their instance codes
        (`MilvusIndex.by_instance`)."""
        view = super().by_instance()
        assert isinstance(view, MilvusPictures)
        return view

    @property
    def copy_record(self) -> dict | None:
        """The record of the model whose codes tell copies, with the rules
        chosen on this folder (`ImageIndex.copy_record`)."""
        if self.instance is None or self._view:
            return self.model
        return self.instance_model

    def record_copy_rules(self, rules: dict) -> None:
        """Records the copy rules chosen on this folder's pictures in the
        collection's properties (`ImageIndex.record_copy_rules`)."""
        self._check_writable()
        record = dict(self.copy_record or {})
        record["copies"] = dict(rules)
        name = "model" if self.instance is None else "instance_model"
        with milvus_errors(self._uri, self._name):
            self._client.alter_collection_properties(
                self._name, properties={f"subic.{name}": json.dumps(record)}
            )
        if name == "model":
            self._recorded = dataclasses.replace(self._recorded, model=record)
        else:
            self._recorded = dataclasses.replace(self._recorded, instance_model=record)

    def copy_items(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """`(paths, codes, fingerprints)` of every picture, in insertion
        order, by the codes that tell copies (`ImageIndex.copy_items`)."""
        return self._copy_rows()[1:]

    def _copy_rows(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """`(ids, paths, codes, fingerprints)` of every picture, in insertion
        order, by the codes that tell copies: read from the collection once."""
        codes_of = self if self.instance is None or self._view else self.by_instance()
        field = codes_of._vectors
        rows = self._rows(["id", "path", "fingerprint", field])
        ids = np.array([row["id"] for row in rows], dtype=np.int64)
        codes = milvus_schema.codes_of(
            [row[field] for row in rows], codes_of.num_blocks, codes_of.block_size
        )
        fingerprints = np.array([row["fingerprint"] for row in rows], np.int64)
        paths = [row["path"] for row in rows]
        return ids, paths, codes, fingerprints.view(np.uint64)

    # Writing --------------------------------------------------------------

    def add(  # type: ignore[override]  # by path, as `ImageIndex.add`
        self,
        codes,
        paths: Iterable[str],
        fingerprints=None,
        attributes=None,
        ids=None,
        instance_codes=None,
    ) -> np.ndarray:
        """Adds pictures, all or nothing, as `ImageIndex.add` does: their
        codes and paths (and pixel fingerprints, attributes, ids and
        instance codes).

        Returns:
            The int64 ids given to the pictures.

        Raises:
            ValueError: for bad codes, paths or attributes, a path already
                in the collection (or longer than Milvus keeps, 65,535
                bytes), or a count that differs from the codes'.
        """
        self._check_writable()
        paths = check_paths("paths", paths)
        long = [
            path[:80] for path in paths if len(path.encode()) > milvus_schema.MAX_PATH
        ]
        if long:
            raise ValueError(
                f"paths must be at most {milvus_schema.MAX_PATH} bytes in "
                f"Milvus, received {len(long)} longer: {long[:3]}"
            )
        attributes = check_attributes("attributes", attributes, len(paths), paths)
        fingerprints = check_item_fingerprints(fingerprints, len(paths))
        codes, ids = self._checked_additions(codes, ids)
        if len(codes) != len(paths):
            raise ValueError(
                f"codes and paths must have the same length, received "
                f"{len(codes)} codes and {len(paths)} paths"
            )
        columns = milvus_schema.columns(
            codes, self._recorded, instance_codes, self._name
        )
        scalars = {
            "path": paths,
            "class": [class_of(path) for path in paths],
            # Milvus keeps int64: the uint64's bits, read back as they were.
            "fingerprint": fingerprints.view(np.int64).tolist(),
            "added": [time.time()] * len(paths),
            "attributes": [_keyed(values) for values in attributes],
        }
        with self._write, milvus_errors(self._uri, self._name):
            present = list(self._found_paths(paths))
            if present:
                raise ValueError(f"paths already in the index: {present[:10]}")
            next_id = self._counters()[0]
            if ids is not None and len(ids) and ids.min() < next_id:
                raise ValueError(
                    f"ids must be >= {next_id} (ids are never reused), "
                    f"received {preview(ids)}"
                )
            return self._add(columns, len(paths), ids, scalars)

    def remove(self, paths: Iterable[str]) -> int:
        """Removes pictures by path; all or nothing.

        Raises:
            KeyError: if a path is not in the collection (none is removed).
        """
        if isinstance(paths, str):
            raise TypeError("paths must be a sequence of paths, received one string")
        return super().remove(self.ids(list(dict.fromkeys(paths))))

    # Reading --------------------------------------------------------------

    def _found_paths(self, paths: list[str]) -> dict[str, int]:
        """The id of each of `paths` the collection holds."""
        found: dict[str, int] = {}
        for start in range(0, len(paths), _PATHS_A_QUERY):
            named = ", ".join(
                milvus_literal(p) for p in paths[start : start + _PATHS_A_QUERY]
            )
            rows = self._client.query(
                self._name, filter=f"path in [{named}]", output_fields=["id", "path"]
            )
            found.update((row["path"], int(row["id"])) for row in rows)
        return found

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        with milvus_errors(self._uri, self._name):
            return bool(self._found_paths([path]))

    def ids(self, paths: Iterable[str]) -> np.ndarray:
        """The ids of relative `paths`, in order.

        Raises:
            KeyError: for a path not in the collection.
        """
        paths = list(paths)
        with milvus_errors(self._uri, self._name):
            found = self._found_paths(paths)
        missing = [path for path in paths if path not in found]
        if missing:
            raise KeyError(f"paths not in the index: {missing[:10]}")
        return np.array([found[path] for path in paths], dtype=np.int64)

    def _fields(self, ids, fields: list[str]) -> list[dict]:
        """The rows of `ids`, in their order (`KeyError` for one not held)."""
        ids = check_ids("ids", ids)
        with milvus_errors(self._uri, self._name):
            rows = get_rows(self._client, self._name, np.unique(ids), fields)
        by_id = {int(row["id"]): row for row in rows}
        missing = [i for i in ids.tolist() if i not in by_id]
        if missing:
            raise KeyError(f"ids not in the index: {preview(np.array(missing))}")
        return [by_id[i] for i in ids.tolist()]

    def paths(self, ids) -> list[str]:
        """The relative paths of `ids`, in order (`KeyError` for an id not
        held)."""
        return [row["path"] for row in self._fields(ids, ["path"])]

    def get_paths(self) -> list[str]:
        """Every path, in insertion order (the order of `get_ids()`)."""
        return [row["path"] for row in self._rows(["path"])]

    def folders(self) -> list[str]:
        """The folders that hold pictures, sorted: read again only after
        pictures were added or removed (by any process), as a server's page
        asks for them at every visit."""
        with milvus_errors(self._uri, self._name):
            state = (len(self), self._properties().get("subic.next_seq"))
        cached = getattr(self, "_folders", None)
        if cached is None or cached[0] != state:
            cached = self._folders = (state, folders_of(self.get_paths()))
        return list(cached[1])

    def describe(self, ids) -> list[dict]:
        """Each item's fields: id, path, class, added, attributes.

        Raises:
            KeyError: for an id not in the collection.
        """
        rows = self._fields(ids, ["path", "added", "attributes"])
        return [
            described(row["id"], row["path"], row["added"], _named(row["attributes"]))
            for row in rows
        ]

    def duplicates(self, copy_blocks: int | None = None) -> list[list[str]]:
        """Groups of copies by the instance codes (by the codes of an
        instance code's collection), as `ImageIndex.duplicates` gives them."""
        codes_of = self if self.instance is None or self._view else self.by_instance()
        copy_blocks = recorded_copy_blocks(
            self.copy_record, copy_blocks, codes_of.num_blocks
        )
        ids, paths, codes, fingerprints = self._copy_rows()
        groups = duplicate_groups(
            codes, ids, codes_of.block_size, copy_blocks, fingerprints=fingerprints
        )
        path_of = dict(zip(ids.tolist(), paths))
        return [[path_of[int(i)] for i in group] for group in groups]

    def search(
        self, queries, k: int, *, where=None, fingerprints=None, instance_queries=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`ImageIndex.search` of the collection: with the queries' pixel
        `fingerprints`, each query's exact copies first; with the instance
        model's `instance_queries`, its copies by the instance code, then
        the class ranking, equal scores by instance score."""
        if fingerprints is None and instance_queries is None:
            return super().search(queries, k, where=where)
        scores, ids, *_ = self._ranked(
            queries, k, where, fingerprints, instance_queries
        )
        return scores, ids

    def answer(
        self, queries, k: int, *, where=None, fingerprints=None, instance_queries=None
    ) -> list[list[dict]]:
        """`search`, each result as a row (`base.answer_rows`), exact copies
        of the query marked `"exact": True` and, answered by both codes,
        copies `"copy": True`, as `ImageIndex.answer` gives them."""
        found = self._ranked(queries, k, where, fingerprints, instance_queries)
        return answer_rows(self, *found)

    def _ranked(self, queries, k, where, fingerprints, instance_queries):
        """`(scores, ids, exact, copy)` (`exact` None without fingerprints;
        `copy` None unless answered by both codes)."""
        where = filters.as_filter(where)
        scores, ids, copy = self._answered(queries, k, where, instance_queries)
        if fingerprints is None or not ids.shape[1]:
            return scores, ids, None, copy
        fingerprints = check_fingerprints(fingerprints, len(ids))
        found = [self._exact(value, where, ids.shape[1]) for value in fingerprints]
        return scores, ids, exact_first(scores, ids, queries, found, copy), copy

    def _exact(self, fingerprint, where, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `k` pictures `where` keeps whose pixels have this
        fingerprint, in insertion order: their ids and searched codes."""
        if not fingerprint:  # 0: unknown
            return np.zeros(0, np.int64), np.zeros((0, self.num_blocks), np.uint8)
        value = int(np.array(fingerprint, np.uint64).view(np.int64))
        expression = f"fingerprint == {value}"
        if where is not None:
            expression += f" and ({where.milvus(filter_terms.ON_PICTURES)})"
        with milvus_errors(self._uri, self._name):
            rows = self._client.query(
                self._name,
                filter=expression,
                output_fields=["id", "seq", self._vectors],
                limit=milvus_client.BATCH,
            )
        rows = sorted(rows, key=lambda row: row["seq"])[:k]
        ids = np.array([row["id"] for row in rows], dtype=np.int64)
        codes = milvus_schema.codes_of(
            [row[self._vectors] for row in rows], self.num_blocks, self.block_size
        )
        return ids, codes


def _keyed(attributes: dict | None) -> dict:
    """A picture's attributes as the collection keeps them, keyed by kind
    and name (`filter_terms.milvus_attribute_key`)."""
    return {
        milvus_attribute_key(name, value): value
        for name, value in (attributes or {}).items()
    }


def _named(stored: dict | None) -> dict:
    """`_keyed`'s inverse."""
    return {key.partition(":")[2]: value for key, value in (stored or {}).items()}


def open_collection(
    uri: str | os.PathLike, collection: str
) -> MilvusIndex | MilvusPictures:
    """The collection at `uri`: a `MilvusPictures` where it holds a
    folder's pictures, else a `MilvusIndex` (codes and ids)."""
    index = MilvusIndex(uri, collection)
    if index._recorded.root is None:
        return index
    return MilvusPictures.from_index(index)
