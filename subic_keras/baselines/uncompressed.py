"""The uncompressed reference: float feature vectors, searched exhaustively.

Not a code: every database item keeps its `d` float32 values (`32·d` bits).
Its mAP is what a compact code gives up (or, across domains, can gain over
a raw feature space: the paper's Table 3 reports both).
"""

from __future__ import annotations

import numpy as np

from subic_keras._validation import check_features
from subic_keras.evaluation.scoring import Scorer

METRICS = ("l2", "cosine")


class Uncompressed(Scorer):
    """Scores float features by negative squared distance or cosine.

    `score(q, x) = −‖q − x‖²` for `metric="l2"`, and
    `score(q, x) = qᵀx / (‖q‖ ‖x‖)` for `metric="cosine"`; higher is better.

    Example:

    >>> features = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    >>> Uncompressed("l2").score(features[:1], features).round(3)
    array([[ 0., -5., -4.]])
    >>> Uncompressed("cosine").score(features[:1], features).round(3)
    array([[1., 0., 1.]])

    Args:
        metric: `"l2"` or `"cosine"`.
    """

    def __init__(self, metric: str = "l2"):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, received {metric!r}")
        self.metric = metric

    def encode_database(self, inputs) -> np.ndarray:
        """The features themselves, checked: float32 `(n, d)`."""
        return check_features("database", inputs)

    def encode_queries(self, inputs) -> np.ndarray:
        """The features themselves, checked: float32 `(n, d)`."""
        return check_features("queries", inputs)

    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """Scores `(num_queries, num_database)`, float64."""
        database = check_features("database", database).astype(np.float64)
        queries = check_features("queries", queries, database.shape[1])
        queries = queries.astype(np.float64)
        if self.metric == "cosine":
            return _unit_rows(queries) @ _unit_rows(database).T
        squared = np.square(database).sum(axis=1)[None, :]
        return 2.0 * queries @ database.T - squared - np.square(queries).sum(1)[:, None]

    def describe(self) -> dict:
        return {"metric": self.metric}


def _unit_rows(x: np.ndarray) -> np.ndarray:
    # Zero vectors stay zero (cosine 0 with everything) instead of NaN.
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
