"""PQ, OPQ and LSQ (`subic_keras.baselines.quantizers`)."""

import warnings

import numpy as np
import pytest
from baselines_data import clusters

from subic_keras.baselines import (
    LocalSearchQuantizer,
    OptimizedProductQuantizer,
    ProductQuantizer,
)
from subic_keras.evaluation import retrieval_metrics as evaluation


def _small_quantizers():
    return [
        ProductQuantizer(4, 4),
        OptimizedProductQuantizer(4, 4, num_rotation_iterations=5),
        LocalSearchQuantizer(4, 4, num_iterations=3, encode_ils_iterations=2),
        # Codes that do not fill whole bytes.
        ProductQuantizer(8, 3),
        LocalSearchQuantizer(3, 5, num_iterations=2, encode_ils_iterations=2),
    ]


@pytest.fixture(scope="module")
def fitted_quantizers():
    features, _ = clusters(700, seed=1)
    fitted = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for quantizer in _small_quantizers():
            fitted.append(quantizer.fit(features, seed=0))
    return fitted


@pytest.fixture(params=range(5), ids=["pq", "opq", "lsq", "pq-8x3", "lsq-3x5"])
def quantizer(request, fitted_quantizers):
    return fitted_quantizers[request.param]


def test_quantizer_codes(quantizer):
    features, _ = clusters(50, seed=2)
    codes = quantizer.encode(features)
    assert codes.shape == (50, quantizer.num_codebooks) and codes.dtype == np.int32
    assert codes.min() >= 0 and codes.max() < quantizer.codebook_size
    np.testing.assert_array_equal(codes, quantizer.encode(features))
    decoded = quantizer.decode(codes)
    assert decoded.shape == features.shape and decoded.dtype == np.float32
    # A useful quantizer reconstructs far better than the features' variance.
    error = np.mean(np.sum((features - decoded) ** 2, axis=1))
    spread = np.mean(np.sum((features - features.mean(0)) ** 2, axis=1))
    assert error < 0.5 * spread


def test_quantizer_adc_matches_brute_force(quantizer):
    database, _ = clusters(60, seed=3)
    queries, _ = clusters(9, seed=4)
    codes = quantizer.encode(database)
    reconstructed = quantizer.decode(codes).astype(np.float64)
    expected = -np.sum(
        (queries[:, None, :].astype(np.float64) - reconstructed[None]) ** 2, axis=-1
    )
    scores = quantizer.asymmetric_scores(queries, codes)
    assert scores.shape == (9, 60) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    # Chunking changes at most the rounding (BLAS blocks rotations by size).
    np.testing.assert_allclose(
        quantizer.asymmetric_scores(queries, codes, chunk_size=2), scores, rtol=1e-6
    )


@pytest.mark.parametrize("index", [0, 1, 3])
def test_product_codes_are_nearest_reconstructions(fitted_quantizers, index):
    # PQ and OPQ encode exactly: no code reconstructs a vector better than
    # its own, so each vector scores its own code highest.
    quantizer = fitted_quantizers[index]
    features, _ = clusters(80, seed=5)
    codes = quantizer.encode(features)
    scores = quantizer.asymmetric_scores(features, codes)
    own = np.diag(scores)
    assert np.all(own >= scores.max(axis=1) - 1e-4 * np.abs(own).max())


def test_quantizer_retrieval_map(quantizer):
    features, labels = clusters(300, seed=6)
    queries, database = features[:40], features[40:]
    scores = quantizer.asymmetric_scores(queries, quantizer.encode(database))
    value = evaluation.mean_average_precision(scores, labels[:40], labels[40:])
    assert np.isfinite(value) and 0.0 <= value <= 1.0
    assert value > 0.8  # four well-separated clusters; chance is about 0.25


def test_quantizer_fit_is_seeded():
    features, _ = clusters(700, seed=7)
    first = ProductQuantizer(4, 4).fit(features, seed=3).encode(features)
    again = ProductQuantizer(4, 4).fit(features, seed=3).encode(features)
    np.testing.assert_array_equal(first, again)


def test_64_bit_configurations():
    quantizers = [
        ProductQuantizer(8, 8),
        OptimizedProductQuantizer(8),
        LocalSearchQuantizer(8, 8),
    ]
    for quantizer in quantizers:
        assert quantizer.bits == 64
        assert quantizer.codebook_size == 256 and not quantizer.is_fitted
    features, _ = clusters(256, dim=16, seed=8)
    with pytest.warns(UserWarning, match="advised"):
        pq = quantizers[0].fit(features)
    codes = pq.encode(features[:10])
    assert codes.shape == (10, 8) and codes.max() < 256


def test_quantizer_bad_arguments():
    with pytest.raises(ValueError, match="num_codebooks must be >= 1, received 0"):
        ProductQuantizer(0)
    with pytest.raises(ValueError, match="bits_per_codebook must be <= 16"):
        LocalSearchQuantizer(8, 17)
    with pytest.raises(TypeError, match="num_codebooks must be an integer"):
        ProductQuantizer(2.5)
    with pytest.raises(ValueError, match="num_rotation_iterations must be >= 1"):
        OptimizedProductQuantizer(4, num_rotation_iterations=0)
    features, _ = clusters(100, seed=9)
    pq = ProductQuantizer(4, 4)
    with pytest.raises(ValueError, match="not fitted"):
        pq.encode(features)
    with pytest.raises(ValueError, match="divisible by num_subspaces = 3"):
        ProductQuantizer(3, 4).fit(features)
    with pytest.raises(ValueError, match="at least 2\\*\\*bits_per_codebook = 256"):
        ProductQuantizer(4, 8).fit(features)
    with pytest.raises(ValueError, match="features must be a non-empty 2-D array"):
        pq.fit(features[0])
    bad = features.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="features must be finite"):
        pq.fit(bad)
    with pytest.raises(TypeError, match="features must hold real numbers"):
        pq.fit(features.astype(complex))
    with pytest.raises(ValueError, match="seed must be >= 0"):
        pq.fit(features, seed=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pq.fit(features)
    with pytest.raises(ValueError, match="queries must have 16 columns"):
        pq.asymmetric_scores(features[:, :8], pq.encode(features))
    with pytest.raises(ValueError, match="codes must lie in \\[0, 16\\)"):
        pq.decode(np.full((2, 4), 16))
    with pytest.raises(ValueError, match="codes must have shape \\(n, num_codebooks"):
        pq.decode(np.zeros((2, 3), int))
    with pytest.raises(TypeError, match="codes must have an integer dtype"):
        pq.asymmetric_scores(features, np.zeros((2, 4)))


def test_opq_needs_as_many_vectors_as_dimensions():
    """faiss's OPQMatrix crashes the process below that; we raise instead."""
    from subic_keras.baselines import OptimizedProductQuantizer

    features = np.random.default_rng(0).normal(size=(40, 64)).astype("float32")
    # The error comes before the few-points-per-codeword advice, not after it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError, match=r"at least as many vectors as dimensions \(64\)"
        ):
            OptimizedProductQuantizer(num_subspaces=8, bits_per_subspace=2).fit(
                features
            )
