"""`subic_keras.training`: the configuration behind `subic train`."""

import numpy as np
import pytest

from subic_keras.recipe import Recipe
from subic_keras.training import TrainConfig, standardization


def test_defaults_are_the_recipe():
    recipe = TrainConfig().recipe()
    default = Recipe()
    assert (recipe.gamma, recipe.mu, recipe.epochs, recipe.pretrain_epochs) == (
        default.gamma,
        default.mu,
        default.epochs,
        default.pretrain_epochs,
    )
    assert recipe.warmup_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "mnist"}, "dataset must be one of"),
        ({"backbone": "vgg"}, "backbone must be one of"),
        ({"block_size": 1}, "block_size"),
        ({"epochs": 3, "warmup_epochs": 4}, "warmup_epochs must be at most epochs"),
        ({"max_train_images": 1}, "max_train_images must be >= 2, received 1"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_standardization_uses_channel_statistics():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(20, 4, 4, 3), dtype=np.uint8)
    layer = standardization(images)
    out = np.asarray(layer(images.astype("float32") / 255))
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
