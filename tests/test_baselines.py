import warnings

import faiss
import keras
import numpy as np
import pytest

from subic_keras import backbones, datasets, evaluation
from subic_keras.baselines import (
    DLBHC,
    DSH,
    Binarize,
    DSHLoss,
    LocalSearchQuantizer,
    OptimizedProductQuantizer,
    ProductQuantizer,
    build_dlbhc,
    build_dsh,
    hamming_search,
)


@pytest.fixture(scope="module", autouse=True)
def single_faiss_thread():
    # faiss's OpenMP threads spin while they wait; on a small shared machine
    # that turns milliseconds of k-means into seconds.
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(previous)


# ---------------------------------------------------------------------------
# Data.


def _clusters(n, dim=16, classes=4, seed=0, spread=0.6):
    """Gaussian clusters: features whose class is recoverable by search."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(123).normal(size=(classes, dim)) * 2
    labels = rng.integers(0, classes, n)
    features = centers[labels] + spread * rng.normal(size=(n, dim))
    return features.astype(np.float32), labels


@pytest.fixture(scope="module")
def cifar(shared_data_dir):
    (x_train, y_train), (x_test, y_test) = datasets.load_cifar10(
        shared_data_dir / "cifar-10-batches-bin", max_per_split=300
    )
    # Per-image scaling keeps the tiny from-scratch runs well conditioned.
    scale = lambda x: (x.astype("float32") - 127.5) / 64.0  # noqa: E731
    return (scale(x_train), y_train), (scale(x_test), y_test)


def _map_of_bits(query_bits, query_labels, database_bits, database_labels):
    scores = evaluation.hamming_scores(query_bits, database_bits)
    return evaluation.mean_average_precision(scores, query_labels, database_labels)


# ---------------------------------------------------------------------------
# Quantizers.


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
    features, _ = _clusters(700, seed=1)
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
    features, _ = _clusters(50, seed=2)
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
    database, _ = _clusters(60, seed=3)
    queries, _ = _clusters(9, seed=4)
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
    features, _ = _clusters(80, seed=5)
    codes = quantizer.encode(features)
    scores = quantizer.asymmetric_scores(features, codes)
    own = np.diag(scores)
    assert np.all(own >= scores.max(axis=1) - 1e-4 * np.abs(own).max())


def test_quantizer_retrieval_map(quantizer):
    features, labels = _clusters(300, seed=6)
    queries, database = features[:40], features[40:]
    scores = quantizer.asymmetric_scores(queries, quantizer.encode(database))
    value = evaluation.mean_average_precision(scores, labels[:40], labels[40:])
    assert np.isfinite(value) and 0.0 <= value <= 1.0
    assert value > 0.8  # four well-separated clusters; chance is about 0.25


def test_quantizer_fit_is_seeded():
    features, _ = _clusters(700, seed=7)
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
    features, _ = _clusters(256, dim=16, seed=8)
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
    features, _ = _clusters(100, seed=9)
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


# ---------------------------------------------------------------------------
# Hashing helpers.


def test_binarize_layer():
    layer = Binarize(0.5)
    bits = keras.ops.convert_to_numpy(layer(np.array([[0.2, 0.5, 0.7]], "float32")))
    np.testing.assert_array_equal(bits, [[0, 0, 1]])
    assert bits.dtype == np.int32
    assert Binarize.from_config(layer.get_config()).threshold == 0.5
    with pytest.raises(ValueError, match="threshold must be finite"):
        Binarize(float("nan"))


@pytest.mark.parametrize("num_bits", [12, 64])
def test_hamming_search_matches_hamming_scores(num_bits):
    rng = np.random.default_rng(num_bits)
    query = rng.integers(0, 2, (7, num_bits))
    database = rng.integers(0, 2, (40, num_bits))
    distances, indices = hamming_search(query, database, k=10)
    assert distances.shape == indices.shape == (7, 10)
    full = -evaluation.hamming_scores(query, database)
    np.testing.assert_array_equal(distances, np.sort(full, axis=1)[:, :10])
    np.testing.assert_array_equal(np.take_along_axis(full, indices, 1), distances)
    packed = hamming_search(
        np.packbits(query.astype(np.uint8), axis=1),
        np.packbits(database.astype(np.uint8), axis=1),
        k=10,
        packed=True,
    )
    np.testing.assert_array_equal(packed[0], distances)


def test_hamming_search_bad_arguments():
    bits = np.zeros((5, 8), int)
    with pytest.raises(ValueError, match="k must be <= the number of database codes"):
        hamming_search(bits, bits, k=6)
    with pytest.raises(ValueError, match="database_bits must hold bits 0 or 1"):
        hamming_search(bits, bits + 2, k=1)
    with pytest.raises(ValueError, match="same number of columns"):
        hamming_search(bits, np.zeros((5, 16), int), k=1)
    with pytest.raises(TypeError, match="query_bits must have dtype uint8"):
        hamming_search(bits, bits, k=1, packed=True)


# ---------------------------------------------------------------------------
# DSH.


def _dsh_reference(u, labels, margin, alpha):
    """DSH's pair loss averaged over the pairs i < j, with explicit loops."""
    u = u.astype(np.float64)
    total, pairs = 0.0, 0
    for i in range(len(u)):
        for j in range(i + 1, len(u)):
            s = float(labels[i] != labels[j])
            d = np.sum((u[i] - u[j]) ** 2)
            reg = np.sum(np.abs(np.abs(u[i]) - 1)) + np.sum(np.abs(np.abs(u[j]) - 1))
            total += 0.5 * (1 - s) * d + 0.5 * s * max(margin - d, 0.0) + alpha * reg
            pairs += 1
    return total / pairs


@pytest.mark.parametrize(("margin", "alpha"), [(None, 0.01), (10.0, 0.5)])
def test_dsh_loss_matches_reference(margin, alpha):
    rng = np.random.default_rng(0)
    u = rng.normal(size=(23, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 23)
    loss = DSHLoss(bits=8, margin=margin, alpha=alpha)
    value = float(loss(labels, u))
    expected = _dsh_reference(u, labels, 16.0 if margin is None else margin, alpha)
    np.testing.assert_allclose(value, expected, rtol=1e-5)
    # Column labels and a one-item batch (no pair).
    np.testing.assert_allclose(float(loss(labels[:, None], u)), expected, rtol=1e-5)
    assert float(loss(labels[:1], u[:1])) == 0.0


def test_dsh_loss_config_and_errors():
    loss = DSHLoss(bits=12, alpha=0.1)
    assert loss.margin == 24.0
    clone = DSHLoss.from_config(loss.get_config())
    assert (clone.bits, clone.margin, clone.alpha) == (12, 24.0, 0.1)
    with pytest.raises(ValueError, match="margin must be > 0"):
        DSHLoss(bits=4, margin=0)
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        DSHLoss(bits=4, alpha=-1)
    with pytest.raises(ValueError, match="y_pred must have shape \\(batch, bits\\)"):
        loss(np.zeros(3), np.zeros((3, 4), "float32"))
    with pytest.raises(ValueError, match="y_true must hold one class label"):
        loss(np.zeros((3, 2)), np.zeros((3, 12), "float32"))


def test_dsh_learns_separable_features():
    keras.utils.set_random_seed(0)
    features, labels = _clusters(400, seed=10)
    dsh = build_dsh(
        backbones.feature_input(16), bits=12, optimizer=keras.optimizers.Adam(1e-2)
    )
    history = dsh.train_model.fit(features, labels, batch_size=100, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    bits = dsh.encode(features)
    assert bits.shape == (400, 12) and set(np.unique(bits)) <= {0, 1}
    relaxed = dsh.train_model.predict(features, verbose=0)
    np.testing.assert_array_equal(bits, relaxed > 0)
    assert _map_of_bits(bits[:50], labels[:50], bits[50:], labels[50:]) > 0.9


def test_dsh_on_cifar_and_saving(cifar, tmp_path):
    (x_train, y_train), (x_test, y_test) = cifar
    keras.utils.set_random_seed(0)
    dsh = build_dsh(backbones.dsh_cnn(), bits=12)
    assert dsh.margin == 24.0 and dsh.bits == 12 and dsh.backbone.name == "dsh_cnn"
    dsh.train_model.fit(x_train, y_train, batch_size=100, epochs=1, verbose=0)
    bits = dsh.encode(x_test)
    value = _map_of_bits(bits[:50], y_test[:50], bits[50:], y_test[50:])
    assert np.isfinite(value) and 0.0 <= value <= 1.0
    packed = dsh.encode(x_test, packed=True)
    assert packed.shape == (300, 2) and packed.dtype == np.uint8

    path = tmp_path / "dsh.keras"
    dsh.train_model.save(path)
    reloaded = DSH.from_train_model(keras.saving.load_model(path))
    assert (reloaded.margin, reloaded.alpha, reloaded.bits) == (24.0, 0.01, 12)
    np.testing.assert_array_equal(reloaded.encode(x_test[:20]), bits[:20])
    # The reloaded model keeps training with the same loss.
    assert isinstance(reloaded.train_model.loss, DSHLoss)
    reloaded.train_model.fit(x_train[:100], y_train[:100], epochs=1, verbose=0)


def test_build_dsh_bad_arguments():
    with pytest.raises(ValueError, match="bits must be >= 1, received 0"):
        build_dsh(backbones.feature_input(4), bits=0)
    with pytest.raises(TypeError, match="backbone must be a Keras model or layer"):
        build_dsh("dsh_cnn", bits=12)
    with pytest.raises(ValueError, match="input_shape is required"):
        build_dsh(keras.layers.Dense(4), bits=12)
    with pytest.raises(ValueError, match="train_model must have a layer named"):
        DSH(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))


# ---------------------------------------------------------------------------
# DLBHC.


def test_dlbhc_learns_separable_features():
    keras.utils.set_random_seed(0)
    features, labels = _clusters(400, seed=11)
    dlbhc = build_dlbhc(backbones.feature_input(16), bits=16, num_classes=4)
    dlbhc.train_model.fit(features, labels, batch_size=50, epochs=10, verbose=0)
    bits = dlbhc.encode(features)
    latent = keras.Model(
        dlbhc.train_model.inputs, dlbhc.train_model.get_layer("latent").output
    ).predict(features, verbose=0)
    np.testing.assert_array_equal(bits, latent > 0.5)
    assert _map_of_bits(bits[:50], labels[:50], bits[50:], labels[50:]) > 0.8


def test_dlbhc_on_cifar(cifar, tmp_path):
    (x_train, y_train), (x_test, y_test) = cifar
    keras.utils.set_random_seed(0)
    dlbhc = build_dlbhc(backbones.dsh_cnn(), bits=24, num_classes=10)
    assert dlbhc.num_classes == 10 and dlbhc.backbone.name == "dsh_cnn"
    history = dlbhc.train_model.fit(
        x_train, y_train, batch_size=100, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][-1])
    bits = dlbhc.encode(x_test)
    assert bits.shape == (300, 24)
    value = _map_of_bits(bits[:50], y_test[:50], bits[50:], y_test[50:])
    assert np.isfinite(value) and 0.0 <= value <= 1.0

    path = tmp_path / "dlbhc.keras"
    dlbhc.train_model.save(path)
    reloaded = DLBHC.from_train_model(keras.saving.load_model(path))
    np.testing.assert_array_equal(reloaded.encode(x_test[:20]), bits[:20])


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
