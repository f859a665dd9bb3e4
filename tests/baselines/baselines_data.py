"""Data the baselines' tests share: separable features and a mAP of codes."""

import numpy as np

from subic_keras.evaluation import retrieval_metrics as evaluation


def clusters(n, dim=16, classes=4, seed=0, spread=0.6):
    """Gaussian clusters: features whose class is recoverable by search."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(123).normal(size=(classes, dim)) * 2
    labels = rng.integers(0, classes, n)
    features = centers[labels] + spread * rng.normal(size=(n, dim))
    return features.astype(np.float32), labels


def map_of_bits(query_bits, query_labels, database_bits, database_labels):
    scores = evaluation.hamming_scores(query_bits, database_bits)
    return evaluation.mean_average_precision(scores, query_labels, database_labels)
