"""DLBHC (`subic_keras.baselines.dlbhc`)."""

import keras
import numpy as np
from baselines_data import clusters, map_of_bits

from subic_keras.baselines import (
    DLBHC,
    build_dlbhc,
)
from subic_keras.models import backbones


def test_dlbhc_learns_separable_features():
    keras.utils.set_random_seed(0)
    features, labels = clusters(400, seed=11)
    dlbhc = build_dlbhc(backbones.feature_input(16), bits=16, num_classes=4)
    dlbhc.train_model.fit(features, labels, batch_size=50, epochs=10, verbose=0)
    bits = dlbhc.encode(features)
    latent = keras.Model(
        dlbhc.train_model.inputs, dlbhc.train_model.get_layer("latent").output
    ).predict(features, verbose=0)
    np.testing.assert_array_equal(bits, latent > 0.5)
    assert map_of_bits(bits[:50], labels[:50], bits[50:], labels[50:]) > 0.8


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
    value = map_of_bits(bits[:50], y_test[:50], bits[50:], y_test[50:])
    assert np.isfinite(value) and 0.0 <= value <= 1.0

    path = tmp_path / "dlbhc.keras"
    dlbhc.train_model.save(path)
    reloaded = DLBHC.from_train_model(keras.saving.load_model(path))
    np.testing.assert_array_equal(reloaded.encode(x_test[:20]), bits[:20])
