"""An instance code kept beside a picture index's class code, and the
answer of the two.

A class code (paper Sec. 3) ranks pictures by class: hundreds share a
code, and a copy of the query is one of them. An instance code (the
paper's instance retrieval, Sec. 4, Table 4; `subic_keras.instance.instance_code`) is
trained to find the picture itself. An `ImageIndex` made with `instance=`
keeps both codes of every picture, and answers a query given both its
queries (the class model's and the instance model's) as:

1. the query's near copies: the instance code's best `k`, searched by the
   same exact scan over every item the filter keeps, whose copy margin
   (`copies.copy_margins`) reaches the instance model's `copy_margin`,
   most likely first;
2. the rest by class score, equal class scores by instance score
   (`s(q, x) = sum_m l_m[c_m(x)]`, Eq. 10 with the instance query), then
   in insertion order.

Every row keeps its class score; a copy listed above better class scores
is marked `"copy"`, which says why it is there.
"""

from __future__ import annotations

import os

import numpy as np

from subic_keras.search import file_format, workers
from subic_keras.search.checks import (
    check_codes,
    check_model_record,
    check_queries,
)
from subic_keras.search.copy_rules import copy_margins
from subic_keras.search.subic_index import SubicIndex
from subic_keras.search.views import put_first


class InstanceCodes:
    """The instance codes of an index's items, in the items' order.

    Args:
        num_blocks: `M'`, blocks of the instance code.
        block_size: `K'`, a power of two.
        model: the record of the instance model that wrote them
            (`retrieval.model_record`): its digest, and the copy rules it
            chose on validation (`copy_margin`, `copy_blocks`).
        codes: the `SubicIndex` holding them (default: a new, empty one).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        model: dict | None = None,
        codes: SubicIndex | None = None,
    ):
        self.codes = codes if codes is not None else SubicIndex(num_blocks, block_size)
        if model is not None:
            self.model = model

    @property
    def model(self) -> dict | None:
        """Its model's record, which its `SubicIndex` keeps (and checks)."""
        return self.codes.model

    @model.setter
    def model(self, record: dict | None) -> None:
        self.codes.model = record

    @classmethod
    def from_file(cls, path, codes: SubicIndex, items) -> InstanceCodes:
        """The instance codes of a file's items (`file_format.Items`), at
        the positions of its class `codes`, with their model's record.

        Raises:
            ValueError: naming the path, for a record that is not a model's.
        """
        num_blocks, block_size, packed = items.instance
        header = file_format.Header(num_blocks, block_size, len(packed), None)
        part = SubicIndex.from_parts(
            path, header, packed, codes.get_ids(), scanner=codes.scanner
        )
        try:
            model = check_model_record(
                "instance_model", items.metadata.get("instance_model")
            )
            return cls(num_blocks, block_size, model, part)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{os.fspath(path)!r} is not a valid SuBiC index file: {error}"
            ) from None

    @property
    def num_blocks(self) -> int:
        return self.codes.num_blocks

    @property
    def block_size(self) -> int:
        return self.codes.block_size

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """The `(H, W, C)` its model takes, as its record says."""
        shape = (self.model or {}).get("input_shape")
        return tuple(shape) if isinstance(shape, list) else None

    @property
    def copy_margin(self) -> float | None:
        """The least copy margin of a copy (None: the model chose none)."""
        return copy_margin_of(self.model)

    def checked(self, codes, n: int) -> np.ndarray:
        """`codes` of `n` items, checked before an index changes."""
        if codes is None:
            raise ValueError(
                "instance_codes must be given: this index keeps an instance code "
                "of every picture"
            )
        codes = check_codes("instance_codes", codes, self.num_blocks, self.block_size)
        if len(codes) != n:
            raise ValueError(
                f"instance_codes must hold one code per path ({n}), received "
                f"{len(codes)}"
            )
        return codes

    def file_part(self) -> tuple[int, int, np.ndarray]:
        """`(M', K', packed codes)`, as `file_format.Items.instance` holds them."""
        with self.codes.contents() as (header, chunks, _):
            empty = np.zeros((0, header.code_size), np.uint8)
            packed = np.concatenate([empty, *chunks])
        return self.num_blocks, self.block_size, packed


def checked_instance_queries(
    instance_queries, count: int, num_blocks: int, block_size: int
) -> np.ndarray:
    """`instance_queries` checked: `(count, M'*K')` float32, finite."""
    instance_queries = check_queries(
        "instance_queries", instance_queries, num_blocks, block_size
    )
    if len(instance_queries) != count:
        raise ValueError(
            f"instance_queries must hold one query per query ({count}), "
            f"received {len(instance_queries)}"
        )
    return instance_queries


def copy_margin_of(record: dict | None) -> float | None:
    """The least copy margin of a copy that an instance model's record
    holds: the one chosen on the folder's own pictures where the index
    chose one (`folder_rules.calibrate_folder`, under `"copies"`), else the
    model's (None: none chosen, exact copies only)."""
    record = record or {}
    if isinstance(record.get("copies"), dict):
        record = record["copies"]
    value = record.get("copy_margin")
    return float(value) if isinstance(value, (int, float)) else None


def copy_marks(
    instance_queries: np.ndarray, near: np.ndarray, block_size: int, margin
) -> np.ndarray:
    """Which of the instance scores `near` `(nq, width)` the copy rule marks
    (`margin`, the model's `copy_margin`; None: none)."""
    if margin is None:
        return np.zeros(near.shape, bool)
    return copy_margins(instance_queries, near, block_size) >= margin - 1e-6


def shard_part(
    codes: SubicIndex,
    instance: InstanceCodes,
    queries: np.ndarray,
    instance_queries,
    k: int,
    keep: np.ndarray | None,
    rows_of,
    keys: bool = False,
) -> dict:
    """One index's (or shard's) part of an answer by both codes, under its
    lock: its best `k` by class score, equal scores by instance score
    (`scores`, `ids`, `positions`, and with `keys` their instance scores,
    `keys`), and per query its best `k` by instance score (`near`: their
    instance scores, ids, positions, whether the copy rule marks them, and
    the class scores of those it marks), positions in insertion order.

    Args:
        codes: the class codes.
        instance: the instance codes, at the same positions, and the copy
            rule of their model (`copy_margin`; None: no copies).
        queries: the class queries, `(nq, M*K)`.
        instance_queries: the instance queries, `(nq, M'*K')` (the instance
            model's FC0 outputs).
        k: results per query.
        keep: the items a filter keeps (None: every item).
        rows_of: ids to their insertion positions.
        keys: return the results' instance scores (to merge shards by).
    """
    instance_queries = checked_instance_queries(
        instance_queries, len(queries), instance.num_blocks, instance.block_size
    )

    key = instance.codes.second_code(instance_queries)
    if len(queries) < workers.cores() and instance.codes.scanner.startswith("native-"):
        # Fewer queries than cores: the native instance scan splits its rows
        # among them all, and the short class search follows it rather than
        # taking a core from it (docs/search.md, "Ties ordered by the
        # instance code"); faiss's scans do not split, and keep it beside.
        near, near_ids = instance.codes.search_kept(instance_queries, k, keep)
        scores, ids = codes.search_kept(queries, k, keep, key=key)
    else:
        # The two searches only read, and run side by side: a batch's class
        # ties are ordered on one core (in C, the GIL released), while the
        # instance scan keeps the others busy.
        class_search = workers.pool("subic-beside").submit(
            codes.search_kept, queries, k, keep, key=key
        )
        near, near_ids = instance.codes.search_kept(instance_queries, k, keep)
        scores, ids = class_search.result()
    queries = np.asarray(queries, np.float32)  # checked by the search
    part: dict = {"scores": scores, "ids": ids, "near": []}
    if keys:  # what shards are merged by
        part["positions"] = rows_of(ids.ravel()).reshape(ids.shape)
        part["keys"] = np.array(
            [key.scores(r, p) for r, p in enumerate(part["positions"])]
        )
    marked = copy_marks(
        instance_queries, near, instance.block_size, instance.copy_margin
    )
    at = rows_of(near_ids.ravel()).reshape(near_ids.shape)
    class_scores = np.zeros(near.shape, np.float32)  # of the marked only
    for row in np.flatnonzero(marked.any(axis=1)):
        class_scores[row, marked[row]] = codes.scores_at(
            queries[row], at[row][marked[row]]
        )
    part["near"] = list(zip(near, near_ids, at, marked, class_scores))
    return part


def merge_parts(parts: list[dict], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The answer of both codes from the `shard_part`s of shards in order
    (one index: one part; of several, with their `keys`): the answer of one
    index holding their items in that order, ties included.

    Returns:
        `(scores, ids, copy)`: class scores (float32) and ids `(nq, width)`,
        and which results are copies of the query.
    """
    if len(parts) == 1:  # in order already
        scores, ids = parts[0]["scores"].copy(), parts[0]["ids"].copy()
    else:
        scores, ids = _merged(parts, k)
    copy = np.zeros(ids.shape, bool)
    for row in range(len(ids) if ids.shape[1] else 0):
        if not any(part["near"][row][3].any() for part in parts):
            continue  # no copy: the usual case
        near, found, at, marked, class_scores = (
            np.concatenate([part["near"][row][field] for part in parts])
            for field in range(5)
        )
        shard = np.concatenate(
            [np.full(len(p["near"][row][1]), i) for i, p in enumerate(parts)]
        )
        # The best k of the whole index by instance score, and its copies.
        order = np.lexsort((at, shard, -near.astype(np.float64)))[:k]
        order = order[marked[order]]
        put_first(scores, ids, copy, row, found[order], class_scores[order])
    return scores, ids, copy


def _merged(parts: list[dict], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's best `k` of the parts' results, by class score, instance
    score, shard and position."""
    width = min(k, sum(part["ids"].shape[1] for part in parts))
    rows = len(parts[0]["ids"])
    scores = np.empty((rows, width), np.float32)
    ids = np.empty((rows, width), np.int64)
    shard = np.concatenate([np.full(p["ids"].shape[1], i) for i, p in enumerate(parts)])
    for row in range(rows):
        score, key, found, at = (
            np.concatenate([part[field][row] for part in parts])
            for field in ("scores", "keys", "ids", "positions")
        )
        order = np.lexsort((at, shard, -key, -score.astype(np.float64)))[:width]
        scores[row], ids[row] = score[order], found[order]
    return scores, ids
