"""The one-hot classifier: a classifier's prediction, used as a code.

Sablayrolles, Douze, Usunier and Jégou ("How should we evaluate supervised
hashing?", ICASSP 2017) show that on the standard protocols, where queries
and database share the training classes, the one-hot encoding of a
classifier's prediction reaches the best published supervised-hashing mAP:
the protocol rewards classifying, not describing. On classes held out of
training (`protocols.held_out_classes`, the `"unseen"` protocol) it has
nothing to go on, which is what that protocol measures.

Here it is searched as SuBiC is (paper Sec. 3.3, with one block): a
picture's code is its predicted class `c(x)` (one block of `K`, the
classes' count rounded up to a power of two: `log2 K` bits), a query its
class posterior `p(q)`, and the score `s(q, x) = p(q)[c(x)]`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.evaluation.scoring import Scorer


class OneHotClassifier(Scorer):
    """A classifier's prediction as a one-block code, its posterior as query.

    Example:

    >>> posteriors = {"a": np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])}
    >>> scorer = OneHotClassifier(lambda key: posteriors[key])
    >>> codes = scorer.encode_database("a")
    >>> codes.ravel().tolist(), scorer.describe()["bits"]
    ([0, 2], 2)
    >>> scores = scorer.score(scorer.encode_queries("a"), codes)
    >>> [[round(float(s), 2) for s in row] for row in scores]
    [[0.7, 0.1], [0.1, 0.8]]

    Args:
        predict: inputs to class posteriors `(n, C)` (e.g. the second output
            of `Subic.query_model()`).
    """

    def __init__(self, predict: Callable[..., np.ndarray]):
        self.predict = predict
        self.num_classes: int | None = None

    def _posteriors(self, inputs) -> np.ndarray:
        posteriors = np.asarray(self.predict(inputs), np.float32)
        if posteriors.ndim != 2 or posteriors.shape[1] < 2:
            raise ValueError(
                f"predict must return class posteriors (n, C) with C >= 2, "
                f"received shape {posteriors.shape}"
            )
        if self.num_classes is None:
            self.num_classes = posteriors.shape[1]
        elif posteriors.shape[1] != self.num_classes:
            raise ValueError(
                f"predict returned {posteriors.shape[1]} classes, earlier "
                f"{self.num_classes}"
            )
        return posteriors

    @property
    def block_size(self) -> int:
        """`K`: the classes' count rounded up to a power of two."""
        if self.num_classes is None:
            raise ValueError("block_size is known once inputs are encoded")
        return 1 << (self.num_classes - 1).bit_length()

    def encode_database(self, inputs) -> np.ndarray:
        """The predicted classes, int32 `(n, 1)`: one block."""
        return self._posteriors(inputs).argmax(1).astype(np.int32)[:, None]

    def encode_queries(self, inputs) -> np.ndarray:
        """The class posteriors, padded with zeros to `K`: `(n, K)`."""
        posteriors = self._posteriors(inputs)
        padding = self.block_size - posteriors.shape[1]
        return np.pad(posteriors, ((0, 0), (0, padding)))

    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """`s(q, x) = p(q)[c(x)]`, `(nq, n)`: SuBiC's asymmetric score."""
        return evaluation.asymmetric_scores(queries, database, 1, self.block_size)

    def describe(self) -> dict:
        bits = None if self.num_classes is None else self.block_size.bit_length() - 1
        return {"bits": bits, "num_classes": self.num_classes}
