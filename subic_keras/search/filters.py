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

import collections
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from subic_keras.search.checks import check_ids
from subic_keras.search.filter_terms import (
    COMPARISONS,
    FIELDS,
    MAX_DEPTH,
    MAX_NESTING,
    Columns,
    Compare,
    Filter,
    Ids,
    In,
    Not,
    Under,
    join,
)

__all__ = [
    "FIELDS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_NESTING",
    "Columns",
    "Filter",
    "MaskCache",
    "Under",
    "as_filter",
    "ids",
    "parse",
]

# Bounds on what a request may ask for: the text's length (long enough for a
# list of thousands of ids); how deep it may nest is `MAX_DEPTH`.
MAX_LENGTH = 1_000_000

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
            values = []
            if not self._keyword("]", kind="symbol"):  # `in []`: no item
                values.append(self._value())
                while self._keyword(",", kind="symbol"):
                    values.append(self._value())
                self._take("]")
            return In(field, tuple(values))
        token = self._peek()
        if token is None or token[1] not in COMPARISONS:
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
            # An integer stays exact, whatever its size: compared as a
            # number, one beyond the 64-bit integers bounds every id.
            return int(raw) if re.fullmatch(r"-?\d+", raw) else number
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
