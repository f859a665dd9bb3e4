"""Brute-force NumPy references for the search tests."""

import numpy as np


def brute_scores(queries, codes, block_size):
    """Reference: score[q, j] = sum_m queries[q, m*K + codes[j, m]]."""
    columns = np.arange(codes.shape[1]) * block_size + codes
    return queries.astype(np.float64)[:, columns].sum(axis=-1)


def brute_search(queries, codes, ids, k, block_size):
    scores = brute_scores(queries, codes, block_size)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def random_codes(rng, n, num_blocks, block_size):
    return rng.integers(0, block_size, (n, num_blocks))


def distinct_codes(rng, n, num_blocks, block_size):
    """Random codes without repeats, so continuous queries give no ties."""
    codes = np.unique(random_codes(rng, 2 * n, num_blocks, block_size), axis=0)
    assert len(codes) >= n
    return rng.permutation(codes)[:n]


def relu_queries(rng, nq, num_blocks, block_size):
    return np.maximum(rng.standard_normal((nq, num_blocks * block_size)), 0).astype(
        np.float32
    )
