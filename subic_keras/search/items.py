"""`ItemTable`: what an index records of each item beside its code.

One row per item, in the order of the code store (insertion order):

- `id` (int64): the item's id, the same as the code store's;
- `path` (str): the picture's path relative to the index's folder;
- `class` (str): the path's top folder (`""` at the top), derived from the
  path, the folder layout that training reads classes from;
- `fingerprint` (uint64): a hash of its decoded pixels, 0 if unknown
  (`subic_keras.data.images.fingerprint`), which finds exact copies of a query;
- `added` (float64): when it was added, seconds since 1970 (0 if unknown);
- `attributes`: a small flat JSON object of the user's, or none: at most
  `MAX_ATTRIBUTES` names (letters, digits and `_`, not starting with a
  digit) with values that are strings (at most `MAX_STRING` characters),
  finite numbers or `true`/`false`.

`column(field)` and `attribute(name)` give the columns filters read
(`subic_keras.search.filters`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

from subic_keras.data.paths import is_utf8
from subic_keras.search import filters
from subic_keras.search.checks import preview

MAX_ATTRIBUTES = 32
MAX_STRING = 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def check_paths(name: str, paths) -> list[str]:
    """Relative POSIX paths inside a folder, unique, as a list."""
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


def check_attributes(
    name: str, attributes, count: int, paths: Sequence[str] | None = None
) -> list[dict | None]:
    """`count` attribute objects (or None each), checked as the module says;
    a string must be valid UTF-8 (no lone surrogate, which no answer could
    encode), and the item that holds one is named (by `paths`, or its row)."""
    if attributes is None:
        return [None] * count
    if isinstance(attributes, dict):
        raise TypeError(f"{name} must hold one object per item, received one dict")
    attributes = list(attributes)
    if len(attributes) != count:
        raise ValueError(
            f"{name} must hold one object (or None) per item ({count}), "
            f"received {len(attributes)}"
        )
    for row, values in enumerate(attributes):
        if values is None:
            continue
        if not isinstance(values, dict) or len(values) > MAX_ATTRIBUTES:
            raise ValueError(
                f"{name} must be objects of at most {MAX_ATTRIBUTES} names, "
                f"received {str(values)[:200]}"
            )
        for key, value in values.items():
            if not isinstance(key, str) or not _NAME.match(key):
                raise ValueError(
                    f"{name}: names must be letters, digits and _ (not starting "
                    f"with a digit, at most 64), received {key!r}"
                )
            ok = (
                isinstance(value, bool)
                or (isinstance(value, int) and -(2**63) <= value < 2**63)
                or (isinstance(value, float) and math.isfinite(value))
                or (isinstance(value, str) and len(value) <= MAX_STRING)
            )
            if not ok:
                raise ValueError(
                    f"{name}: values must be strings of at most {MAX_STRING} "
                    "characters, finite numbers (integers of 64 bits), true or "
                    "false; received "
                    f"{key}={str(value)[:100]!r}"
                )
            if isinstance(value, str) and not is_utf8(value):
                item = paths[row] if paths is not None else f"row {row}"
                raise ValueError(
                    f"{name}: strings must be valid UTF-8, received "
                    f"{key}={value[:100]!r} (a lone surrogate) for {item!r}"
                )
    return [dict(values) if values else None for values in attributes]


def check_item_fingerprints(fingerprints, count: int) -> np.ndarray:
    """`count` pixel fingerprints (`subic_keras.data.images.fingerprint`), one
    per picture, as uint64; None: none known (0 each)."""
    if fingerprints is None:
        return np.zeros(count, np.uint64)
    fingerprints = np.asarray(fingerprints)
    if fingerprints.shape != (count,) or fingerprints.dtype.kind not in "ui":
        raise ValueError(
            f"fingerprints must be {count} unsigned integers, one per "
            f"path, received {fingerprints.dtype} {fingerprints.shape}"
        )
    return fingerprints.astype(np.uint64)


def class_of(path: str) -> str:
    """The class a path's folder names: its top folder, `""` at the top."""
    head, slash, _ = path.partition("/")
    return head if slash else ""


def described(item_id, path: str, added, attributes: dict | None) -> dict:
    """An item's fields, as answers show them."""
    return {
        "id": int(item_id),
        "path": path,
        "class": class_of(path),
        "added": float(added),
        "attributes": dict(attributes or {}),
    }


def folders_of(paths: Iterable[str]) -> list[str]:
    """Every folder holding one of `paths`, at any depth, sorted."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        found.update("/".join(parts[: depth + 1]) for depth in range(len(parts)))
    return sorted(found)


class _SortedKeys:
    """Ids and fingerprints sorted once, so that each look-up is a binary
    search rather than a scan of every item."""

    def __init__(self, ids: np.ndarray, fingerprints: np.ndarray):
        self.id_order = np.argsort(ids, kind="stable")
        self.sorted_ids = ids[self.id_order]
        self.fingerprint_order = np.argsort(fingerprints, kind="stable")
        self.sorted_fingerprints = fingerprints[self.fingerprint_order]

    def id_rows(self, ids: np.ndarray) -> np.ndarray:
        if not len(self.sorted_ids):
            return np.full(len(ids), -1, np.int64)
        rank = np.searchsorted(self.sorted_ids, ids)
        rank = np.minimum(rank, len(self.sorted_ids) - 1)
        found = self.sorted_ids[rank] == ids
        return np.where(found, self.id_order[rank], -1)

    def fingerprint_rows(self, fingerprint) -> np.ndarray:
        value = np.uint64(fingerprint)
        lo = np.searchsorted(self.sorted_fingerprints, value, side="left")
        hi = np.searchsorted(self.sorted_fingerprints, value, side="right")
        return np.sort(self.fingerprint_order[lo:hi])


class ItemTable:
    """The items of an index: ids, paths, fingerprints, times, attributes.

    Not locked: the index that owns it changes it under its write lock and
    reads it under its read lock.
    """

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.paths: list[str] = []
        self.fingerprints = np.zeros(0, np.uint64)
        self.added = np.zeros(0, np.float64)
        self.attributes: list[dict | None] = []
        self.row_of_path: dict[str, int] = {}
        self._keys: _SortedKeys | None = None
        self._columns: dict[str, object] = {}
        self._version = 0  # changes with every change, for `masks`
        self.masks = filters.MaskCache()

    def __len__(self) -> int:
        return len(self.paths)

    def append(
        self,
        ids: np.ndarray,
        paths: Sequence[str],
        fingerprints: np.ndarray,
        added: np.ndarray,
        attributes: Sequence[dict | None],
    ) -> None:
        """Appends checked rows (as many of each)."""
        start = len(self.paths)
        self.paths.extend(paths)
        self.row_of_path.update(zip(paths, range(start, start + len(paths))))
        self.ids = np.concatenate([self.ids, ids.astype(np.int64)])
        self.fingerprints = np.concatenate(
            [self.fingerprints, np.asarray(fingerprints, np.uint64)]
        )
        self.added = np.concatenate([self.added, np.asarray(added, np.float64)])
        self.attributes.extend(attributes)
        self._changed()

    def keep(self, mask: np.ndarray) -> None:
        """Keeps the rows where `mask` is true, in order."""
        self.paths = [p for p, keep in zip(self.paths, mask) if keep]
        self.attributes = [a for a, keep in zip(self.attributes, mask) if keep]
        self.row_of_path = {path: row for row, path in enumerate(self.paths)}
        self.ids = self.ids[mask]
        self.fingerprints = self.fingerprints[mask]
        self.added = self.added[mask]
        self._changed()

    def _changed(self) -> None:
        self._keys = None
        self._columns = {}
        self._version += 1

    def mask(self, where: filters.Filter) -> np.ndarray | None:
        """The rows `where` keeps (cached for the table's present state);
        None when it keeps every row."""
        return self.masks.mask(where, self, self._version)

    def keys(self) -> _SortedKeys:
        # Concurrent readers may both build it: the same value, one kept.
        keys = self._keys
        if keys is None:
            keys = self._keys = _SortedKeys(self.ids, self.fingerprints)
        return keys

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of `ids`; KeyError naming unknown ones."""
        rows = self.keys().id_rows(ids)
        if np.any(rows < 0):
            raise KeyError(f"ids not in the index: {preview(ids[rows < 0])}")
        return rows

    def describe(self, rows: np.ndarray) -> list[dict]:
        """Each row's fields, as answers show them."""
        return [
            described(
                self.ids[row], self.paths[row], self.added[row], self.attributes[row]
            )
            for row in rows
        ]

    def folders(self) -> list[str]:
        """Every folder holding a path, at any depth, sorted."""
        cached = self._columns.get("folders")
        if cached is None:
            cached = self._columns["folders"] = folders_of(self.paths)
        assert isinstance(cached, list)
        return list(cached)

    # What filters read (`filters.Columns`), built once per state.

    def column(self, field: str) -> np.ndarray:
        if field == "id":
            return self.ids
        if field == "added":
            return self.added
        cached = self._columns.get(field)
        if cached is None:
            if field == "path":
                values = self.paths
            elif field == "class":
                values = [class_of(path) for path in self.paths]
            else:
                raise ValueError(f"where: unknown field {field!r}")
            cached = self._columns[field] = np.array(values, dtype=object)
        assert isinstance(cached, np.ndarray)
        return cached

    def attribute(self, name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        key = "attrs." + name
        cached = self._columns.get(key)
        if cached is None:
            n = len(self.attributes)
            values = [a.get(name) if a else None for a in self.attributes]
            is_bool = np.fromiter((isinstance(v, bool) for v in values), bool, n)
            is_str = np.fromiter((isinstance(v, str) for v in values), bool, n)
            is_number = np.fromiter(
                (
                    isinstance(v, (int, float)) and not isinstance(v, bool)
                    for v in values
                ),
                bool,
                n,
            )
            numbers = np.array(
                [v if ok else np.nan for v, ok in zip(values, is_number)],
                dtype=np.float64,
            )
            bools = np.array(
                [bool(v) if ok else False for v, ok in zip(values, is_bool)]
            )
            strings = np.empty(n, dtype=object)
            strings[:] = values
            large = np.fromiter(
                (
                    ok and isinstance(v, int) and abs(v) > 2**53
                    for v, ok in zip(values, is_number)
                ),
                bool,
                n,
            )
            cached = self._columns[key] = {
                "number": (is_number, numbers),
                "string": (is_str, strings),
                "bool": (is_bool, bools.astype(bool)),
                "large": (large, strings),
            }
        assert isinstance(cached, dict)
        return cached


class IdColumns:
    """The columns of an index of codes alone: `id`."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def column(self, field: str) -> np.ndarray:
        if field != "id":
            raise _ids_only(field)
        return self.ids

    def attribute(self, name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        raise _ids_only("attrs." + name)


def _ids_only(field: str) -> ValueError:
    return ValueError(
        f"where: this index holds codes and ids only (no paths or attributes), "
        f"so it can be filtered on id alone, received a test on {field!r}"
    )


# Ids are int64 and never negative.
MAX_ID = 2**63 - 1


def check_table_metadata(
    metadata: dict, format_name: str
) -> tuple[str, list | None, int]:
    """`(root, image_shape, next_id)` of an image index file's metadata.

    Raises:
        ValueError: the reason a field is not one a writer writes.
    """
    root = metadata.get("root")
    if metadata.get("format") != format_name or not isinstance(root, str):
        raise ValueError(
            f"its item table is not an image index's (metadata {str(metadata)[:200]})"
        )
    if "\0" in root or not os.path.isabs(root):
        raise ValueError(f"its folder {root[:200]!r} is not an absolute path")
    shape = metadata.get("image_shape")
    if shape is not None and (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(isinstance(s, int) and s >= 1 for s in shape)
    ):
        raise ValueError(f"image_shape {shape!r} is not (H, W, C)")
    next_id = metadata.get("next_id", 0)
    if not isinstance(next_id, int) or not 0 <= next_id <= MAX_ID:
        raise ValueError(f"next_id {next_id!r} is not a count")
    return root, shape, next_id
