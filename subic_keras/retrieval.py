"""Retrieval with a trained model: encode, index, search and score a protocol.

The glue behind `subic index build`, `subic search`, `subic evaluate` and
`subic quickstart`; every number they print goes through
`subic_keras.evaluation`.
"""

from __future__ import annotations

import math

import numpy as np

from subic_keras import evaluation
from subic_keras.models import Subic, check_query_kind
from subic_keras.search import SubicIndex

_QUERY_CHUNK = 1024


def as_model_inputs(images: np.ndarray) -> np.ndarray:
    """uint8 images `(n, H, W[, C])` to the float `[0, 1]` inputs models take.

    Float arrays are taken to be model inputs already (images in `[0, 1]`,
    or features) and returned as float32.
    """
    images = np.asarray(images)
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32, copy=False)
    if images.dtype != np.uint8:
        raise TypeError(
            f"images must be uint8 pixels or float inputs, received dtype "
            f"{images.dtype}"
        )
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(
            f"images must have shape (n, H, W) or (n, H, W, C), received {images.shape}"
        )
    return images.astype(np.float32) / 255.0


def build_index(
    subic: Subic,
    images: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = 256,
) -> SubicIndex:
    """Encodes uint8 `images` with `subic.encoder` into a new `SubicIndex`."""
    index = SubicIndex(subic.num_blocks, subic.block_size)
    index.add(subic.encode(as_model_inputs(images), batch_size=batch_size), ids=ids)
    return index


def full_scores(
    index: SubicIndex, queries: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of every query against every indexed item, `(nq, n)`, and the ids.

    Columns follow the index's ids in increasing order; the scores are those
    of `index.search` with `k = len(index)`, so they are exactly SuBiC's.
    """
    ids = np.sort(index.get_ids())
    scores = np.empty((len(queries), len(ids)), np.float32)
    for start in range(0, len(queries), _QUERY_CHUNK):
        part, found = index.search(queries[start : start + _QUERY_CHUNK], k=len(index))
        columns = np.searchsorted(ids, found)
        np.put_along_axis(scores[start : start + len(part)], columns, part, axis=1)
    return scores, ids


def protocol_scores(
    subic: Subic,
    images: np.ndarray,
    labels: np.ndarray,
    protocol: str = "paper",
    seed: int = 0,
    index: SubicIndex | None = None,
    query: str | None = None,
    **protocol_args,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SubicIndex]:
    """SuBiC's scores of a protocol's queries against its whole database.

    The protocol (`evaluation.protocol_split`) splits `images` into queries
    and database; the database is encoded into a `SubicIndex` (or `index`,
    whose ids must be the database's positions in `images`) and every
    query (`Subic.query` of kind `query`: `"fc0"`, the paper's `z`,
    `"class_posterior"`, or `None` for the model's `default_query`) is
    scored against all of it (`full_scores`).

    Returns:
        `(scores, query_labels, database_labels, index)`: scores
        `(num_queries, num_database)` with columns in database order, ready
        for any `subic_keras.evaluation` metric.
    """
    query = check_query_kind("query", subic.default_query if query is None else query)
    query_idx, database_idx = evaluation.protocol_split(
        protocol, labels, seed=seed, **protocol_args
    )
    if index is None:
        index = build_index(subic, images[database_idx], ids=database_idx)
    queries = subic.query(as_model_inputs(images[query_idx]), kind=query)
    scores, ids = full_scores(index, queries)
    return scores, labels[query_idx], labels[ids], index


def evaluate(
    subic: Subic,
    images: np.ndarray,
    labels: np.ndarray,
    protocol: str = "paper",
    seed: int = 0,
    index: SubicIndex | None = None,
    ks: tuple[int, ...] = (10, 100),
    ties: str = "pessimistic",
    query: str | None = None,
    **protocol_args,
) -> dict:
    """Retrieval mAP and precision@k of `subic` on a named protocol.

    The full ranking of `protocol_scores` (with queries of kind `query`;
    `None`: the model's `default_query`) is scored.

    Returns:
        A JSON-ready dict: `map` (with `ties`), `map_expected` (the exact
        expectation over random orders of tied items: codes shared by many
        images make large tie groups, where the pessimistic and expected APs
        differ), `precision@k`, `recall@k`, the protocol, bits, sizes and
        the tie handling.
    """
    query = subic.default_query if query is None else query
    scores, query_labels, database_labels, index = protocol_scores(
        subic,
        images,
        labels,
        protocol,
        seed=seed,
        index=index,
        query=query,
        **protocol_args,
    )
    result = evaluation.evaluate_retrieval(
        scores, query_labels, database_labels, ks=ks, ties=ties
    )
    result["map_expected"] = (
        result["map"]
        if ties == "expected"
        else evaluation.mean_average_precision(
            scores, query_labels, database_labels, ties="expected"
        )
    )
    result["distinct_database_codes"] = len(np.unique(index.get_codes(), axis=0))
    result.update(
        {
            "protocol": protocol,
            "query": query,
            "bits": subic.num_blocks * int(math.log2(subic.block_size)),
            "num_blocks": subic.num_blocks,
            "block_size": subic.block_size,
            "num_database": len(index),
        }
    )
    return result
