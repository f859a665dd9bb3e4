"""Retrieval with a trained SuBiC model: index, search and score a protocol.

The glue behind `subic index build`, `subic search`, `subic evaluate` and
`subic quickstart`. Scoring goes through `subic_keras.scoring`, the same
code that scores the baselines, and every number through
`subic_keras.evaluation`.
"""

from __future__ import annotations

import numpy as np

from subic_keras import protocols, scoring
from subic_keras.datasets import as_model_inputs as as_model_inputs
from subic_keras.models import Subic
from subic_keras.search import SearchBackend, SubicIndex


def build_index(
    subic: Subic,
    images: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = 256,
) -> SubicIndex:
    """Encodes `images` (uint8, or float inputs) into a new `SubicIndex`."""
    index = SubicIndex(subic.num_blocks, subic.block_size)
    index.add(subic.encode(images, batch_size=batch_size), ids=ids)
    return index


def full_scores(
    index: SearchBackend, queries: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of every query against every indexed item, `(nq, n)`, and the ids.

    Columns follow the index's ids in increasing order; the scores are those
    of `index.search` with `k = len(index)`, so they are exactly SuBiC's
    (`SearchBackend.score_all`).
    """
    return index.score_all(queries)


def _scorer_and_database(subic, labels, protocol, seed, index, query, protocol_args):
    """`subic` with queries of kind `query`, and `index`'s codes in protocol
    database order (the index's ids must be the database positions)."""
    scorer = subic if query is None else subic.with_query(query)
    if index is None:
        return scorer, None
    _, database_idx = protocols.protocol_split(
        protocol, np.asarray(labels), seed=seed, **protocol_args
    )
    ids = np.sort(index.get_ids())
    if not np.array_equal(ids, database_idx):
        raise ValueError(
            f"index must hold the protocol's database, ids = its positions in "
            f"images ({len(database_idx)} items), received an index of "
            f"{len(ids)} items with other ids"
        )
    return scorer, index.get_codes(database_idx)


def protocol_scores(
    subic: Subic,
    images: np.ndarray,
    labels: np.ndarray,
    protocol: str = "paper",
    seed: int = 0,
    index: SubicIndex | None = None,
    query: str | None = None,
    **protocol_args,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SuBiC's scores of a protocol's queries against its whole database.

    `scoring.protocol_scores` with queries of kind `query` (`"fc0"`, the
    paper's `z`, `"class_posterior"`, or `None` for the model's
    `default_query`); `index`, if given, supplies the database codes (its
    ids must be the database's positions in `images`).

    Returns:
        `(scores, query_labels, database_labels, database_codes)`: scores
        `(num_queries, num_database)` with columns in database order, ready
        for any `subic_keras.evaluation` metric.
    """
    scorer, database = _scorer_and_database(
        subic, labels, protocol, seed, index, query, protocol_args
    )
    return scoring.protocol_scores(
        scorer,
        images,
        labels,
        protocol,
        seed=seed,
        database=database,
        **protocol_args,
    )


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

    `scoring.evaluate` with queries of kind `query` (`None`: the model's
    `default_query`) and, optionally, the database codes of `index`.

    Returns:
        A JSON-ready dict: `map` (with `ties`), `map_expected` (the exact
        expectation over random orders of tied items: codes shared by many
        images make large tie groups, where the pessimistic and expected APs
        differ), `map_21point`, `precision@k`, `recall@k`, the protocol,
        query kind, bits, sizes and the tie handling.
    """
    scorer, database = _scorer_and_database(
        subic, labels, protocol, seed, index, query, protocol_args
    )
    return scoring.evaluate(
        scorer,
        images,
        labels,
        protocol,
        seed=seed,
        database=database,
        ks=ks,
        ties=ties,
        **protocol_args,
    )
