"""The search interfaces (`Searcher`, `SearchBackend`, `PictureIndex`) and
their conventions.

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
- Filters. `search(..., where=...)` returns the exact top `k` among the
  items the filter keeps (`subic_keras.search.filters`), fewer when fewer
  are kept.
- Answers. `answer` gives each result as a row (`answer_rows`, the one
  place where results become what the command line, the server and Python
  show).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search import filters
from subic_keras.search.checks import (
    check_codes,
    check_ids,
    check_queries,
    duplicates,
    one_hot,
    preview,
)


class Searcher(abc.ABC):
    """Searches a database of SuBiC codes (the read side of a backend).

    The public methods check their arguments once, then call the backend's
    private ones: a backend implements `num_blocks`, `block_size`, `__len__`
    and `_search` (checked queries, `k >= 1`, a parsed filter or None), and
    `search_codes` (symmetric search) and `answer` come from it.
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

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """The `(H, W, C)` the items' pictures were decoded to, if known."""
        return None

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes, if the index records it
        (`retrieval.model_record`)."""
        return None

    @property
    def instance_model(self) -> dict | None:
        """The record of the instance model whose codes are kept beside the
        class codes (`instance_codes`), so that `answer` takes its queries
        as `instance_queries` ({} for codes added without a record); None
        where none are kept."""
        return None

    def search(self, queries, k: int, *, where=None) -> tuple[np.ndarray, np.ndarray]:
        """Asymmetric search: the `k` best items for each real query `z*`.

        Args:
            queries: real `(nq, M*K)` array (e.g. SuBiC's ReLU output `z*`).
            k: results per query, >= 1; a `k` beyond `len(self)` returns
                every item.
            where: the items that may be returned: a filter expression
                (`"class == 'cat'"`, `subic_keras.search.filters`), a
                `Filter`, or ids; None for all.

        Returns:
            `(scores, ids)`: float32 and int64 `(nq, min(k, len(self)))`,
            sorted as the module docstring states; with `where`,
            `min(k, items kept)` columns.

        Raises:
            ValueError: for a bad shape, NaN/inf queries, a bad `k` or a bad
                filter (naming what is wrong in it).
        """
        k = self._check_k(k)
        queries = check_queries("queries", queries, self.num_blocks, self.block_size)
        return self._search(queries, k, filters.as_filter(where))

    def answer(
        self, queries, k: int, *, where=None, fingerprints=None
    ) -> list[list[dict]]:
        """`search`, each result as a row (`answer_rows`): per query, a list
        of `{"rank", "score", "id", "path", ..., "exact"}`.

        `fingerprints` (one per query, `subic_keras.data.images.fingerprint`)
        describe the query pictures: an index of pictures lists exact copies
        of a query first (`ImageIndex`); an index of codes alone has no
        pixels to compare and ignores them.
        """
        del fingerprints
        scores, ids = self.search(queries, k, where=where)
        return answer_rows(self, scores, ids)

    def describe(self, ids: np.ndarray) -> list[dict]:
        """What the index knows of each item: its id, and its path (None
        here: an index of codes alone)."""
        return [{"id": int(item), "path": None} for item in ids]

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
            lambda queries, k: self._search(queries, k, None),
            codes,
            min(k, len(self)),
            self.block_size,
            self._query_chunk,
        )

    @abc.abstractmethod
    def _search(
        self, queries: np.ndarray, k: int, where: filters.Filter | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`search` of checked float32 queries and a parsed filter."""

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
    `score_all`, `save` and `load`. A new backend (a remote database)
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
    def score_all(self, queries) -> tuple[np.ndarray, np.ndarray]:
        """Scores of every query against every item, `(nq, n)`, and the ids
        (increasing), from one state of the index."""

    @abc.abstractmethod
    def save(self, path: str | os.PathLike) -> None:
        """Writes the database atomically to `path`."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | os.PathLike) -> SearchBackend:
        """Reads a database written by `save`, verifying it first."""


class PictureIndex(Searcher):
    """A searcher whose items are pictures of one folder: what `ImageIndex`
    and `RayIndex` both are, and all the server and the command line ask of
    an index beyond its codes.

    A `RayIndex` over shards of codes alone is one too, with `root` None:
    `holds_pictures` tells the two apart.
    """

    @property
    @abc.abstractmethod
    def root(self) -> str | None:
        """The absolute path of the pictures' folder (None: codes alone)."""

    @property
    @abc.abstractmethod
    def written_with_looks(self) -> bool:
        """Whether it was read from files of an earlier version that held
        the pictures' looks, which this version reads past: it is searched
        by its codes alone."""

    @abc.abstractmethod
    def paths(self, ids) -> list[str]:
        """The relative paths of `ids`, in order (`KeyError` for an id not
        held)."""

    @abc.abstractmethod
    def folders(self) -> list[str]:
        """The folders that hold pictures (at any depth), sorted: what
        `path under "FOLDER"` filters on."""

    @abc.abstractmethod
    def duplicates(self, copy_blocks: int | None = None) -> list[list[str]]:
        """Groups of pictures that are copies of each other, by their
        instance codes (`subic_keras.search.copy_rules.duplicate_groups`: exact, all
        pairs): the paths of each group in insertion order, largest first.

        Args:
            copy_blocks: the least equal blocks of two copies; default: the
                one chosen on the folder's own pictures where the index
                chose one (`copy_record`), else the one the instance code
                chose on validation, as recorded.

        Raises:
            ValueError: with no `copy_blocks` given or recorded (codes of a
                class model: classes, not copies), or more than the code's
                blocks.
        """

    @property
    def copy_record(self) -> dict | None:
        """The record of the model whose codes tell copies, with the copy
        rules chosen on the folder's own pictures under `"copies"`
        (`retrieval.choose_copy_rules`)."""
        return self.model

    def record_copy_rules(self, rules: dict) -> None:
        """Records the copy rules chosen on the folder's own pictures."""
        raise ValueError(f"{type(self).__name__} records no copy rules of its own")

    def copy_items(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """`(paths, codes, fingerprints)` of every picture, in insertion
        order, by the codes that tell copies."""
        raise ValueError(f"{type(self).__name__} cannot list its pictures' codes")

    def persist(self, path: str | os.PathLike) -> None:
        """Makes what was added, removed or recorded last at `path`: an index
        held in memory writes its file (`ImageIndex.save`); one kept in a
        database (a Milvus collection) holds it already."""

    @property
    def holds_pictures(self) -> bool:
        """Whether the items are pictures with paths (a `root`)."""
        return self.root is not None

    def by_instance(self) -> PictureIndex:
        """The same pictures searched by the instance codes kept beside the
        class codes alone, for reading.

        Raises:
            ValueError: none are kept.
        """
        raise ValueError("this index keeps no instance codes")

    @property
    def unavailable(self) -> dict[str, str]:
        """The parts that cannot answer now, each with why (shards on Ray);
        empty when every part answers."""
        return {}


def answer_rows(
    index: Searcher,
    scores: np.ndarray,
    ids: np.ndarray,
    exact: np.ndarray | None = None,
    copy: np.ndarray | None = None,
) -> list[list[dict]]:
    """Search results as the rows every interface shows.

    Args:
        index: what was searched (`describe` gives each item's fields).
        scores, ids: `(nq, width)` results; ids -1 (missing) are left out.
        exact: booleans `(nq, width)`: the item is an exact copy of the
            query (`ImageIndex`); None: none is.
        copy: booleans `(nq, width)`: the item is a copy of the query by an
            instance code (`instance_codes`), each row then marked `"copy"`
            (exact copies too); None: no row is.

    Example:

    >>> from subic_keras.search import SubicIndex
    >>> index = SubicIndex(num_blocks=2, block_size=4)
    >>> _ = index.add([[0, 1], [2, 3]], ids=[10, 11])
    >>> scores, ids = np.array([[6.0, -np.inf]]), np.array([[11, -1]])
    >>> answer_rows(index, scores, ids)
    [[{'rank': 1, 'score': 6.0, 'id': 11, 'path': None, 'exact': False}]]

    Returns:
        Per query, a list of `{"rank", "score", "id", "path", ..., "exact"}`
        (scores rounded to 6 decimals, ranks from 1).
    """
    answers = []
    for row in range(len(ids)):
        found = ids[row] >= 0
        items = index.describe(ids[row][found])
        flags = exact[row][found] if exact is not None else np.zeros(len(items), bool)
        rows = [
            {"rank": rank, "score": round(float(score), 6), **item, "exact": bool(flag)}
            for rank, (score, item, flag) in enumerate(
                zip(scores[row][found], items, flags), start=1
            )
        ]
        if copy is not None:
            for match, flag in zip(rows, copy[row][found]):
                match["copy"] = bool(flag or match["exact"])
        answers.append(rows)
    return answers


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
