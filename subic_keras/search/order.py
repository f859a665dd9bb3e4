"""The one order of search results: score, highest first, then position.

Every scan, every merge of ranges' or shards' top `k`s and every scanner
ranks by it, so that however a search is split its answer is the same.
"""

from __future__ import annotations

import numpy as np


def best_order(
    scores: np.ndarray, positions: np.ndarray, k: int | None = None
) -> np.ndarray:
    """The columns of each row by score, highest first, equal scores by
    position; its first `k`."""
    return np.lexsort((positions, -scores), axis=-1)[:, :k]


def best_first(scores: np.ndarray, positions: np.ndarray, k: int | None = None):
    """Each row by score, highest first, equal scores by position; its first `k`."""
    order = best_order(scores, positions, k)
    return (
        np.take_along_axis(scores, order, axis=1),
        np.take_along_axis(positions, order, axis=1),
    )
