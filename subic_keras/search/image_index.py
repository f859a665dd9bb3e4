"""`ImageIndex`: a folder's pictures, searched by picture, answered by path.

An `ImageIndex` is a `PictureIndex` made of parts kept in step: a
`SubicIndex` of each picture's code and id, an
`ItemTable` (`items`) of the rest (its path relative to the folder, its
class, a fingerprint of its decoded pixels, when it was added, the user's
attributes), and with `instance=` an instance code of each picture
(`instance_codes`). One `.subic` file (`file_format`) holds them all, so
the paths never drift from the codes; `subic_keras.search.open` reads it.

Ranking is the asymmetric score of `SubicIndex` (paper Sec. 3.3); given
the query's instance query, an index with instance codes lists its copies
first and orders equal scores by instance score (`instance_codes`).
One rule is added for pictures: an exact copy of the query (the same
pixels at the model's input size, by fingerprint) is listed first, as a
person who searches with a picture of the folder expects, whatever its
code shares with others. Filters (`where=`) read every field of the table
(`filters`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence

import numpy as np

from subic_keras.search import file_format, filters
from subic_keras.search.addresses import is_database
from subic_keras.search.base import PictureIndex, answer_rows
from subic_keras.search.checks import check_fingerprints, check_ids, preview
from subic_keras.search.copy_rules import duplicate_groups, recorded_copy_blocks
from subic_keras.search.instance_codes import InstanceCodes, merge_parts, shard_part
from subic_keras.search.items import (
    MAX_ID,
    ItemTable,
    check_attributes,
    check_item_fingerprints,
    check_paths,
    check_table_metadata,
)
from subic_keras.search.locks import ReadOnly, ReadWriteLock
from subic_keras.search.manifests import is_manifest
from subic_keras.search.picture_shard_answers import PictureShardAnswers
from subic_keras.search.subic_index import SubicIndex
from subic_keras.search.views import exact_first

FORMAT = "subic.image-index"


class ImageIndex(PictureShardAnswers, PictureIndex):
    """The codes of a folder's pictures, with each picture's path.

    Example:

    >>> index = ImageIndex(num_blocks=2, block_size=4, root="photos")
    >>> ids = index.add([[0, 1], [2, 3]], ["cats/tom.jpg", "dogs/rex.png"])
    >>> z_star = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    >>> scores, ids = index.search(z_star, k=2)
    >>> index.paths(ids[0]), scores[0].tolist()
    (['dogs/rex.png', 'cats/tom.jpg'], [6.0, 0.0])
    >>> [row["path"] for row in index.answer(z_star, 2, where="class == 'cats'")[0]]
    ['cats/tom.jpg']

    Args:
        num_blocks: `M`, blocks per code.
        block_size: `K`, a power of two in [2, 1024].
        root: the folder the paths are relative to (kept absolute).
        image_shape: the model input `(H, W, C)` the pictures were decoded
            to, recorded so that queries are decoded the same way.
        index: the `SubicIndex` to hold the codes (default: a new one).
        instance: `(M', K')`: keep an instance code of that shape of every
            picture beside its class code (`instance_codes`: copies first).

    Raises:
        ValueError: for a bad block shape, or an `index` of another shape or
            not empty.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        root: str | os.PathLike,
        image_shape: Sequence[int] | None = None,
        index: SubicIndex | None = None,
        instance: tuple[int, int] | None = None,
    ):
        if index is None:
            index = SubicIndex(num_blocks, block_size)
        elif (index.num_blocks, index.block_size) != (num_blocks, block_size):
            raise ValueError(
                f"index holds codes of {index.num_blocks} blocks of "
                f"{index.block_size}, not {num_blocks} of {block_size}"
            )
        elif len(index):
            raise ValueError(
                f"index must be empty, received one of {len(index)} items without paths"
            )
        self._codes = index
        self._root = os.path.abspath(os.fspath(root))
        self._shape = None if image_shape is None else tuple(map(int, image_shape))
        self._items = ItemTable()
        self._next_id = 0  # ids are never reused, not even after a remove
        self._lock = ReadWriteLock()
        self._instance = None if instance is None else InstanceCodes(*instance)

    # Properties ---------------------------------------------------------

    @property
    def root(self) -> str:
        """The absolute path of the folder."""
        return self._root

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self._shape

    @property
    def num_blocks(self) -> int:
        return self._codes.num_blocks

    @property
    def block_size(self) -> int:
        return self._codes.block_size

    @property
    def scanner(self) -> str:
        """The name of the scanner that ranks the codes."""
        return self._codes.scanner

    @property
    def written_with_looks(self) -> bool:
        """Whether its file was an earlier version's, with the pictures'
        looks, which this version reads past (`file_format`)."""
        return self._codes.written_with_looks

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes (`SubicIndex.model`)."""
        return self._codes.model

    @model.setter
    def model(self, record: dict | None) -> None:
        self._codes.model = record

    @property
    def instance(self) -> InstanceCodes | None:
        """The instance codes kept beside the class codes (None: none)."""
        return self._instance

    @property
    def instance_model(self) -> dict | None:
        return None if self._instance is None else self._instance.model or {}

    def by_instance(self) -> ImageIndex:
        """The same pictures searched by their instance codes alone (`subic
        search instance` of an index that keeps both), for reading: an
        `ImageIndex` sharing this one's items, whose `add` and `remove` raise.

        Raises:
            ValueError: the index keeps no instance codes.
        """
        if self._instance is None:
            raise ValueError("this index keeps no instance codes")
        view = copy.copy(self)
        view._codes, view._instance = self._instance.codes, None
        view._shape, view._lock = self._instance.image_shape, ReadOnly(self._lock)
        return view

    @property
    def shard_label(self) -> tuple[str, int] | None:
        """Which shard of which build this file is (`SubicIndex.shard_label`)."""
        return self._codes.shard_label

    @shard_label.setter
    def shard_label(self, label) -> None:
        self._codes.shard_label = label

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, path: object) -> bool:
        return path in self._items.row_of_path

    def __repr__(self) -> str:
        return (
            f"ImageIndex(num_blocks={self.num_blocks}, block_size="
            f"{self.block_size}, root={self._root!r}, items={len(self)})"
        )

    # Mutation -----------------------------------------------------------

    def add(
        self,
        codes,
        paths: Iterable[str],
        fingerprints=None,
        attributes=None,
        ids=None,
        instance_codes=None,
    ) -> np.ndarray:
        """Adds pictures, all or nothing: their codes and paths (and pixel
        fingerprints, attributes, ids and instance codes).

        Args:
            codes: codes `(n, M)`, in any form `SubicIndex.add` takes.
            paths: `n` relative POSIX paths under `root`, new to the index.
            fingerprints: `n` uint64 fingerprints of the decoded pixels
                (`subic_keras.data.images.fingerprint`); default: none (0).
            attributes: `n` flat objects (or None) of the user's fields,
                which filters read as `attrs.NAME` (`items` says what they
                may hold); default: none.
            ids: `n` new int64 ids, each at least the next default one;
                default: the next ones (ids are never reused).
            instance_codes: `n` instance codes (an index made with `instance`).

        Returns:
            The int64 ids given to the pictures.

        Raises:
            ValueError: for bad codes, paths or attributes, a path already
                in the index, or a count that differs from the codes'.
        """
        paths = check_paths("paths", paths)
        attributes = check_attributes("attributes", attributes, len(paths), paths)
        if self._instance is not None:
            instance_codes = self._instance.checked(instance_codes, len(paths))
        elif instance_codes is not None:
            raise ValueError("instance_codes were given to an index that keeps none")
        fingerprints = check_item_fingerprints(fingerprints, len(paths))
        with self._lock.write():
            present = [path for path in paths if path in self._items.row_of_path]
            if present:
                raise ValueError(f"paths already in the index: {present[:10]}")
            if len(codes) != len(paths):
                raise ValueError(
                    f"codes and paths must have the same length, received "
                    f"{len(codes)} codes and {len(paths)} paths"
                )
            if self._next_id + len(paths) > MAX_ID:
                raise ValueError(
                    f"the index has no ids left for {len(paths)} more pictures "
                    f"(next id {self._next_id}, the last is {MAX_ID})"
                )
            if ids is None:
                ids = np.arange(
                    self._next_id, self._next_id + len(paths), dtype=np.int64
                )
            else:
                ids = check_ids("ids", ids, len(paths))
                if len(ids) and ids.min() < self._next_id:
                    raise ValueError(
                        f"ids must be >= {self._next_id} (ids are never reused), "
                        f"received {preview(ids)}"
                    )
            self._codes.add(codes, ids=ids)
            if self._instance is not None:
                self._instance.codes.add(instance_codes, ids=ids)
            self._next_id = int(ids.max()) + 1 if len(ids) else self._next_id
            added = np.full(len(paths), time.time())
            self._items.append(ids, paths, fingerprints, added, attributes)
        return ids

    def remove(self, paths: Iterable[str]) -> int:
        """Removes pictures by path; all or nothing.

        Returns:
            The number of pictures removed.

        Raises:
            KeyError: if a path is not in the index (none is removed).
        """
        if isinstance(paths, str):
            raise TypeError("paths must be a sequence of paths, received one string")
        paths = list(dict.fromkeys(paths))
        with self._lock.write():
            row_of_path = self._items.row_of_path
            missing = [path for path in paths if path not in row_of_path]
            if missing:
                raise KeyError(f"paths not in the index: {missing[:10]}")
            rows = np.array([row_of_path[p] for p in paths], dtype=np.int64)
            self._codes.remove(self._items.ids[rows])
            if self._instance is not None:
                self._instance.codes.remove(self._items.ids[rows])
            kept = np.ones(len(self._items), bool)
            kept[rows] = False
            self._items.keep(kept)
        return len(rows)

    # Reading ------------------------------------------------------------

    def paths(self, ids) -> list[str]:
        """The relative paths of `ids` (1-D), in order.

        Raises:
            KeyError: for an id not in the index.
        """
        ids = check_ids("ids", ids)
        with self._lock.read():
            return [self._items.paths[row] for row in self._items.rows(ids)]

    def ids(self, paths: Iterable[str]) -> np.ndarray:
        """The ids of relative `paths`, in order.

        Raises:
            KeyError: for a path not in the index.
        """
        paths = list(paths)
        with self._lock.read():
            row_of_path = self._items.row_of_path
            missing = [path for path in paths if path not in row_of_path]
            if missing:
                raise KeyError(f"paths not in the index: {missing[:10]}")
            return self._items.ids[[row_of_path[p] for p in paths]].astype(np.int64)

    def get_paths(self) -> list[str]:
        """Every path, in insertion order (the order of `get_ids()`)."""
        with self._lock.read():
            return list(self._items.paths)

    def get_ids(self) -> np.ndarray:
        with self._lock.read():
            return self._items.ids.copy()

    def folders(self) -> list[str]:
        """The folders that hold pictures (at any depth), sorted: what
        `path under "FOLDER"` filters on."""
        with self._lock.read():
            return self._items.folders()

    def get_codes(self, ids=None) -> np.ndarray:
        """Integer codes `(n, M)` of `ids` (default: all, in insertion order)."""
        return self._codes.get_codes(ids)

    def describe(self, ids) -> list[dict]:
        """Each item's fields: id, path, class, added, attributes.

        Raises:
            KeyError: for an id not in the index.
        """
        ids = check_ids("ids", ids)
        with self._lock.read():
            return self._items.describe(self._items.rows(ids))

    def file(self, item_id: int) -> str:
        """The real path of a picture's file, checked to lie inside `root`.

        Raises:
            KeyError: for an unknown id.
            PermissionError: the path leads out of the folder (a link).
            FileNotFoundError: the file is gone.
        """
        from subic_keras.data.paths import resolve

        (relative,) = self.paths([item_id])
        return resolve(self._root, relative)

    @property
    def copy_record(self) -> dict | None:
        """The record of the model whose codes tell copies (the instance
        codes kept beside class codes, else the index's own), with the copy
        rules chosen on this folder under `"copies"` (`record_copy_rules`)."""
        return self.model if self._instance is None else self._instance.model

    def record_copy_rules(self, rules: dict) -> None:
        """Records the copy rules chosen on this folder's pictures
        (`folder_rules.calibrate_folder`) in `copy_record`, saved with the index:
        they mark its copies and list its duplicates from then on."""
        record = dict(self.copy_record or {})
        record["copies"] = dict(rules)
        with self._lock.write():
            if self._instance is None:
                self.model = record
            else:
                self._instance.model = record

    def copy_items(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """`(paths, codes, fingerprints)` of every picture, in insertion
        order: the codes that tell copies (`copy_record`'s model's)."""
        return self._copy_columns()[1:]

    def _copy_columns(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """`(ids, paths, codes, fingerprints)` of every picture, in insertion
        order, by the codes that tell copies, from one state of the index."""
        part = self._codes if self._instance is None else self._instance.codes
        with self._lock.read():
            ids = self._items.ids.copy()
            return (
                ids,
                list(self._items.paths),
                part.get_codes(ids),
                np.array(self._items.fingerprints, np.uint64),
            )

    def duplicates(self, copy_blocks: int | None = None) -> list[list[str]]:
        """Groups of pictures that are copies of each other, by their codes
        (`subic_keras.search.copy_rules.duplicate_groups`: exact, all pairs).

        Args:
            copy_blocks: the least equal blocks of two copies; default: the
                one chosen on this folder (`record_copy_rules`; none: exact
                copies alone), else the instance code's (`model`'s). The
                same pixels are grouped whatever the count.

        Returns:
            The groups' paths, each group in insertion order, largest first.

        Raises:
            ValueError: with no `copy_blocks` given or recorded (an index of
                a class code: classes, not copies).
        """
        part = self._codes if self._instance is None else self._instance.codes
        copy_blocks = recorded_copy_blocks(
            self.copy_record, copy_blocks, part.num_blocks
        )
        ids, _, codes, fingerprints = self._copy_columns()
        groups = duplicate_groups(
            codes, ids, part.block_size, copy_blocks, fingerprints=fingerprints
        )
        return [self.paths(group) for group in groups]

    def exact_copies(self, fingerprint: int) -> np.ndarray:
        """Ids of the pictures whose pixels have this fingerprint."""
        with self._lock.read():
            return self._items.ids[self._items.keys().fingerprint_rows(fingerprint)]

    def search(
        self, queries, k: int, *, where=None, fingerprints=None, **more
    ) -> tuple[np.ndarray, np.ndarray]:
        """`SubicIndex.search`, with exact copies of each query listed first.

        Args:
            queries: real `(nq, M*K)` queries.
            k: results per query, >= 1 (at most `len(self)` come back).
            where: the pictures that may be returned (`filters`): e.g.
                `"path under 'holidays/2024'"`, `"class == 'cat'"`.
            fingerprints: the queries' pixel fingerprints `(nq,)`, or `None`
                (no exact-copy rule).
            instance_queries: `(nq, M'*K')`, the instance model's queries:
                an index made with `instance` answers by both codes
                (`instance_codes`); ignored by one without.

        Returns:
            `(scores, ids)`, float32 and int64 `(nq, min(k, n))`, `n` the
            pictures the filter keeps: per query, the pictures identical to
            it (insertion order), then its copies by the instance code,
            then the rest by decreasing score (equal scores by instance
            score, else in insertion order).
        """
        scores, ids, *_ = self._ranked(queries, k, where, fingerprints, **more)
        return scores, ids

    def answer(
        self, queries, k: int, *, where=None, fingerprints=None, **more
    ) -> list[list[dict]]:
        """`search` (with its `instance_queries`), each result as a row
        (`base.answer_rows`), exact copies of the query marked `"exact":
        True`, and by an index with instance codes, copies `"copy": True`."""
        scores, ids, exact, copy = self._ranked(queries, k, where, fingerprints, **more)
        return answer_rows(self, scores, ids, exact, copy)

    def _search(self, queries, k, where):
        scores, ids, *_ = self._ranked(queries, k, where, None)
        return scores, ids

    def _ranked(self, queries, k, where, fingerprints, instance_queries=None):
        """`(scores, ids, exact, copy)`: the search, which results are exact
        copies of the query, and which its copies by the instance code (None
        unless answered by both codes)."""
        k = self._check_k(k)
        where = filters.as_filter(where)
        with self._lock.read():
            keep = None if where is None else self._items.mask(where)
            copy = None
            if instance_queries is None or self._instance is None:  # by code
                scores, ids = self._codes.search_kept(queries, k, keep)
            else:
                part = shard_part(
                    self._codes, self._instance, queries, instance_queries, k, keep,
                    self._items.rows,
                )  # fmt: skip
                scores, ids, copy = merge_parts([part], k)
            if fingerprints is None or not ids.shape[1]:
                return scores, ids, np.zeros(ids.shape, bool), copy
            fingerprints = check_fingerprints(fingerprints, len(ids))
            found = self._copies(fingerprints, keep, ids.shape[1])
            found = [(copies, codes) for _, copies, codes in found]
            return scores, ids, exact_first(scores, ids, queries, found, copy), copy

    # Persistence --------------------------------------------------------

    def persist(self, path: str | os.PathLike) -> None:
        """`save`: an index held in memory lasts in its file."""
        self.save(path)

    def save(self, path: str | os.PathLike) -> None:
        """Writes codes, ids and the item table atomically to one file."""
        with self._lock.read():
            metadata = {"format": FORMAT, "root": self._root, "next_id": self._next_id}
            if self._shape is not None:
                metadata["image_shape"] = list(self._shape)
            metadata.update(self._codes.file_metadata())
            if self._instance is not None:
                metadata["instance_model"] = self._instance.model
            items = file_format.Items(
                metadata,
                list(self._items.paths),
                self._items.fingerprints,
                self._items.added,
                list(self._items.attributes),
            )
            part = None if self._instance is None else self._instance.file_part()
            with self._codes.contents() as (header, chunks, ids):
                items = dataclasses.replace(
                    items,
                    groups=self._codes.file_groups(),
                    instance=part,
                )
                file_format.write(path, header, chunks, ids, items)

    @classmethod
    def load(cls, path: str | os.PathLike, *, scanner: str = "auto") -> ImageIndex:
        """Reads an index written by `save` (`scanner` as `SubicIndex`'s).

        Raises:
            ValueError: naming the path, for a manifest, a database, a file
                that is not a SuBiC index, or codes without paths (an index
                of a dataset split rather than of a folder).
        """
        if is_manifest(path) or is_database(path):
            raise ValueError(f"ImageIndex.load reads a .subic file, not {path!r}")
        index = read_file(path, scanner=scanner)
        if not isinstance(index, ImageIndex):
            raise ValueError(
                f"{os.fspath(path)!r} holds codes without image paths (an index "
                "of a dataset split, not of a folder); build one from a folder "
                "with `subic index build MODEL DIR --output FILE`"
            )
        return index

    @classmethod
    def from_parts(
        cls, path: str | os.PathLike, codes: SubicIndex, items: file_format.Items
    ) -> ImageIndex:
        """The index of a file's codes and item table (`read_file`), each
        field checked (errors name the path)."""

        def fail(reason: str) -> ValueError:
            return ValueError(
                f"{os.fspath(path)!r} is not a valid SuBiC index file: {reason}"
            )

        try:
            root, shape, next_id = check_table_metadata(items.metadata, FORMAT)
        except ValueError as error:
            raise fail(str(error)) from None
        try:
            paths = check_paths("paths", items.paths)
            attributes = check_attributes(
                "attributes", items.attributes, len(paths), paths
            )
        except (TypeError, ValueError) as error:
            raise fail(str(error)) from None
        assert items.fingerprints is not None and items.added is not None
        index = cls(codes.num_blocks, codes.block_size, root, shape)
        index._codes = codes
        ids = codes.get_ids()
        if items.instance is not None:
            index._instance = InstanceCodes.from_file(path, codes, items)
        index._items.append(ids, paths, items.fingerprints, items.added, attributes)
        index._next_id = max(next_id, int(ids.max()) + 1 if len(ids) else 0)
        return index


def read_file(
    path: str | os.PathLike, *, scanner: str = "auto", folder: str | None = None
) -> SubicIndex | ImageIndex:
    """Opens one `.subic` file: an `ImageIndex` where it records its items'
    paths (a folder's pictures), else a `SubicIndex`.

    The one reader of index files, below everything that opens them
    (`subic_keras.search.open`, `ImageIndex.load`, a Ray shard's actor).

    Args:
        path: the file.
        scanner: what scans its codes (`SubicIndex`'s argument).
        folder: a real folder the file must lie in, links leading out of
            it refused (`file_format.read`).
    """
    header, packed, ids, items = file_format.read(path, folder=folder)
    codes = SubicIndex.from_parts(
        path, header, packed, ids, items=items, scanner=scanner
    )
    if items is None or items.paths is None:
        return codes
    return ImageIndex.from_parts(path, codes, items)
