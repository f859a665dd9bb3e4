"""The search backend interface, its conventions, and the input checks it shares.

Every backend searches a database of SuBiC codes, integer codes `c` of `M`
blocks with values in `[0, K)`, with real queries `z*` of width `M * K`
(block `m` in columns `[m*K, (m+1)*K)`), scored asymmetrically with `M`
additions (paper Sec. 3.3, Eq. 8):

    score(z*, c) = sum_m z*[m*K + c_m]

Conventions, shared by every backend:

- Ties. Returned rows are sorted by score, highest first, and equal scores
  by insertion order (earlier first). Which of several items tied exactly at
  the k-th score make the cut is up to the backend: deterministic for a
  given database and query batch, but not specified.
- Result width. Results have `min(k, len(backend))` columns: a `k` beyond
  the database returns what it holds, so no `k` costs more memory than
  ranking every item.
- Missing results. A slot without an item (in `merge_results`, when the
  merged lists hold fewer than `k` items) has id `-1` and score `-inf`
  (`search`) or `-1` (`search_codes`), as faiss does.
- Ids are int64 and `>= 0`; `add` without ids continues after the largest id
  present. A rejected `add` or `remove` leaves the database as it was.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np

from subic_keras._validation import check_finite, check_int

MAX_BLOCK_SIZE = 1024
# The native scan sums 8-bit table entries of up to 16 blocks in 16 bits;
# 4,096 blocks (over 4,000 bytes a code) is far beyond any SuBiC model.
MAX_NUM_BLOCKS = 4096


class Searcher(abc.ABC):
    """Searches a database of SuBiC codes (the read side of a backend).

    The public methods check their arguments once, then call the backend's
    private ones: a backend implements `num_blocks`, `block_size`, `__len__`
    and `_search` (checked queries, `k >= 1`), and `search_codes` (symmetric
    search) comes from it.
    """

    # The most results a backend returns per query (None: no limit).
    max_k: int | None = None
    # Queries per `_search` call (`search_codes`, sharded searches).
    _query_chunk = 1024

    @property
    @abc.abstractmethod
    def num_blocks(self) -> int:
        """`M`, blocks per code."""

    @property
    @abc.abstractmethod
    def block_size(self) -> int:
        """`K`, values per block."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of items."""

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Asymmetric search: the `k` best items for each real query `z*`.

        Args:
            queries: real `(nq, M*K)` array (e.g. SuBiC's ReLU output `z*`).
            k: results per query, >= 1; a `k` beyond `len(self)` returns
                every item.

        Returns:
            `(scores, ids)`: float32 and int64 `(nq, min(k, len(self)))`,
            sorted as the module docstring states.

        Raises:
            ValueError: for a bad shape, NaN/inf queries or a bad `k`.
        """
        k = self._check_k(k)
        queries = check_queries("queries", queries, self.num_blocks, self.block_size)
        return self._search(queries, k)

    def search_codes(self, codes, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Symmetric search: ranks stored codes by the number of equal blocks.

        `score(q, c) = #{m : q_m == c_m}`, an integer in `[0, M]`: the
        asymmetric score of the query's one-hot vector.

        Args:
            codes: query codes, in any form `check_codes` accepts.
            k: results per query, >= 1.

        Returns:
            `(scores, ids)`: int32 and int64 `(nq, min(k, len(self)))`.
        """
        k = self._check_k(k)
        codes = check_codes("codes", codes, self.num_blocks, self.block_size)
        return search_codes_with(
            self._search, codes, min(k, len(self)), self.block_size, self._query_chunk
        )

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`search` of checked float32 queries."""

    def _check_k(self, k) -> int:
        k = check_int("k", k, minimum=1)
        if self.max_k is not None and k > self.max_k:
            raise ValueError(
                f"k must be <= {self.max_k} ({type(self).__name__}'s limit), "
                f"received {k}"
            )
        return k

    def _checked_additions(self, codes, ids) -> tuple[np.ndarray, np.ndarray | None]:
        """`add`'s arguments checked: codes `(n, M)`, and unique ids or None."""
        codes = check_codes("codes", codes, self.num_blocks, self.block_size)
        if ids is not None:
            ids = check_ids("ids", ids, length=len(codes))
            repeated = duplicates(ids)
            if repeated.size:
                raise ValueError(f"ids must be unique, repeated: {preview(repeated)}")
        return codes, ids


class SearchBackend(Searcher):
    """A searchable, mutable, persistent database of SuBiC codes.

    On top of `Searcher`: `add` with ids, `remove`, `get_ids`, `get_codes`,
    `save` and `load`. A new backend (another engine, a remote database)
    implements these with the conventions of the module docstring, and its
    results then equal `SubicIndex`'s up to the order of exact ties.
    """

    @abc.abstractmethod
    def add(self, codes, ids=None) -> np.ndarray:
        """Adds codes (`check_codes` forms) with unique ids; returns the ids."""

    @abc.abstractmethod
    def remove(self, ids) -> int:
        """Removes items by id, all or nothing; returns how many were removed.

        Raises:
            KeyError: if any id is not present (none is removed).
        """

    @abc.abstractmethod
    def get_ids(self) -> np.ndarray:
        """The ids, in insertion order."""

    @abc.abstractmethod
    def get_codes(self, ids=None) -> np.ndarray:
        """Integer codes `(n, M)` of `ids` (default: all, in insertion order)."""

    @abc.abstractmethod
    def save(self, path: str | os.PathLike) -> None:
        """Writes the database atomically to `path`."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | os.PathLike) -> SearchBackend:
        """Reads a database written by `save`, verifying it first."""

    def score_all(self, queries, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """Scores of every query against every item, `(nq, n)`, and the ids.

        Columns follow the ids in increasing order; the scores are those of
        `search` with `k = len(self)`, so they are exactly the backend's.
        The ids and the scores come from one state of the index: a backend
        with a lock holds it throughout (`_snapshot`); on one without, an add
        or remove that lands in between is detected and raised, never
        returned as other items' scores.

        Raises:
            RuntimeError: the index changed while it was scored (a backend
                without a lock only).
        """
        with self._snapshot():
            ids = np.sort(self._snapshot_ids())
            scores = np.empty((len(queries), len(ids)), np.float32)
            if not len(ids):
                return scores, ids
            for start in range(0, len(queries), chunk):
                part, found = self._snapshot_search(
                    queries[start : start + chunk], len(ids)
                )
                columns = np.minimum(np.searchsorted(ids, found), len(ids) - 1)
                if part.shape[1] != len(ids) or not np.array_equal(ids[columns], found):
                    raise RuntimeError(
                        "the index changed while it was scored (an add or remove "
                        "ran at the same time); score it again"
                    )
                rows = scores[start : start + len(part)]
                np.put_along_axis(rows, columns, part, axis=1)
        return scores, ids

    def _snapshot(self) -> contextlib.AbstractContextManager:
        """Holds the index still for `score_all`; none by default."""
        return contextlib.nullcontext()

    def _snapshot_ids(self) -> np.ndarray:
        """The ids, inside `_snapshot`."""
        return self.get_ids()

    def _snapshot_search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`search`, inside `_snapshot`."""
        return self.search(queries, k)


class ReadWriteLock:
    """Many concurrent readers or one writer; waiting writers go first."""

    _ranks = itertools.count()

    def __init__(self):
        # A total order over every lock, in which code that takes several
        # (`ShardedSubicIndex`) takes them, so that no two can deadlock.
        self.rank = next(ReadWriteLock._ranks)
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


# Input checks -------------------------------------------------------------


def check_num_blocks(num_blocks: int) -> int:
    """`num_blocks` must be at most `MAX_NUM_BLOCKS`."""
    if num_blocks > MAX_NUM_BLOCKS:
        raise ValueError(
            f"num_blocks={num_blocks} is too large: search supports up to "
            f"{MAX_NUM_BLOCKS} blocks"
        )
    return num_blocks


def check_block_size(block_size: int) -> int:
    """`block_size` must be a power of two in `[2, MAX_BLOCK_SIZE]`."""
    if block_size & (block_size - 1) or block_size > MAX_BLOCK_SIZE:
        raise ValueError(
            "block_size must be a power of two between 2 and "
            f"{MAX_BLOCK_SIZE} (codes are stored with log2(block_size) bits "
            f"per block), received {block_size}"
        )
    return block_size


def _as_2d(name: str, array) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array, received shape {array.shape}; "
            "reshape a single item with .reshape(1, -1)"
        )
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, received dtype {array.dtype}")
    return array


def check_codes(
    name: str, codes, num_blocks: int, block_size: int, chunk: int = 65_536
) -> np.ndarray:
    """Integer codes `(n, M)`, or per-block vectors `(n, M*K)` -> argmax.

    Example:

    >>> check_codes("codes", [[0.1, 0.9, 0.8, 0.2]], num_blocks=2, block_size=2)
    array([[1, 0]], dtype=uint8)

    Returns:
        uint8 codes (uint16 for `K > 256`), `(n, M)`.

    Raises:
        ValueError: naming `name`, for a wrong shape or dtype, values outside
            `[0, K)`, NaN or inf.
    """
    codes = _as_2d(name, codes)
    width = codes.shape[1]
    dtype = np.uint8 if block_size <= 256 else np.uint16
    if width == num_blocks * block_size:
        out = np.empty((len(codes), num_blocks), dtype=dtype)
        # In chunks: the finiteness mask and argmax temporaries stay small.
        for start in range(0, len(codes), chunk):
            part = codes[start : start + chunk]
            if part.dtype.kind == "f":
                check_finite(name, part)
            blocks = part.reshape(len(part), num_blocks, block_size)
            # argmax keeps the lowest index among equal maxima.
            out[start : start + chunk] = blocks.argmax(axis=-1)
        return out
    if width != num_blocks:
        raise ValueError(
            f"{name} must have width num_blocks = {num_blocks} (integer codes) "
            f"or num_blocks * block_size = {num_blocks * block_size} (per-block "
            f"vectors), received shape {codes.shape}"
        )
    if codes.dtype.kind not in "iu":
        raise ValueError(
            f"{name} of width num_blocks = {num_blocks} must be integer codes, "
            f"received dtype {codes.dtype}"
        )
    if codes.size:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= block_size:
            raise ValueError(
                f"{name} must hold values in [0, block_size) = [0, {block_size}), "
                f"received values in [{low}, {high}]"
            )
    return codes.astype(dtype)


def check_queries(name: str, queries, num_blocks: int, block_size: int) -> np.ndarray:
    """Finite real queries `(nq, M*K)` as C-contiguous float32."""
    queries = _as_2d(name, queries)
    width = num_blocks * block_size
    if queries.shape[1] != width:
        raise ValueError(
            f"{name} must have width num_blocks * block_size = {num_blocks} * "
            f"{block_size} = {width}, received shape {queries.shape}"
        )
    if queries.dtype.kind == "f" and queries.dtype.itemsize > 4:
        # Finite, but beyond float32 (the precision every scan sums in):
        # say so, rather than calling them infinite after the cast.
        check_finite(name, queries)
        largest = float(np.abs(queries).max()) if queries.size else 0.0
        if largest > float(np.finfo(np.float32).max):
            raise ValueError(
                f"{name} must lie within float32's range (|x| <= 3.4e38), "
                f"received a value of magnitude {largest:.3g}"
            )
    with np.errstate(over="ignore"):  # overflow to inf is reported just below
        queries = np.ascontiguousarray(queries, dtype=np.float32)
    check_finite(name, queries)
    return queries


def check_ids(name: str, ids, length: int | None = None) -> np.ndarray:
    """Ids as a 1-D int64 array of values >= 0 (`length` of them if given)."""
    ids = np.asarray(ids)
    if ids.ndim == 0:
        ids = ids.reshape(1)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(
            f"{name} must be a 1-D array of integers, received shape "
            f"{ids.shape} and dtype {ids.dtype}"
        )
    if length is not None and len(ids) != length:
        raise ValueError(
            f"{name} must have one id per code ({length}), received {len(ids)}"
        )
    if ids.size and ids.dtype.kind == "u" and int(ids.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64, received {int(ids.max())}")
    ids = ids.astype(np.int64)
    if ids.size and int(ids.min()) < 0:
        raise ValueError(
            f"{name} must be >= 0 (-1 marks missing results), received "
            f"{preview(ids[ids < 0])}"
        )
    return ids


def preview(values: np.ndarray, limit: int = 10) -> str:
    """The first distinct `values`, for an error message: `[1, 2, ... (n in all)]`."""
    values = np.unique(values)
    shown = ", ".join(str(int(v)) for v in values[:limit])
    more = f", ... ({len(values)} in all)" if len(values) > limit else ""
    return f"[{shown}{more}]"


def duplicates(ids: np.ndarray) -> np.ndarray:
    """The values that occur more than once in `ids`."""
    values, counts = np.unique(ids, return_counts=True)
    return values[counts > 1]


def one_hot(codes: np.ndarray, block_size: int) -> np.ndarray:
    """Integer codes `(n, M)` to their one-hot vectors `(n, M*K)`, float32."""
    n, num_blocks = codes.shape
    out = np.zeros((n, num_blocks * block_size), dtype=np.float32)
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    np.put_along_axis(out, columns, 1.0, axis=1)
    return out


def search_codes_with(
    search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
    codes: np.ndarray,
    k: int,
    block_size: int,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric search through an asymmetric `search(queries, k)`.

    The result has `k` columns; slots a search leaves empty (the database
    shrank meanwhile) hold id -1 and score -1.
    """
    scores = np.full((len(codes), k), -1, dtype=np.int32)
    ids = np.full((len(codes), k), -1, dtype=np.int64)
    if not k:
        return scores, ids
    for start in range(0, len(codes), chunk):
        rows = slice(start, start + chunk)
        found_scores, found_ids = search(one_hot(codes[rows], block_size), k)
        width = min(k, found_ids.shape[1])
        valid = found_ids[:, :width] >= 0
        ids[rows, :width] = np.where(valid, found_ids[:, :width], -1)
        scores[rows, :width] = np.where(
            valid, np.rint(np.where(valid, found_scores[:, :width], 0)), -1
        )
    return scores, ids
