"""The terms of a filter: tests on an item's fields and their combinations.

Each term evaluates to one boolean per item (`Filter.mask`), says which
fields it reads, and writes itself as a Milvus expression where Milvus
can evaluate it. `filters` parses the text of the language into them.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import operator
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

FIELDS = ("id", "path", "class", "added")
# The fields of a Milvus collection of codes (`milvus`'s default), and of
# one of a folder's pictures (`milvus_pictures`).
ON_IDS = frozenset({"id"})
ON_PICTURES = frozenset({*FIELDS, "attributes"})
# How deep parentheses and `not`s may nest in a filter's text.
MAX_DEPTH = 32
# How deep a filter's tree may be: a text's nesting (`MAX_DEPTH` levels of
# parentheses or `not`, each an `or` of `and`s) fits; so does one built in
# Python with `&`, `|` and `~`, within the same bound.
MAX_NESTING = 3 * MAX_DEPTH + 4

COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class Columns(Protocol):
    """What a filter reads: one value per item, in the index's order."""

    def __len__(self) -> int: ...

    def column(self, field: str) -> np.ndarray:
        """`id` (int64), `added` (float64), `path` and `class` (str)."""

    def attribute(self, name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Attribute `name` by kind (`"number"`, `"string"`, `"bool"`): a
        mask of the items whose value is of that kind, and the values; and
        `"large"`: a mask of the integers beyond 2**53, and every value as
        stored (objects), which numbers are then compared on exactly."""


class Filter(abc.ABC):
    """A condition on items; `mask(columns)` evaluates it for every item."""

    @abc.abstractmethod
    def mask(self, columns: Columns) -> np.ndarray:
        """One boolean per item: whether it may be returned."""

    @abc.abstractmethod
    def fields(self) -> set[str]:
        """The fields the filter reads."""

    @abc.abstractmethod
    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        """The same condition as a Milvus filter expression, on the fields
        a collection `held` (a collection of codes: `ON_IDS`; of a folder's
        pictures: `ON_PICTURES`, each attribute kept under its kind and
        name, `milvus_attribute_key`).

        Raises:
            ValueError: the filter reads a field the collection lacks.
        """

    def cache_key(self) -> str | None:
        """What identifies the filter in a `MaskCache` (None: not cached)."""
        return str(self)

    @property
    def depth(self) -> int:
        """How deep the filter nests (a test: 1); at most `MAX_NESTING`."""
        return 1

    def __and__(self, other: Filter) -> Filter:
        return join("and", self, other)

    def __or__(self, other: Filter) -> Filter:
        return join("or", self, other)

    def __invert__(self) -> Filter:
        return Not(self)


def _literal(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    return "true" if value is True else "false" if value is False else repr(value)


_MILVUS_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def milvus_literal(value) -> str:
    """`value` as Milvus's expressions write it: a string in double quotes,
    with backslash escapes for the four characters that need one (Milvus
    reads no escape by code point), any other character as itself."""
    if isinstance(value, str):
        return f'"{value.translate(_MILVUS_ESCAPES)}"'
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return _literal(float(value))  # Milvus reads 64-bit integers only
    return _literal(value)


def attribute_kind(value) -> str:
    """The kind of an attribute's value: `"bool"`, `"number"` or `"string"`
    (a filter compares values of one kind only)."""
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else "string"


def milvus_attribute_key(name: str, value) -> str:
    """The key of attribute `name` in a Milvus collection's `attributes`:
    its kind and its name (`"number:year"`), so that a test reads the
    values of its own kind alone, as `mask` does."""
    return f"{attribute_kind(value)}:{name}"


def _present(key: str, test: str) -> str:
    """`test` of an attribute's `key`, false (not null) where an item lacks
    the key: Milvus's null would make `not (test)` false there too, where
    `mask` makes it true."""
    return f"(exists {key} and {test})"


def _on_milvus(field: str, held: frozenset[str], value=None) -> str:
    """`field` as a Milvus expression names it, checked to be held (and
    `value`, where given, to be of its kind)."""
    if field.startswith("attrs.") and "attributes" in held:
        return f'attributes["{milvus_attribute_key(field[6:], value)}"]'
    if field not in held:
        raise ValueError(
            "where: a Milvus collection holds ids and codes only, so it can be "
            f"filtered on id alone, received a test on {field!r}"
        )
    if value is not None:
        numeric = field in ("id", "added")
        _check_kind(field, np.zeros(0, np.float64 if numeric else object), value)
    return field


@dataclasses.dataclass(frozen=True)
class Compare(Filter):
    """`field op value`."""

    field: str
    op: str
    value: Any

    def mask(self, columns: Columns) -> np.ndarray:
        compare = COMPARISONS[self.op]
        if self.field.startswith("attrs."):
            return _attribute_mask(columns, self.field[6:], compare, self.value)
        column = columns.column(self.field)
        _check_kind(self.field, column, self.value)
        op, value = self.op, self.value
        if column.dtype.kind in "iu":
            op, value = _on_integers(self.field, op, value)
            if isinstance(value, bool):  # every item, or none
                return np.full(len(column), value)
            value = np.int64(value)
        elif column.dtype == object:
            # A 0-d object array keeps the string as given: NumPy would
            # make a `str_` of it, which drops trailing NULs.
            value = np.array(value, dtype=object)
        return np.asarray(COMPARISONS[op](column, value), dtype=bool)

    def fields(self) -> set[str]:
        return {self.field}

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        if self.field.startswith("attrs.") and isinstance(self.value, bool):
            _check_bool_test(self.field[6:], COMPARISONS[self.op], self.value)
        field = _on_milvus(self.field, held, self.value)
        if field == "id":  # as `mask` compares: no refusal of a bound past all
            op, value = _on_integers(field, self.op, self.value)
            if isinstance(value, bool):
                return "id >= 0" if value else "id < 0"  # every item, or none
            return f"id {op} {value}"
        test = f"{field} {self.op} {milvus_literal(self.value)}"
        return _present(field, test) if self.field.startswith("attrs.") else test

    def __str__(self) -> str:
        return f"{self.field} {self.op} {_literal(self.value)}"


@dataclasses.dataclass(frozen=True)
class In(Filter):
    """`field in [values]`."""

    field: str
    values: tuple

    def mask(self, columns: Columns) -> np.ndarray:
        if self.field.startswith("attrs."):
            out = np.zeros(len(columns), bool)
            for value in self.values:
                out |= _attribute_mask(columns, self.field[6:], operator.eq, value)
            return out
        column = columns.column(self.field)
        for value in self.values:
            _check_kind(self.field, column, value)
        if column.dtype.kind in "iu":
            # Only the integers among the values can equal an integer id.
            tests = [_on_integers(self.field, "==", v) for v in self.values]
            integers = [v for _, v in tests if not isinstance(v, bool)]
            return np.isin(column, np.array(integers, dtype=np.int64))
        if column.dtype.kind == "f":
            return np.isin(column, np.array(self.values, dtype=column.dtype))
        wanted = set(self.values)
        return np.fromiter((v in wanted for v in column), bool, len(column))

    def fields(self) -> set[str]:
        return {self.field}

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        if not self.values:
            return "id < 0"  # no item
        fields = [_on_milvus(self.field, held, value) for value in self.values]
        if self.field == "id":  # the integers among the values, as `mask`
            tested = [_on_integers("id", "==", value) for value in self.values]
            wanted = [str(v) for _, v in tested if not isinstance(v, bool)]
            return f"id in [{', '.join(wanted)}]" if wanted else "id < 0"
        if not self.field.startswith("attrs."):
            return f"{fields[0]} in [{', '.join(map(milvus_literal, self.values))}]"
        # Milvus takes `in` on fields only: an attribute's values one by one,
        # each compared under its kind's key.
        tests = [
            _present(f, f"{f} == {milvus_literal(v)}")
            for f, v in zip(fields, self.values)
        ]
        return " or ".join(tests)

    def __str__(self) -> str:
        return f"{self.field} in [{', '.join(_literal(v) for v in self.values)}]"


@dataclasses.dataclass(frozen=True)
class Under(Filter):
    """`path under folder`: paths in `folder` or below it (surrounding
    slashes ignored)."""

    folder: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", self.folder.strip("/"))

    def mask(self, columns: Columns) -> np.ndarray:
        paths = columns.column("path")
        if not self.folder:
            return np.ones(len(paths), bool)
        prefix = self.folder + "/"
        return np.fromiter((p.startswith(prefix) for p in paths), bool, len(paths))

    def fields(self) -> set[str]:
        return {"path"}

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        _on_milvus("path", held)
        if not self.folder:
            return "id >= 0"  # every item
        # The paths that start with "folder/": those from it up to "folder0",
        # "0" being the character after "/".
        low, high = milvus_literal(self.folder + "/"), milvus_literal(self.folder + "0")
        return f"path >= {low} and path < {high}"

    def __str__(self) -> str:
        return f"path under {_literal(self.folder)}"


@dataclasses.dataclass(frozen=True)
class Ids(Filter):
    """The items whose id is one of `values`."""

    values: np.ndarray

    def mask(self, columns: Columns) -> np.ndarray:
        return np.isin(columns.column("id"), self.values)

    def fields(self) -> set[str]:
        return {"id"}

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        return f"id in [{', '.join(str(int(v)) for v in self.values)}]"

    def cache_key(self) -> str | None:
        return None  # a set of ids is as costly to key as to evaluate

    def __str__(self) -> str:
        return f"id in [{', '.join(str(int(v)) for v in self.values)}]"


@dataclasses.dataclass(frozen=True)
class Join(Filter):
    """`parts[0] and parts[1] and …`, or the same with `or` (`op`).

    A chain of one operator is one `Join` of all its parts (`join`), so
    that a filter of 10,000 `or`ed tests is evaluated, printed and pickled
    by loops, not by 10,000 nested calls: only parentheses and `not`s
    nest, at most `MAX_NESTING` deep.
    """

    op: str  # "and" or "or"
    parts: tuple[Filter, ...]

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_depth", 1 + max((part.depth for part in self.parts), default=0)
        )
        _check_nesting(self)

    @property
    def depth(self) -> int:
        return self._depth  # type: ignore[attr-defined]

    def mask(self, columns: Columns) -> np.ndarray:
        combine = np.logical_and if self.op == "and" else np.logical_or
        out = self.parts[0].mask(columns).copy()
        for part in self.parts[1:]:
            combine(out, part.mask(columns), out=out)
        return out

    def fields(self) -> set[str]:
        return set().union(*(part.fields() for part in self.parts))

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        return f" {self.op} ".join(f"({part.milvus(held)})" for part in self.parts)

    def cache_key(self) -> str | None:
        if any(part.cache_key() is None for part in self.parts):
            return None
        return str(self)

    def __str__(self) -> str:
        return f" {self.op} ".join(f"({part})" for part in self.parts)


def join(op: str, *filters: Filter) -> Join:
    """`filters` joined by `op` (`"and"` or `"or"`), a `Join` of that
    operator contributing its parts rather than nesting."""
    parts: list[Filter] = []
    for item in filters:
        if isinstance(item, Join) and item.op == op:
            parts.extend(item.parts)
        else:
            parts.append(item)
    return Join(op, tuple(parts))


@dataclasses.dataclass(frozen=True)
class Not(Filter):
    """Not `inner`."""

    inner: Filter

    def __post_init__(self) -> None:
        _check_nesting(self)

    @property
    def depth(self) -> int:
        return 1 + self.inner.depth

    def mask(self, columns: Columns) -> np.ndarray:
        return ~self.inner.mask(columns)

    def fields(self) -> set[str]:
        return self.inner.fields()

    def milvus(self, held: frozenset[str] = ON_IDS) -> str:
        return f"not ({self.inner.milvus(held)})"

    def cache_key(self) -> str | None:
        return None if self.inner.cache_key() is None else str(self)

    def __str__(self) -> str:
        return f"not ({self.inner})"


def _check_nesting(combined: Filter) -> None:
    if combined.depth > MAX_NESTING:
        raise ValueError(
            f"where: a filter may nest at most {MAX_NESTING} deep (parentheses, "
            f"nots and alternating and/or), received one {combined.depth} deep"
        )


def _check_kind(field: str, column: np.ndarray, value) -> None:
    """A built-in field compared with a value of its own kind, or an error."""
    numeric = column.dtype.kind in "iuf"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric != is_number:
        kind = "a number" if numeric else "a string"
        raise ValueError(
            f"where: {field} is {kind}, received {_literal(value)} "
            f"({type(value).__name__})"
        )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The largest integer below which every integer is a float64 exactly.
_EXACT_FLOAT = 2**53


def _on_integers(field: str, op: str, value) -> tuple[str, int | bool]:
    """`field op value` on an integer column, as a test against an int64
    (`(op, int)`), or `(op, True/False)` when it holds for every item or
    none: a float that is not an integer equals no id, and bounds the
    others between its floor and ceiling.

    A value beyond the 64-bit integers (`id < 1e300`) is compared as a
    number too: every id is below it, so the test holds for all or none.
    """
    if not INT64_MIN <= value <= INT64_MAX:
        above = value > INT64_MAX
        holds = {"==": False, "!=": True, "<": above, "<=": above}
        return op, holds.get(op, not above)
    if isinstance(value, int) or value.is_integer():
        return op, int(value)
    if op in ("==", "!="):
        return op, op == "!="
    low, high = math.floor(value), math.ceil(value)
    return {"<": ("<=", low), "<=": ("<=", low), ">": (">=", high)}.get(
        op, (">=", high)
    )


def _check_bool_test(name: str, compare, value) -> None:
    if compare not in (operator.eq, operator.ne):
        raise ValueError(
            f"where: true and false compare with == and != only, received "
            f"attrs.{name} compared with {_literal(value)}"
        )


def _attribute_mask(columns: Columns, name: str, compare, value) -> np.ndarray:
    kind = attribute_kind(value)
    present, values = columns.attribute(name)[kind]
    if kind == "bool":
        _check_bool_test(name, compare, value)
    exact = kind == "number" and (
        (isinstance(value, int) and abs(value) > _EXACT_FLOAT)
        or bool(columns.attribute(name)["large"][0].any())
    )
    if exact:
        # Integers beyond 2**53 are not all float64s: compared as Python
        # compares an int with an int or a float, exactly.
        values = columns.attribute(name)["large"][1]
    if kind == "string" or exact:
        hits = np.fromiter(
            (ok and compare(v, value) for ok, v in zip(present, values)),
            bool,
            len(present),
        )
        return hits
    with np.errstate(invalid="ignore"):
        return present & np.asarray(compare(values, value), dtype=bool)
