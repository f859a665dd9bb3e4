"""The answer of both codes from a Milvus collection that keeps instance
codes (`MilvusIndex(..., instance=(M', K'))`), as an `ImageIndex` made with
`instance=` gives it (`instance_codes`):

1. the query's near copies: the instance code's best `k` (Milvus's search
   of the second vector field), whose copy margin reaches the instance
   model's `copy_margin` (recorded with the collection), most likely first;
2. the rest by class score, equal class scores by instance score, then in
   insertion order.

Milvus returns its best `k` by each code; the codes of those results are
read back by id (`read_stored`) to score them by the other code. Where more
than `k` items tie at the k-th class score, which of them Milvus returns is
its choice (`milvus` module); among those returned the order is the
`ImageIndex`'s.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from subic_keras.search import milvus_schema
from subic_keras.search.instance_codes import copy_marks, merge_parts
from subic_keras.search.milvus_client import get_rows


class Stored(NamedTuple):
    """Items of a collection read back by id, in increasing id."""

    ids: np.ndarray
    seq: np.ndarray  # insertion order
    codes: np.ndarray  # class codes (n, M)
    instance_codes: np.ndarray  # (n, M')


def read_stored(
    client: Any, collection: str, ids: np.ndarray, recorded: milvus_schema.Recorded
) -> Stored:
    """Both codes and the insertion order of those of `ids` (unique, >= 0)
    that `collection` (keeping instance codes) holds."""
    fields = [milvus_schema.CODE, milvus_schema.INSTANCE_CODE]
    rows = get_rows(client, collection, ids, ["seq", *fields])
    rows.sort(key=lambda row: row["id"])
    codes = [
        milvus_schema.codes_of([row[field] for row in rows], *recorded.shape(instance))
        for field, instance in zip(fields, (False, True))
    ]
    return Stored(
        np.array([row["id"] for row in rows], dtype=np.int64),
        np.array([row["seq"] for row in rows], dtype=np.int64),
        *codes,
    )


def answer_both(
    queries: np.ndarray,
    instance_queries: np.ndarray,
    by_class: tuple[np.ndarray, np.ndarray],
    by_instance: tuple[np.ndarray, np.ndarray],
    stored: Stored,
    block_sizes: tuple[int, int],
    margin: float | None,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(scores, ids, copy)`: class scores and ids `(nq, width)` of the
    answer of both codes, and which results are copies of the query.

    Args:
        queries: the class queries `(nq, M*K)`, checked.
        instance_queries: the instance model's queries `(nq, M'*K')`, checked.
        by_class: `(scores, ids)`, Milvus's best `k` by the class code.
        by_instance: `(scores, ids)`, its best `k` by the instance code.
        stored: the results' codes and insertion order (`read_stored`).
        block_sizes: `(K, K')`.
        margin: the instance model's `copy_margin` (None: no copies).
        k: results per query.
    """
    (scores, ids), (near, near_ids) = by_class, by_instance

    def rows_of(found: np.ndarray) -> np.ndarray:
        """Rows of `stored` of the ids `found`; -1 for none (a missing
        result, or an item removed since the search)."""
        if not len(stored.ids):
            return np.full(found.shape, -1)
        at = np.searchsorted(stored.ids, found).clip(0, len(stored.ids) - 1)
        return np.where(stored.ids[at] == found, at, -1)

    # Equal class scores by instance score, then insertion order.
    rows = rows_of(ids)
    keys = _scores(instance_queries, stored.instance_codes, rows, block_sizes[1])
    order = np.lexsort(
        (_positions(stored.seq, rows), -keys, -scores.astype(np.float64))
    )
    scores = np.take_along_axis(scores, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)

    near_rows = rows_of(near_ids)
    marked = copy_marks(instance_queries, near, block_sizes[1], margin)
    class_scores = _scores(queries, stored.codes, near_rows, block_sizes[0])
    part = {
        "scores": scores,
        "ids": ids,
        "near": list(
            zip(
                near,
                near_ids,
                _positions(stored.seq, near_rows),
                marked & (near_rows >= 0),
                class_scores.astype(np.float32),
            )
        ),
    }
    return merge_parts([part], k)


def _scores(
    queries: np.ndarray, codes: np.ndarray, rows: np.ndarray, block_size: int
) -> np.ndarray:
    """Scores `(nq, width)` of the stored `codes` at `rows` for each query
    (paper Eq. 8, in float64); -inf where a row is -1."""
    if not rows.size or not len(codes):
        return np.full(rows.shape, -np.inf)
    columns = codes[rows.clip(0)].astype(np.int64)  # (nq, width, M)
    columns += np.arange(codes.shape[1]) * block_size
    query = np.arange(len(rows))[:, None, None]
    values = np.asarray(queries, np.float64)[query, columns]
    return np.where(rows >= 0, values.sum(-1), -np.inf)


def _positions(seq: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Insertion positions of the items at `rows` (after every item where a
    row is -1)."""
    if not len(seq):
        return np.full(rows.shape, np.iinfo(np.int64).max)
    return np.where(rows >= 0, seq[rows.clip(0)], np.iinfo(np.int64).max)
