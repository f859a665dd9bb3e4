"""End-to-end training of a SuBiC model on an image dataset (`subic train`).

`train` loads a dataset, holds out a validation split and runs the recipe
of `subic_keras.recipe` with the settings of a `TrainConfig`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import keras
import numpy as np

from subic_keras import backbones, datasets
from subic_keras._io import atomic_path
from subic_keras._validation import check_block_shape, check_int, check_non_negative
from subic_keras.backbones import mlp_backbone
from subic_keras.callbacks import EpochTensorBoard
from subic_keras.datasets import DATASETS, load_images
from subic_keras.models import Subic, build_subic
from subic_keras.recipe import Recipe, train_subic

BACKBONES = ("auto", "dsh_cnn", "mlp")
# `subic train`'s defaults are the recipe's.
_RECIPE = Recipe()


def default_cache_dir() -> str:
    """Where `subic train` caches pre-trained backbones: `$SUBIC_CACHE_DIR`, or
    `~/.cache/subic-keras`."""
    return os.environ.get("SUBIC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "subic-keras"
    )


@dataclasses.dataclass
class TrainConfig:
    """Everything `train` needs; the CLI's flags map one to one onto it.

    The defaults are the recipe of `subic_keras.recipe` (its docstring says
    how each was chosen): 48-bit codes of 8 blocks of 64, the backbone
    pre-trained as a classifier for 50 epochs, then 5 SuBiC epochs with
    `γ = μ = 0.3` ramped in over the first third, selection by validation
    retrieval mAP and the query chosen on validation.

    Attributes:
        dataset: `"digits"` (bundled, offline), `"cifar10"` or
            `"fashion_mnist"`.
        data_dir: a directory in the dataset's standard layout; `None` uses
            tensorflow-datasets (network needed once) for CIFAR-10 and
            Fashion-MNIST.
        num_blocks, block_size: `M` and `K`; codes have `M·log2 K` bits.
        gamma, mu: weights of the mean and batch block entropies (Eq. 8).
        pretrain_epochs: epochs of classifier pre-training (0: none).
        epochs: epochs of the SuBiC stage.
        batch_size, learning_rate: Adam's schedule in both stages; the
            learning rate drops ×0.1 after 75% of a stage's steps.
        warmup_epochs: SuBiC epochs over which γ and μ ramp up from 0, at
            most `epochs`; `None` is a third of `epochs`.
        validation_size: fraction or count of training images held out for
            model selection (never the test set); the split is the same for
            every seed, so that seeds are compared on the same images.
        backbone: `"dsh_cnn"`, `"mlp"`, or `"auto"` (MLP for 8×8 digits, the
            DSH CNN otherwise).
        augment: random flips and shifts during training; `None` turns them
            on for images of at least 16×16 pixels.
        max_train_images: train on the first `n` training images only
            (quick runs); the test set is read up to the same count.
        seed: seed of the initial weights, the data order and augmentation.
        output_dir: where `best.keras`, `summary.json` and TensorBoard logs go.
        cache_dir: where pre-trained backbones are cached, keyed by
            everything they depend on; `None` is `default_cache_dir()`.
    """

    dataset: str = "digits"
    data_dir: str | None = None
    num_blocks: int = 8
    block_size: int = 64
    gamma: float = _RECIPE.gamma
    mu: float = _RECIPE.mu
    pretrain_epochs: int = _RECIPE.pretrain_epochs
    epochs: int = _RECIPE.epochs
    batch_size: int = _RECIPE.batch_size
    learning_rate: float = _RECIPE.learning_rate
    warmup_epochs: float | None = None
    validation_size: float = 0.1
    backbone: str = "auto"
    augment: bool | None = None
    max_train_images: int | None = None
    seed: int = 0
    output_dir: str = "subic_run"
    cache_dir: str | None = None

    def __post_init__(self):
        if self.dataset not in DATASETS:
            raise ValueError(
                f"dataset must be one of {DATASETS}, received {self.dataset!r}"
            )
        if self.backbone not in BACKBONES:
            raise ValueError(
                f"backbone must be one of {BACKBONES}, received {self.backbone!r}"
            )
        check_block_shape(self.num_blocks, self.block_size)
        check_int("epochs", self.epochs, minimum=1)
        if self.warmup_epochs is not None:
            check_non_negative("warmup_epochs", self.warmup_epochs)
            if self.warmup_epochs > self.epochs:
                raise ValueError(
                    f"warmup_epochs must be at most epochs ({self.epochs}), "
                    f"received {self.warmup_epochs}"
                )
        if self.max_train_images is not None:
            check_int("max_train_images", self.max_train_images, minimum=2)
        self.recipe()  # validates the budgets and weights

    def recipe(self, augment: bool = True) -> Recipe:
        """The `Recipe` of this configuration (`augment` when `self.augment`
        is `None`)."""
        warmup = self.epochs / 3 if self.warmup_epochs is None else self.warmup_epochs
        return Recipe(
            pretrain_epochs=self.pretrain_epochs,
            epochs=self.epochs,
            gamma=self.gamma,
            mu=self.mu,
            warmup_fraction=warmup / self.epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            augment=augment if self.augment is None else self.augment,
        )


def standardization(images: np.ndarray) -> keras.layers.Normalization:
    """A Normalization layer with `images`' channel statistics, on `[0, 1]` inputs."""
    mean, std = datasets.channel_statistics(images)
    return keras.layers.Normalization(
        axis=-1, mean=mean, variance=np.square(std), name="standardize"
    )


def _backbone(config: TrainConfig, shape) -> keras.Model:
    kind = config.backbone
    if kind == "auto":
        kind = "mlp" if min(shape[:2]) < 16 else "dsh_cnn"
    if kind == "dsh_cnn":
        return backbones.dsh_cnn(input_shape=shape)
    return mlp_backbone(shape)


def build_model(config: TrainConfig, x_train: np.ndarray, num_classes: int) -> Subic:
    """The SuBiC network of `config` for images shaped like `x_train`, untrained."""
    shape = x_train.shape[1:]
    return build_subic(
        _backbone(config, shape),
        config.num_blocks,
        config.block_size,
        num_classes,
        gamma=config.gamma,
        mu=config.mu,
        input_shape=shape,
        preprocessing=standardization(x_train),
        optimizer=None,
    )


def train(config: TrainConfig, verbose: int | str = "auto", callbacks=()) -> dict:
    """Trains SuBiC with the recipe of `subic_keras.recipe` as configured.

    Writes `best.keras` (the model of the best validation epoch, its query
    chosen on validation; saved atomically), `summary.json` (both stages)
    and TensorBoard logs (`logs/pretrain`, `logs/subic`) under
    `config.output_dir`. The pre-trained backbone is cached in
    `config.cache_dir`: a second run with the same dataset, seed and
    pre-training budget (at any bit-rate) skips stage 1, and an interrupted
    pre-training resumes.

    Args:
        config: the settings.
        verbose: `fit`'s verbosity; `"auto"`: a progress bar on a terminal,
            a line per epoch otherwise.
        callbacks: more Keras callbacks, given to both stages' `fit`.

    Returns:
        The summary: configuration, both stages, best epoch, validation and
        test metrics, wall time, and `"stopped_on_nan"`.
    """
    start = time.time()
    (x_train, y_train), (x_test, y_test) = load_images(
        config.dataset, config.data_dir, config.max_train_images
    )
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    train_idx, val_idx = datasets.train_validation_split(
        y_train, config.validation_size, seed=0
    )
    x_val, y_val = x_train[val_idx], y_train[val_idx]
    x_fit, y_fit = x_train[train_idx], y_train[train_idx]
    shape = x_fit.shape[1:]
    recipe = config.recipe(augment=min(shape[:2]) >= 16)
    cache_dir = config.cache_dir or default_cache_dir()
    os.makedirs(config.output_dir, exist_ok=True)
    logs = os.path.join(config.output_dir, "logs")
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2

    keras.utils.set_random_seed(config.seed)
    subic, run = train_subic(
        _backbone(config, shape),
        config.num_blocks,
        config.block_size,
        x_fit,
        y_fit,
        (x_val, y_val),
        num_classes=num_classes,
        recipe=recipe,
        seed=config.seed,
        preprocessing=standardization(x_fit),
        cache_dir=cache_dir,
        pretrain_callbacks=[
            EpochTensorBoard(os.path.join(logs, "pretrain")),
            *callbacks,
        ],
        callbacks=[EpochTensorBoard(os.path.join(logs, "subic")), *callbacks],
        verbose=verbose,
    )
    best_path = os.path.join(config.output_dir, "best.keras")
    summary = {
        "config": dataclasses.asdict(config),
        "recipe": run.pop("recipe"),
        "cache_dir": cache_dir,
        "bits": run["bits"],
        "num_train": len(x_fit),
        "num_validation": len(x_val),
        "num_test": len(x_test),
        **run,
        "checkpoint": None,
    }
    if run["best_epoch"] is not None:
        with atomic_path(best_path, suffix=".keras") as tmp:
            subic.train_model.save(tmp)
        summary["checkpoint"] = best_path
        test_data = datasets.make_dataset(x_test, y_test, 256)
        summary["test"] = evaluate_classification(subic, test_data, y_test)
    summary["wall_seconds"] = round(time.time() - start, 1)
    with atomic_path(os.path.join(config.output_dir, "summary.json")) as tmp:
        with open(tmp, "w") as handle:
            json.dump(summary, handle, indent=2)
    return summary


def evaluate_classification(subic: Subic, data, labels: np.ndarray) -> dict:
    """Top-1 accuracy from soft codes `b̃` and from binary codes `b`."""
    images = data.map(lambda x, y: x)
    soft = subic.train_model.predict(images, verbose=0)["class_probs"]
    binary = subic.classifier.predict(images, verbose=0)
    return {
        "accuracy_soft": float(np.mean(soft.argmax(-1) == labels)),
        "accuracy_binary": float(np.mean(binary.argmax(-1) == labels)),
    }
