"""Tests for subic_keras.baselines.training.train_hashing."""

import numpy as np
import pytest

from subic_keras.baselines import build_dlbhc, build_dsh, train_hashing
from subic_keras.models.backbones import feature_input
from subic_keras.trainers.callbacks import RetrievalValidation
from subic_keras.trainers.recipe import Recipe

FAST = Recipe(pretrain_epochs=0, epochs=2, batch_size=64, augment=False)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 100)
    features = rng.normal(size=(400, 16)).astype(np.float32) + 2 * labels[:, None]
    return (features[:300], labels[:300]), (features[300:], labels[300:])


@pytest.mark.parametrize("build", [build_dsh, build_dlbhc])
def test_trains_and_keeps_the_best_validation_epoch(data, build):
    (x, y), validation = data
    args = (12,) if build is build_dsh else (12, 4)
    network = build(feature_input(16), *args, input_shape=(16,), optimizer=None)
    summary = train_hashing(network, x, y, validation, recipe=FAST, seed=1)
    per_epoch = summary["validation_map_per_epoch"]
    assert summary["epochs_run"] == 2 and len(per_epoch) == 2
    assert summary["best_validation_map"] == max(per_epoch)
    assert summary["best_epoch"] == per_epoch.index(max(per_epoch)) + 1
    # The kept weights are the best epoch's: scoring them again gives its mAP.
    rescored = RetrievalValidation(network, *validation, queries=None).scores()
    assert rescored["val_map"] == pytest.approx(summary["best_validation_map"])


def test_bad_inputs(data):
    (x, y), validation = data
    with pytest.raises(TypeError, match="network must be a HashingNetwork"):
        train_hashing(object(), x, y, validation, recipe=FAST)
    network = build_dsh(feature_input(16), 12, input_shape=(16,), optimizer=None)
    with pytest.raises(ValueError, match="augment=True needs uint8 images"):
        train_hashing(network, x, y, validation, recipe=Recipe(epochs=1))
