import json
import os

import keras
import numpy as np
import pytest

from subic_keras import Subic
from subic_keras.models.subic import QUERY_KINDS
from subic_keras.trainers import pretraining, recipe

NUM_CLASSES, DIM = 4, 12


def _clusters(n, seed):
    """Float features in 4 well separated Gaussian clusters."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).normal(scale=3.0, size=(NUM_CLASSES, DIM))
    labels = rng.integers(0, NUM_CLASSES, n)
    features = centers[labels] + rng.normal(size=(n, DIM))
    return features.astype("float32"), labels


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((DIM,)), keras.layers.Dense(16, activation="relu")], name="mlp"
    )


FAST = recipe.Recipe(
    pretrain_epochs=2, epochs=3, batch_size=32, learning_rate=1e-2, augment=False
)


@pytest.fixture(scope="module")
def data():
    return _clusters(320, 0), _clusters(80, 1)


def test_recipe_defaults_and_errors():
    default = recipe.Recipe()
    assert (default.pretrain_epochs, default.epochs) == (100, 5)
    assert (default.gamma, default.mu, default.batch_size) == (0.3, 0.3, 200)
    assert default.warmup_epochs == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="epochs must be >= 1, received 0"):
        recipe.Recipe(epochs=0)
    with pytest.raises(ValueError, match="pretrain_epochs must be >= 0, received -2"):
        recipe.Recipe(pretrain_epochs=-2)
    with pytest.raises(ValueError, match=r"warmup_fraction must be in \[0, 1\]"):
        recipe.Recipe(warmup_fraction=1.5)
    with pytest.raises(ValueError, match="learning_rate must be > 0, received 0"):
        recipe.Recipe(learning_rate=0)


def test_train_subic_on_features(data, tmp_path):
    (x, y), validation = data
    subic, summary = recipe.train_subic(
        _mlp(), 4, 8, x, y, validation, recipe=FAST, cache_dir=tmp_path
    )
    assert summary["bits"] == 12 and summary["epochs_run"] == 3
    assert summary["best_epoch"] in (1, 2, 3) and not summary["stopped_on_nan"]
    assert summary["query"] in QUERY_KINDS and subic.default_query == summary["query"]
    maps = summary["validation_map"]
    assert maps[summary["query"]] == max(maps.values())
    # Separable clusters: the codes retrieve well after a few epochs.
    assert maps[summary["query"]] > 0.8
    best = summary["best_epoch"] - 1
    assert summary["validation_map_per_epoch"]["fc0"][best] == pytest.approx(
        maps["fc0"]
    )
    assert summary["pretrain"]["epochs"] == 2 and not summary["pretrain"]["cached"]
    # The query choice travels with the saved model.
    subic.default_query = "class_posterior"
    subic.train_model.save(tmp_path / "m.keras")
    again = Subic.from_train_model(keras.saving.load_model(tmp_path / "m.keras"))
    assert again.default_query == "class_posterior"
    np.testing.assert_allclose(
        again.query(validation[0]), subic.query(validation[0], kind="class_posterior")
    )


def test_pretraining_cache_is_keyed_by_its_inputs(data, tmp_path):
    (x, y), validation = data
    first = _mlp()
    record = recipe.pretrain_backbone(
        first, x, y, validation, recipe=FAST, cache_dir=tmp_path
    )
    assert not record["cached"] and record["best_epoch"] in (1, 2)
    assert len(record["validation_accuracy_per_epoch"]) == 2
    # The same inputs: the cached weights, no training.
    second = _mlp()
    again = recipe.pretrain_backbone(
        second, x, y, validation, recipe=FAST, cache_dir=tmp_path
    )
    assert again["cached"] and again["key"] == record["key"]
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Another dataset, initial weights, architecture or budget: a new key.
    changed = [
        ((x[:-1], y[:-1]), _mlp(), FAST),
        ((x, y), _mlp(seed=1), FAST),
        (
            (x, y),
            keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(17)]),
            FAST,
        ),
        (
            (x, y),
            _mlp(),
            recipe.Recipe(pretrain_epochs=3, batch_size=32, augment=False),
        ),
    ]
    keys = {record["key"]}
    for (images, labels), backbone, budget in changed:
        key = pretraining.pretraining_key(
            backbone, None, images, labels, validation, NUM_CLASSES, budget, 0
        )
        assert key not in keys
        keys.add(key)


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt


def test_pretraining_resumes_after_an_interruption(data, tmp_path):
    (x, y), validation = data
    budget = recipe.Recipe(pretrain_epochs=4, batch_size=32, augment=False)
    with pytest.raises(KeyboardInterrupt):
        recipe.pretrain_backbone(
            _mlp(),
            x,
            y,
            validation,
            recipe=budget,
            cache_dir=tmp_path,
            callbacks=[_Interrupt(1)],
        )
    (partial,) = [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
    state = json.loads((tmp_path / partial / "state.json").read_text())
    assert state["epoch"] == 2 and len(state["history"]) == 2
    # Only the snapshot named by the state is kept.
    files = sorted(os.listdir(tmp_path / partial))
    assert set(files) <= {"state.json", state["weights_file"], state["best_file"]}
    record = recipe.pretrain_backbone(
        _mlp(), x, y, validation, recipe=budget, cache_dir=tmp_path
    )
    assert record["resumed_at_epoch"] == 2 and not record["cached"]
    assert len(record["validation_accuracy_per_epoch"]) == 4
    assert record["validation_accuracy_per_epoch"][:2] == state["history"]
    assert not (tmp_path / partial).exists()


def test_images_28x28x1_with_augmentation(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 120)
    images = np.zeros((120, 28, 28, 1), np.uint8)
    for c in range(3):  # a bright band per class
        images[labels == c, 4 + 8 * c : 10 + 8 * c] = 200
    images = np.clip(images + rng.integers(0, 40, images.shape), 0, 255)
    images = images.astype(np.uint8)
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(4, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
        ]
    )
    budget = recipe.Recipe(pretrain_epochs=1, epochs=2, batch_size=20)
    subic, summary = recipe.train_subic(
        backbone,
        2,
        4,
        images[:90],
        labels[:90],
        (images[90:], labels[90:]),
        recipe=budget,
    )
    assert summary["recipe"]["augment"] and summary["best_epoch"] in (1, 2)
    assert subic.encode(images[:5] / 255).shape == (5, 2)


def test_bad_inputs(data, tmp_path):
    (x, y), validation = data
    with pytest.raises(ValueError, match="augment=True needs uint8 images"):
        recipe.train_subic(
            _mlp(), 2, 4, x, y, validation, recipe=recipe.Recipe(pretrain_epochs=0)
        )
    with pytest.raises(ValueError, match="pretrain_epochs >= 1, received 0"):
        recipe.pretrain_backbone(
            _mlp(), x, y, validation, recipe=recipe.Recipe(pretrain_epochs=0)
        )
    with pytest.raises(ValueError, match="at least 20 images"):
        recipe.train_subic(_mlp(), 2, 4, x, y, (x[:10], y[:10]), recipe=FAST)
    with pytest.raises(ValueError, match="320 images and labels of shape"):
        recipe.train_subic(_mlp(), 2, 4, x, y[:-1], validation, recipe=FAST)
    with pytest.raises(ValueError, match="num_classes is 3, but the labels reach"):
        recipe.train_subic(_mlp(), 2, 4, x, y, validation, recipe=FAST, num_classes=3)
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.raises(ValueError, match="cache_dir must be a directory"):
        recipe.pretrain_backbone(
            _mlp(), x, y, validation, recipe=FAST, cache_dir=not_a_directory
        )
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="must be finite"):
        recipe.train_subic(_mlp(), 2, 4, bad, y, validation, recipe=FAST)


@pytest.mark.slow
@pytest.mark.xdist_group("mirrored")
def test_train_subic_under_mirrored_strategy(mirrored_checks):
    result = mirrored_checks["recipe"]
    assert result["replicas"] == 2
    assert result["best_epoch"] in (1, 2) and result["query"] in QUERY_KINDS
    assert result["validation_map"] > 0.5


def _with_batch_norm(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((DIM,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(),
        ],
        name="pretrained",
    )


def test_frozen_epochs_train_the_head_then_fine_tune_without_batch_norm(data):
    (x, y), validation = data
    backbone = _with_batch_norm()
    before = [w.copy() for w in backbone.get_weights()]
    frozen = recipe.Recipe(
        pretrain_epochs=1, frozen_epochs=1, batch_size=32, augment=False
    )
    record = recipe.pretrain_backbone(backbone, x, y, validation, recipe=frozen)
    assert record["best_epoch"] == 1
    for a, b in zip(before, backbone.get_weights()):
        np.testing.assert_array_equal(a, b)  # the backbone did not move
    assert all(layer.trainable for layer in backbone.layers)

    tuned = recipe.Recipe(
        pretrain_epochs=3, frozen_epochs=1, batch_size=32, augment=False
    )
    backbone = _with_batch_norm()
    norm = backbone.layers[1]
    statistics = [w.numpy().copy() for w in norm.non_trainable_weights]
    dense = backbone.layers[0].kernel.numpy().copy()
    record = recipe.pretrain_backbone(backbone, x, y, validation, recipe=tuned)
    assert len(record["validation_accuracy_per_epoch"]) == 3
    if record["best_epoch"] > 1:  # a fine-tuned epoch was kept
        assert not np.array_equal(backbone.layers[0].kernel.numpy(), dense)
    # Batch normalisation ran in inference mode throughout.
    for a, b in zip(statistics, norm.non_trainable_weights):
        np.testing.assert_array_equal(a, b.numpy())
    assert norm.trainable and backbone.trainable


def test_a_training_near_chance_says_so(tmp_path):
    # Random inputs and labels: nothing to learn, chance level at best.
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(240, DIM)).astype("float32"), rng.integers(0, 4, 240)
    validation = (rng.normal(size=(80, DIM)).astype("float32"), rng.integers(0, 4, 80))
    with pytest.warns(recipe.LearnedLittleWarning, match="the model learned little"):
        _, summary = recipe.train_subic(
            _mlp(), 4, 8, x, y, validation, recipe=FAST, cache_dir=tmp_path
        )
    assert "validation accuracy" in summary["warning"]
    assert "for chance (4 classes)" in summary["warning"]
    # A model that learned: no warning (`learned_little` on its figures).
    shares = [0, 0, 1, 1]
    learned = {
        "pretrain": {"best_validation_accuracy": 0.9},
        "validation_map": {"z": 0.8},
    }
    assert recipe.learned_little(learned, shares) is None
    near = {
        "pretrain": {"best_validation_accuracy": 0.52},
        "validation_map": {"z": 0.8},
    }
    assert "0.5200 against 0.5000" in recipe.learned_little(near, shares)
