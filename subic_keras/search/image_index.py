"""`ImageIndex`: a `SubicIndex` of image files, searched by picture, answered by path.

Each item is a picture of a folder: its code and id in a `SubicIndex`, its
path relative to the folder, and a fingerprint of its decoded pixels. One
`.subic` file (format version 2, `file_format`) holds all of it, so the
paths can never drift from the codes.

Ranking is the asymmetric score of `SubicIndex` (paper Sec. 3.3), with one
rule added for pictures: an exact copy of the query (the same pixels at the
model's input size, by fingerprint) is listed first. With the paper's `z*`
query it already has the highest possible score, `sum_m max z*_m`, but it
can tie with other pictures that share its code, and the class-posterior
query scores pictures by class rather than by look; either way, a person who
searches with a picture of the folder expects to see that picture first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from subic_keras.search import file_format
from subic_keras.search.base import ReadWriteLock, check_ids, preview
from subic_keras.search.subic_index import SubicIndex

FORMAT = "subic.image-index"
# Ids are int64 and never negative.
MAX_ID = 2**63 - 1


def _check_paths(name: str, paths) -> list[str]:
    if isinstance(paths, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of paths, received one string")
    paths = list(paths)
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(
                f"{name} must hold str paths, received {type(path).__name__}"
            )
        parts = path.split("/")
        if (
            not path
            or "\0" in path
            or path.startswith("/")
            or any(part in ("", ".", "..") for part in parts)
        ):
            raise ValueError(
                f"{name} must be relative POSIX paths inside the folder (no "
                f"empty, '.' or '..' parts), received {path!r}"
            )
        try:
            path.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{name} must be valid UTF-8, received {path!r}") from None
    if len(set(paths)) != len(paths):
        seen, repeated = set(), []
        for path in paths:
            if path in seen:
                repeated.append(path)
            seen.add(path)
        raise ValueError(f"{name} must be unique, repeated: {repeated[:10]}")
    return paths


class _SortedKeys:
    """Ids and fingerprints sorted once, so that each look-up is a binary
    search rather than a scan of every item (1,000,000 items: microseconds,
    not milliseconds)."""

    def __init__(self, ids: np.ndarray, fingerprints: np.ndarray):
        self.id_order = np.argsort(ids, kind="stable")
        self.sorted_ids = ids[self.id_order]
        self.fingerprint_order = np.argsort(fingerprints, kind="stable")
        self.sorted_fingerprints = fingerprints[self.fingerprint_order]

    def id_rows(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id, -1 where it is absent."""
        if not len(self.sorted_ids):
            return np.full(len(ids), -1, np.int64)
        rank = np.searchsorted(self.sorted_ids, ids)
        rank = np.minimum(rank, len(self.sorted_ids) - 1)
        found = self.sorted_ids[rank] == ids
        return np.where(found, self.id_order[rank], -1)

    def fingerprint_rows(self, fingerprint) -> np.ndarray:
        """The rows whose fingerprint is `fingerprint`, in insertion order."""
        value = np.uint64(fingerprint)
        lo = np.searchsorted(self.sorted_fingerprints, value, side="left")
        hi = np.searchsorted(self.sorted_fingerprints, value, side="right")
        return np.sort(self.fingerprint_order[lo:hi])


class ImageIndex:
    """The codes of a folder's pictures, with each picture's path.

    Example:

    >>> index = ImageIndex(num_blocks=2, block_size=4, root="photos")
    >>> ids = index.add([[0, 1], [2, 3]], ["cats/tom.jpg", "dogs/rex.png"])
    >>> z_star = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    >>> scores, ids = index.search(z_star, k=2)
    >>> index.paths(ids[0]), scores[0].tolist()
    (['dogs/rex.png', 'cats/tom.jpg'], [6.0, 0.0])

    Args:
        num_blocks: `M`, blocks per code.
        block_size: `K`, a power of two in [2, 1024].
        root: the folder the paths are relative to (kept absolute).
        image_shape: the model input `(H, W, C)` the pictures were decoded
            to, recorded so that queries are decoded the same way.
        index: the `SubicIndex` to hold the codes (default: a new one).

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
        self._index = index
        self._root = os.path.abspath(os.fspath(root))
        self._shape = None if image_shape is None else tuple(map(int, image_shape))
        self._ids = np.zeros(0, np.int64)
        self._paths: list[str] = []
        self._fingerprints = np.zeros(0, np.uint64)
        self._row_of_path: dict[str, int] = {}
        self._next_id = 0  # ids are never reused, not even after a remove
        self._sorted: _SortedKeys | None = None  # built on the first look-up
        self._lock = ReadWriteLock()

    # Properties ---------------------------------------------------------

    @property
    def index(self) -> SubicIndex:
        """The `SubicIndex` of the codes (change it only through this object)."""
        return self._index

    @property
    def root(self) -> str:
        """The absolute path of the folder."""
        return self._root

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self._shape

    @property
    def num_blocks(self) -> int:
        return self._index.num_blocks

    @property
    def block_size(self) -> int:
        return self._index.block_size

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, path: object) -> bool:
        return path in self._row_of_path

    def __repr__(self) -> str:
        return (
            f"ImageIndex(num_blocks={self.num_blocks}, block_size="
            f"{self.block_size}, root={self._root!r}, items={len(self)})"
        )

    # Mutation -----------------------------------------------------------

    def add(self, codes, paths: Iterable[str], fingerprints=None) -> np.ndarray:
        """Adds pictures: their codes and paths (and pixel fingerprints).

        All or nothing: everything is checked before the index changes.

        Args:
            codes: codes `(n, M)`, in any form `SubicIndex.add` takes.
            paths: `n` relative POSIX paths under `root`, new to the index.
            fingerprints: `n` uint64 fingerprints of the decoded pixels
                (`subic_keras.images.fingerprint`); default: none (0).

        Returns:
            The int64 ids given to the pictures.

        Raises:
            ValueError: for bad codes or paths, a path already in the index,
                or a count that differs from the codes'.
        """
        paths = _check_paths("paths", paths)
        if fingerprints is None:
            fingerprints = np.zeros(len(paths), np.uint64)
        fingerprints = np.asarray(fingerprints)
        if fingerprints.shape != (len(paths),) or fingerprints.dtype.kind not in "ui":
            raise ValueError(
                f"fingerprints must be {len(paths)} unsigned integers, one per "
                f"path, received {fingerprints.dtype} {fingerprints.shape}"
            )
        with self._lock.write():
            present = [path for path in paths if path in self._row_of_path]
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
            ids = np.arange(self._next_id, self._next_id + len(paths), dtype=np.int64)
            self._index.add(codes, ids=ids)
            self._next_id += len(paths)
            start = len(self._paths)
            self._paths.extend(paths)
            self._row_of_path.update(zip(paths, range(start, start + len(paths))))
            self._ids = np.concatenate([self._ids, ids])
            self._fingerprints = np.concatenate(
                [self._fingerprints, fingerprints.astype(np.uint64)]
            )
            self._sorted = None
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
            missing = [path for path in paths if path not in self._row_of_path]
            if missing:
                raise KeyError(f"paths not in the index: {missing[:10]}")
            rows = np.array([self._row_of_path[p] for p in paths], dtype=np.int64)
            self._index.remove(self._ids[rows])
            kept = np.ones(len(self._paths), bool)
            kept[rows] = False
            self._paths = [p for p, keep in zip(self._paths, kept) if keep]
            self._row_of_path = {path: row for row, path in enumerate(self._paths)}
            self._ids = self._ids[kept]
            self._fingerprints = self._fingerprints[kept]
            self._sorted = None
        return len(rows)

    def _restore(
        self, codes: SubicIndex, paths, fingerprints, shape, next_id: int
    ) -> None:
        """Takes the place of an empty index with a loaded one (`load_index`)."""
        self._index = codes
        self._ids = codes.get_ids()
        self._next_id = max(next_id, int(self._ids.max()) + 1 if len(self._ids) else 0)
        self._paths = paths
        self._row_of_path = {path: row for row, path in enumerate(paths)}
        self._fingerprints = fingerprints
        self._sorted = None
        self._shape = None if shape is None else tuple(shape)

    # Reading ------------------------------------------------------------

    def _keys(self) -> _SortedKeys:
        # Concurrent readers may both build it: the same value, one kept.
        keys = self._sorted
        if keys is None:
            keys = self._sorted = _SortedKeys(self._ids, self._fingerprints)
        return keys

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows (insertion positions) of `ids`; KeyError for unknown ones."""
        rows = self._keys().id_rows(ids)
        if np.any(rows < 0):
            raise KeyError(f"ids not in the index: {preview(ids[rows < 0])}")
        return rows

    def paths(self, ids) -> list[str]:
        """The relative paths of `ids` (1-D), in order.

        Raises:
            KeyError: for an id not in the index.
        """
        ids = check_ids("ids", ids)
        with self._lock.read():
            return [self._paths[row] for row in self._rows(ids)]

    def ids(self, paths: Iterable[str]) -> np.ndarray:
        """The ids of relative `paths`, in order.

        Raises:
            KeyError: for a path not in the index.
        """
        paths = list(paths)
        with self._lock.read():
            missing = [path for path in paths if path not in self._row_of_path]
            if missing:
                raise KeyError(f"paths not in the index: {missing[:10]}")
            return self._ids[[self._row_of_path[p] for p in paths]].astype(np.int64)

    def get_paths(self) -> list[str]:
        """Every path, in insertion order (the order of `get_ids()`)."""
        with self._lock.read():
            return list(self._paths)

    def get_ids(self) -> np.ndarray:
        with self._lock.read():
            return self._ids.copy()

    def file(self, item_id: int) -> str:
        """The real path of a picture's file, checked to lie inside `root`.

        Raises:
            KeyError: for an unknown id.
            PermissionError: the path leads out of the folder (a link).
            FileNotFoundError: the file is gone.
        """
        from subic_keras.paths import resolve

        (relative,) = self.paths([item_id])
        return resolve(self._root, relative)

    def exact_copies(self, fingerprint: int) -> np.ndarray:
        """Ids of the pictures whose pixels have this fingerprint."""
        with self._lock.read():
            return self._ids[self._keys().fingerprint_rows(fingerprint)]

    def search(
        self, queries, k: int, fingerprints=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`SubicIndex.search`, with exact copies of each query listed first.

        Args:
            queries: real `(nq, M*K)` queries.
            k: results per query, >= 1 (at most `len(self)` come back).
            fingerprints: the queries' pixel fingerprints `(nq,)`, or `None`
                (no exact-copy rule).

        Returns:
            `(scores, ids)`, float32 and int64 `(nq, min(k, len(self)))`:
            per query, the pictures identical to it (insertion order), then
            the rest by decreasing score (ties in insertion order).
        """
        with self._lock.read():
            scores, ids = self._index.search(queries, k)
            if fingerprints is None or not ids.shape[1]:
                return scores, ids
            fingerprints = np.asarray(fingerprints, dtype=np.uint64)
            if fingerprints.shape != (len(ids),):
                raise ValueError(
                    f"fingerprints must have shape ({len(ids)},), one per query, "
                    f"received {fingerprints.shape}"
                )
            queries = np.asarray(queries, dtype=np.float32)
            block = np.arange(self.num_blocks) * self.block_size
            keys = self._keys()
            for row, value in enumerate(fingerprints):
                copies = self._ids[keys.fingerprint_rows(value)]
                if value == 0 or not len(copies):
                    continue
                copies = copies[: ids.shape[1]]
                codes = self._index.get_codes(copies)
                copy_scores = queries[row][codes + block].sum(axis=1)
                rest = ~np.isin(ids[row], copies)
                width = ids.shape[1]
                ids[row] = np.concatenate([copies, ids[row][rest]])[:width]
                scores[row] = np.concatenate([copy_scores, scores[row][rest]])[:width]
            return scores, ids

    # Persistence --------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes codes, ids, paths and fingerprints atomically to one file."""
        with self._lock.read():
            metadata = {"format": FORMAT, "root": self._root, "next_id": self._next_id}
            if self._shape is not None:
                metadata["image_shape"] = list(self._shape)
            items = file_format.ItemTable(
                list(self._paths), self._fingerprints, metadata
            )
            self._index.save(path, items=items)

    @classmethod
    def load(cls, path: str | os.PathLike, *, scanner: str = "auto") -> ImageIndex:
        """Reads an index written by `save` (`scanner` as `SubicIndex`'s).

        Raises:
            ValueError: naming the path, for a file that is not a SuBiC
                index, or an index of codes without paths (one built from a
                dataset split rather than a folder).
        """
        index = load_index(path, scanner=scanner)
        if not isinstance(index, ImageIndex):
            raise ValueError(
                f"{os.fspath(path)!r} holds codes without image paths (an index "
                "of a dataset split, not of a folder); build one from a folder "
                "with `subic index build MODEL DIR --output FILE`"
            )
        return index


def load_index(
    path: str | os.PathLike, *, scanner: str = "auto"
) -> SubicIndex | ImageIndex:
    """Opens a `.subic` file: an `ImageIndex` if it records image paths
    (format version 2), else a `SubicIndex` (`scanner` as its constructor's).

    Raises:
        ValueError: naming the path, for a file that is not a valid index.
    """
    header, packed, ids, items = file_format.read(path)
    codes = SubicIndex.from_parts(path, header, packed, ids, scanner=scanner)
    if items is None:
        return codes
    metadata = items.metadata
    if metadata.get("format") != FORMAT or not isinstance(metadata.get("root"), str):
        raise ValueError(
            f"{os.fspath(path)!r} is not a valid SuBiC index file: its item "
            f"table is not an image index's (metadata {str(metadata)[:200]})"
        )
    root = metadata["root"]
    if "\0" in root or not os.path.isabs(root):
        raise ValueError(
            f"{os.fspath(path)!r} is not a valid SuBiC index file: its folder "
            f"{root[:200]!r} is not an absolute path"
        )
    shape = metadata.get("image_shape")
    if shape is not None and (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(isinstance(s, int) and s >= 1 for s in shape)
    ):
        raise ValueError(
            f"{os.fspath(path)!r} is not a valid SuBiC index file: image_shape "
            f"{shape!r} is not (H, W, C)"
        )
    try:
        paths = _check_paths("paths", items.paths)
    except ValueError as error:
        raise ValueError(
            f"{os.fspath(path)!r} is not a valid SuBiC index file: {error}"
        ) from None
    image_index = ImageIndex(header.num_blocks, header.block_size, root)
    next_id = metadata.get("next_id", 0)
    if not isinstance(next_id, int) or not 0 <= next_id <= MAX_ID:
        raise ValueError(
            f"{os.fspath(path)!r} is not a valid SuBiC index file: next_id "
            f"{next_id!r} is not a count"
        )
    image_index._restore(codes, paths, items.fingerprints, shape, next_id)
    return image_index
