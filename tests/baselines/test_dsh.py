"""DSH (`subic_keras.baselines.dsh`)."""

import keras
import numpy as np
import pytest
from baselines_data import clusters, map_of_bits

from subic_keras.baselines import (
    DSH,
    DSHLoss,
    build_dsh,
)
from subic_keras.models import backbones


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
    features, labels = clusters(400, seed=10)
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
    assert map_of_bits(bits[:50], labels[:50], bits[50:], labels[50:]) > 0.9


def test_dsh_on_cifar_and_saving(cifar, tmp_path):
    (x_train, y_train), (x_test, y_test) = cifar
    keras.utils.set_random_seed(0)
    dsh = build_dsh(backbones.dsh_cnn(), bits=12)
    assert dsh.margin == 24.0 and dsh.bits == 12 and dsh.backbone.name == "dsh_cnn"
    dsh.train_model.fit(x_train, y_train, batch_size=100, epochs=1, verbose=0)
    bits = dsh.encode(x_test)
    value = map_of_bits(bits[:50], y_test[:50], bits[50:], y_test[50:])
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
