"""Filters: the items a search may return (`search(queries, k, where=...)`).

A filter is an expression over each item's fields:

    class == "cat" and path under "holidays/2024"
    id in [3, 17, 42] or (attrs.year >= 2020 and not attrs.favourite == true)

Fields:

- `id`: the item's id (every index);
- `path`: its path relative to the folder (a folder's index);
- `class`: the path's top folder, `""` for a picture at the top (the
  folder layout `subic train --images` learns classes from);
- `added`: when it was added, in seconds since 1970 (0 when unknown: an
  index written before items recorded it);
- `attrs.NAME`: one of its attributes (`ImageIndex.add(..., attributes=)`).

Tests are `FIELD OP VALUE` with `==`, `!=`, `<`, `<=`, `>`, `>=`;
`FIELD in [VALUE, ...]`; and `path under "FOLDER"` (the pictures in that
folder or below it, at a folder boundary: `"a/b"` holds `a/b/c.jpg`, not
`a/bc.jpg`). They combine with `not`, `and`, `or` (binding in that order)
and parentheses. Values are numbers, strings in single or double quotes
(a backslash escapes the next character), `true` and `false`. A test on an
item that has no such attribute, or one of another type, is false.

In Python, `where` may also be a `Filter` (`parse(text)`, `ids(values)`)
or any sequence of ids. The filter is evaluated to one boolean per item
and the scan skips the others (`subic_keras.search.scanners`): the result
is the exact top `k` among the items kept, or all of them when fewer are.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import json
import math
import operator
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from subic_keras.search.checks import check_ids

FIELDS = ("id", "path", "class", "added")
# Bounds on what a request may ask for: the text's length (long enough for a
# list of thousands of ids) and the depth of nested parentheses and `not`s.
MAX_LENGTH = 1_000_000
MAX_DEPTH = 32
# How deep a filter's tree may be: a text's nesting (`MAX_DEPTH` levels of
# parentheses or `not`, each an `or` of `and`s) fits; so does one built in
# Python with `&`, `|` and `~`, within the same bound.
MAX_NESTING = 3 * MAX_DEPTH + 4

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<symbol>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)
    )""",
    re.VERBOSE,
)
_ATTRIBUTE = re.compile(r"attrs\.[A-Za-z_][A-Za-z0-9_]*\Z")


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
    def milvus(self) -> str:
        """The same condition as a Milvus filter expression (on `id`)."""

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


def _not_on_milvus(field: str) -> ValueError:
    return ValueError(
        f"where: a Milvus collection holds ids and codes only, so it can be "
        f"filtered on id alone, received a test on {field!r}"
    )


@dataclasses.dataclass(frozen=True)
class Compare(Filter):
    """`field op value`."""

    field: str
    op: str
    value: Any

    def mask(self, columns: Columns) -> np.ndarray:
        compare = _COMPARE[self.op]
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
        return np.asarray(_COMPARE[op](column, value), dtype=bool)

    def fields(self) -> set[str]:
        return {self.field}

    def milvus(self) -> str:
        if self.field != "id":
            raise _not_on_milvus(self.field)
        return f"id {self.op} {_literal(self.value)}"

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

    def milvus(self) -> str:
        if self.field != "id":
            raise _not_on_milvus(self.field)
        return f"id in [{', '.join(_literal(v) for v in self.values)}]"

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

    def milvus(self) -> str:
        raise _not_on_milvus("path")

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

    def milvus(self) -> str:
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

    def milvus(self) -> str:
        return f" {self.op} ".join(f"({part.milvus()})" for part in self.parts)

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

    def milvus(self) -> str:
        return f"not ({self.inner.milvus()})"

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


class MaskCache:
    """The masks of the last `size` filters evaluated on one state of an
    index: a search repeated with the same filter (a page's folder, an
    album) reads its mask instead of evaluating it on every item again.

    Args:
        size: masks kept (each one byte per item), the least recently used
            dropped first.
    """

    def __init__(self, size: int = 16):
        self._size = size
        self._masks: collections.OrderedDict[str, np.ndarray | None] = (
            collections.OrderedDict()
        )
        self._state: object = None
        self._lock = threading.Lock()

    def mask(self, where: Filter, columns: Columns, state: object) -> np.ndarray | None:
        """`where.mask(columns)`, read-only, from the cache if `state` (what
        changes whenever the items do) is the one it was computed for; None
        when it keeps every item (a search needs no filter then)."""
        key = where.cache_key()
        if key is None:
            return _unless_all(where.mask(columns))
        with self._lock:
            if state != self._state:
                self._masks.clear()
                self._state = state
            if key in self._masks:
                self._masks.move_to_end(key)
                return self._masks[key]
        mask = _unless_all(where.mask(columns))
        if mask is not None:
            mask.flags.writeable = False
        with self._lock:
            if state == self._state:
                self._masks[key] = mask
                while len(self._masks) > self._size:
                    self._masks.popitem(last=False)
        return mask


def _unless_all(mask: np.ndarray) -> np.ndarray | None:
    return None if mask.all() else mask


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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# The largest integer below which every integer is a float64 exactly.
_EXACT_FLOAT = 2**53


def _on_integers(field: str, op: str, value) -> tuple[str, int | bool]:
    """`field op value` on an integer column, as a test against an int64
    (`(op, int)`), or `(op, True/False)` when it holds for every item or
    none: a float that is not an integer equals no id, and bounds the
    others between its floor and ceiling.

    Raises:
        ValueError: for a value beyond the 64-bit integers.
    """
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(
            f"where: {field} is a 64-bit integer, received {_literal(value)}, "
            "beyond its range"
        )
    if isinstance(value, int) or value.is_integer():
        return op, int(value)
    if op in ("==", "!="):
        return op, op == "!="
    low, high = math.floor(value), math.ceil(value)
    return {"<": ("<=", low), "<=": ("<=", low), ">": (">=", high)}.get(
        op, (">=", high)
    )


def _attribute_mask(columns: Columns, name: str, compare, value) -> np.ndarray:
    kind = (
        "bool"
        if isinstance(value, bool)
        else "number"
        if isinstance(value, (int, float))
        else "string"
    )
    present, values = columns.attribute(name)[kind]
    if kind == "bool" and compare not in (operator.eq, operator.ne):
        raise ValueError(
            f"where: true and false compare with == and != only, received "
            f"attrs.{name} compared with {_literal(value)}"
        )
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


def ids(values) -> Filter:
    """The filter keeping the items whose id is in `values`."""
    checked = check_ids("where", values)
    return Ids(np.unique(checked))


def as_filter(where) -> Filter | None:
    """`where` as a `Filter`: an expression, a `Filter`, ids, or None.

    Raises:
        ValueError: naming the problem and where in the text it lies.
        TypeError: for a `where` of another type.
    """
    if where is None or isinstance(where, Filter):
        return where
    if isinstance(where, str):
        return parse(where)
    if isinstance(where, (bytes, dict)):
        raise TypeError(
            f"where must be a filter expression (str), a Filter or ids, "
            f"received {type(where).__name__}"
        )
    if isinstance(where, (np.ndarray, Sequence, set, frozenset)):
        values = list(where) if isinstance(where, (set, frozenset)) else where
        return ids(np.asarray(values, dtype=np.int64) if not len(values) else values)
    raise TypeError(
        f"where must be a filter expression (str), a Filter or ids, received "
        f"{type(where).__name__}"
    )


class _Parser:
    """Recursive descent over the grammar of the module docstring."""

    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, Any, int]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                if not text[position:].strip():
                    break
                raise self._error(
                    f"unexpected character {text[position:].lstrip()[:1]!r}",
                    len(text) - len(text[position:].lstrip()),
                )
            kind = match.lastgroup or ""
            raw = match.group(kind)
            self.tokens.append((kind, raw, match.start(kind)))
            position = match.end()
        self.at = 0

    def _error(self, what: str, position: int | None = None) -> ValueError:
        if position is None:
            position = (
                self.tokens[self.at][2]
                if self.at < len(self.tokens)
                else len(self.text)
            )
        return ValueError(
            f"where: {what} at position {position} of {self.text[:200]!r}"
        )

    def _peek(self) -> tuple[str, Any, int] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(
        self, raw: str | None = None, kind: str | None = None
    ) -> tuple[str, Any, int]:
        token = self._peek()
        if (
            token is None
            or (raw is not None and token[1] != raw)
            or (kind is not None and token[0] != kind)
        ):
            found = "the end" if token is None else repr(token[1])
            wanted = repr(raw) if raw is not None else f"a {kind}"
            raise self._error(f"expected {wanted}, found {found}")
        self.at += 1
        return token

    def _keyword(self, word: str, kind: str = "name") -> bool:
        token = self._peek()
        if token is not None and token[0] == kind and token[1] == word:
            self.at += 1
            return True
        return False

    def parse(self) -> Filter:
        if not self.tokens:
            raise ValueError("where: the filter expression is empty")
        result = self._or(0)
        left = self._peek()
        if left is not None:
            raise self._error(f"unexpected {left[1]!r}")
        return result

    def _or(self, depth: int) -> Filter:
        parts = [self._and(depth)]
        while self._keyword("or"):
            parts.append(self._and(depth))
        return parts[0] if len(parts) == 1 else join("or", *parts)

    def _and(self, depth: int) -> Filter:
        parts = [self._not(depth)]
        while self._keyword("and"):
            parts.append(self._not(depth))
        return parts[0] if len(parts) == 1 else join("and", *parts)

    def _not(self, depth: int) -> Filter:
        if depth > MAX_DEPTH:
            raise self._error(f"more than {MAX_DEPTH} nested parentheses or nots")
        if self._keyword("not"):
            return Not(self._not(depth + 1))
        token = self._peek()
        if token is not None and token[1] == "(":
            self.at += 1
            inner = self._or(depth + 1)
            self._take(")")
            return inner
        return self._test()

    def _test(self) -> Filter:
        _, field, position = self._take(kind="name")
        if field not in FIELDS and not _ATTRIBUTE.match(field):
            raise self._error(
                f"unknown field {field!r} (fields: {', '.join(FIELDS)}, attrs.NAME)",
                position,
            )
        if self._keyword("under"):
            if field != "path":
                raise self._error(f"'under' applies to path, received {field!r}")
            folder = self._value()
            if not isinstance(folder, str):
                raise self._error("'under' takes a folder in quotes")
            return Under(folder)
        if self._keyword("in"):
            self._take("[")
            values = [self._value()]
            while self._keyword(",", kind="symbol"):
                values.append(self._value())
            self._take("]")
            return In(field, tuple(values))
        token = self._peek()
        if token is None or token[1] not in _COMPARE:
            found = "the end" if token is None else repr(token[1])
            raise self._error(
                f"expected a comparison (==, !=, <, <=, >, >=, in, under) after "
                f"{field!r}, found {found}"
            )
        self.at += 1
        return Compare(field, token[1], self._value())

    def _value(self):
        token = self._peek()
        if token is None:
            raise self._error("expected a value, found the end")
        kind, raw, _ = token
        self.at += 1
        if kind == "number":
            number = float(raw)
            if not np.isfinite(number):
                raise self._error(f"number {raw} is out of range")
            if not re.fullmatch(r"-?\d+", raw):
                return number
            if not _INT64_MIN <= int(raw) <= _INT64_MAX:
                raise self._error(f"integer {raw[:40]} is beyond the 64-bit integers")
            return int(raw)
        if kind == "string":
            return re.sub(r"\\(.)", r"\1", raw[1:-1])
        if kind == "name" and raw in ("true", "false"):
            return raw == "true"
        self.at -= 1
        raise self._error(
            f"expected a value (number, quoted string, true, false), found {raw!r}"
        )


def parse(text: str) -> Filter:
    """The `Filter` an expression (module docstring) describes.

    Example:

    >>> str(parse("class == 'cat' and not id in [3, 4]"))
    '(class == "cat") and (not (id in [3, 4]))'

    Raises:
        ValueError: naming what is wrong and where in the text.
    """
    if not isinstance(text, str):
        raise TypeError(f"where must be a string, received {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ValueError(
            f"where: the filter expression must be at most {MAX_LENGTH} characters, "
            f"received {len(text)}"
        )
    return _Parser(text).parse()
