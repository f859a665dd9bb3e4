"""The baselines `benchmarks.search_speed` measures the scanners against:
faiss's `IndexPQ` with identity centroids, NumPy scans, and a float64
brute force for recall.
"""

from __future__ import annotations

import faiss
import numpy as np


def identity_pq(num_blocks: int, block_size: int) -> faiss.IndexPQ:
    """faiss IndexPQ whose centroid j of every sub-quantizer is e_j."""
    nbits = block_size.bit_length() - 1
    index = faiss.IndexPQ(
        num_blocks * block_size, num_blocks, nbits, faiss.METRIC_INNER_PRODUCT
    )
    eye = np.tile(np.eye(block_size, dtype=np.float32), (num_blocks, 1, 1))
    faiss.copy_array_to_vector(eye.ravel(), index.pq.centroids)
    index.is_trained = True
    return index


def numpy_scan(codes_by_block: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Top-k ids for one query: one `np.take` per block (block-major codes)."""
    block_size = len(query) // len(codes_by_block)
    scores = np.take(query[:block_size], codes_by_block[0])
    for m in range(1, len(codes_by_block)):
        table = query[m * block_size : (m + 1) * block_size]
        scores += np.take(table, codes_by_block[m])
    return top_k(scores, k)


def numpy_gather_scan(offsets: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Top-k ids for one query: gather `query[offsets]` `(n, M)`, sum rows."""
    return top_k(np.take(query, offsets).sum(axis=1), k)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top], kind="stable")]


def brute_force(codes: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k ids in float64, equal scores by position (the reference)."""
    num_blocks = codes.shape[1]
    block_size = queries.shape[1] // num_blocks
    columns = codes.astype(np.int64) + np.arange(num_blocks) * block_size
    found = []
    for query in queries.astype(np.float64):
        scores = np.zeros(len(codes))
        for m in range(num_blocks):
            scores += query[columns[:, m]]
        found.append(np.lexsort((np.arange(len(codes)), -scores))[:k])
    return np.stack(found)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = [len(np.intersect1d(a, b)) for a, b in zip(found, truth)]
    return float(np.mean(hits) / truth.shape[1])
