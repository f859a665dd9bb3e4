"""One interface for every retrieval method, and one evaluation for all.

A `Scorer` is what the evaluation needs from a method: encode a database,
encode queries, and score every query against every database item (higher is
better). `Subic` (asymmetric `z*` or class-posterior queries against codes,
paper Sec. 3.3), the hashing baselines (`HashingNetwork`: Hamming distance)
and the quantizers (`Quantizer`: asymmetric distance) implement it, so
`evaluate` scores any of them on a named protocol with the same code:

    result = evaluate(scorer, images, labels, protocol="paper")

NumPy only: this module imports TensorFlow only to read a stream.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Sequence

import numpy as np

from subic_keras.data import protocols
from subic_keras.evaluation import retrieval_metrics as evaluation


class Scorer(abc.ABC):
    """A retrieval method as the evaluation sees it: encode, then score."""

    @abc.abstractmethod
    def encode_database(self, inputs) -> np.ndarray:
        """What is stored for each database item (e.g. its code), `(n, ...)`."""

    @abc.abstractmethod
    def encode_queries(self, inputs) -> np.ndarray:
        """What is searched with for each query, `(nq, ...)`."""

    @abc.abstractmethod
    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """Scores `(nq, n)` of encoded queries against an encoded database.

        Higher is better; equal scores are ties (see
        `subic_keras.evaluation` for how they are ranked).
        """

    def describe(self) -> dict:
        """JSON-ready facts recorded with a result (bits, query kind, ...)."""
        return {}


def protocol_scores(
    scorer: Scorer,
    inputs,
    labels,
    protocol: str = "paper",
    *,
    seed: int = 0,
    database: np.ndarray | None = None,
    **protocol_args,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scores of a protocol's queries against its whole database.

    `inputs` are arrays, or a stream of `(input, label)` pairs
    (`subic_keras.data.streams`) with `labels=None`.

    `protocols.protocol_split` splits `inputs` into queries and database;
    the database is encoded (or `database` is used: the encoded items, in the
    split's database order) and every query is scored against all of it.

    Returns:
        `(scores, query_labels, database_labels, database)`: scores
        `(num_queries, num_database)` with columns in database order, ready
        for any `subic_keras.evaluation` metric, and the encoded database.
    """
    if _is_stream(inputs):
        return _stream_scores(
            scorer, inputs, labels, protocol, seed, database, **protocol_args
        )
    if labels is None:
        raise ValueError(
            "labels must be given with array inputs (None is for a stream of "
            "(input, label) pairs)"
        )
    labels = np.asarray(labels)
    query_idx, database_idx = protocols.protocol_split(
        protocol, labels, seed=seed, **protocol_args
    )
    if database is None:
        database = scorer.encode_database(inputs[database_idx])
    _check_database(database, database_idx)
    scores = scorer.score(scorer.encode_queries(inputs[query_idx]), database)
    return scores, labels[query_idx], labels[database_idx], database


def _is_stream(inputs) -> bool:
    # A stream is a TensorFlow or Keras object: without TensorFlow loaded,
    # `inputs` cannot be one (and this module stays free of TensorFlow).
    if "tensorflow" not in sys.modules:
        return False
    from subic_keras.data import streams

    return streams.is_stream(inputs)


def _check_database(database: np.ndarray, database_idx: np.ndarray) -> None:
    if len(database) != len(database_idx):
        raise ValueError(
            f"database must hold the protocol's {len(database_idx)} database "
            f"items, received {len(database)}"
        )


def _stream_scores(scorer, inputs, labels, protocol, seed, database, **protocol_args):
    """`protocol_scores` of a stream: its labels from one pass (unless given),
    then the database's and the queries' rows encoded batch by batch."""
    from subic_keras.data import streams

    if labels is None:
        labels = streams.summarize(inputs, "inputs").labels
    labels = np.asarray(labels)
    query_idx, database_idx = protocols.protocol_split(
        protocol, labels, seed=seed, **protocol_args
    )

    def encode(encoder, positions):
        order = np.sort(positions)
        parts = [encoder(batch) for batch in streams.rows(inputs, order, labels)]
        return np.concatenate(parts)[np.searchsorted(order, positions)]

    if database is None:
        database = encode(scorer.encode_database, database_idx)
    _check_database(database, database_idx)
    scores = scorer.score(encode(scorer.encode_queries, query_idx), database)
    return scores, labels[query_idx], labels[database_idx], database


def evaluate(
    scorer: Scorer,
    inputs,
    labels=None,
    protocol: str = "paper",
    *,
    seed: int = 0,
    database: np.ndarray | None = None,
    ks: Sequence[int] = (10, 100),
    ties: str = "pessimistic",
    extras: bool = True,
    **protocol_args,
) -> dict:
    """Retrieval mAP and precision/recall@k of any `Scorer` on a protocol.

    Example:

    >>> from subic_keras.baselines import ProductQuantizer
    >>> rng = np.random.default_rng(0)
    >>> labels = np.repeat(np.arange(4), 160)
    >>> features = rng.normal(size=(640, 8)).astype("float32") + labels[:, None]
    >>> pq = ProductQuantizer(num_subspaces=2, bits_per_subspace=4).fit(features)
    >>> result = evaluate(pq, features, labels, "random", num_queries=20, ks=(10,))
    >>> round(result["map"], 4) > 0.5, result["bits"]
    (True, 8)

    Args:
        scorer: the method (`Subic`, `HashingNetwork`, `Quantizer`, ...).
        inputs: what `scorer` encodes (images, features), `(n, ...)`, or
            a stream of `(input, label)` pairs (`subic_keras.data.streams`),
            read in batches: twice, or once more without `database`.
        labels: class ids `(n,)` or multi-hot `(n, C)`; `None` for a stream.
        protocol: a name of `protocols.RETRIEVAL_PROTOCOLS`.
        seed: the protocol's seed.
        database: the encoded database, to skip encoding it again.
        ks: cut-offs of precision@k and recall@k.
        ties: tie handling of `map` (`subic_keras.evaluation`).
        extras: also report `map_expected` (exact mean over tie orders) and
            `map_21point` (21-point interpolated, ties in database order: the
            SuBiC authors' definition).
        **protocol_args: `num_queries` or `queries_per_class` for "random".

    Returns:
        A JSON-ready dict: the metrics, `protocol`, `num_database`,
        `distinct_database_codes` and `scorer.describe()`.
    """
    scores, query_labels, database_labels, database = protocol_scores(
        scorer,
        inputs,
        labels,
        protocol,
        seed=seed,
        database=database,
        **protocol_args,
    )
    result = evaluation.evaluate_retrieval(
        scores, query_labels, database_labels, ks=ks, ties=ties
    )
    if extras:
        result["map_expected"] = (
            result["map"]
            if ties == "expected"
            else evaluation.mean_average_precision(
                scores, query_labels, database_labels, ties="expected"
            )
        )
        result["map_21point"] = evaluation.mean_average_precision(
            scores, query_labels, database_labels, interpolation="21point", ties="index"
        )
    result.update(protocol=protocol, num_database=len(database_labels))
    result["distinct_database_codes"] = len(
        np.unique(np.asarray(database).reshape(len(database), -1), axis=0)
    )
    result.update(scorer.describe())
    return result
