"""End-to-end training of a SuBiC model on an image dataset (`subic train`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import keras
import numpy as np

from subic_keras import backbones, datasets
from subic_keras._io import atomic_path
from subic_keras._validation import check_block_shape, check_int, check_non_negative
from subic_keras.callbacks import BestModelCheckpoint, EntropyWarmup
from subic_keras.models import Subic, build_subic

DATASETS = ("digits", "cifar10", "fashion_mnist")
BACKBONES = ("auto", "dsh_cnn", "mlp")


@dataclasses.dataclass
class TrainConfig:
    """Everything `train` needs; the CLI's flags map one to one onto it.

    Attributes:
        dataset: `"digits"` (bundled, offline), `"cifar10"` or
            `"fashion_mnist"`.
        data_dir: a directory in the dataset's standard layout; `None` uses
            tensorflow-datasets (network needed once) for CIFAR-10 and
            Fashion-MNIST.
        num_blocks, block_size: `M` and `K`; codes have `M·log2 K` bits.
        gamma, mu: weights of the mean and batch block entropies.
        epochs, batch_size, learning_rate: Adam's schedule; the learning rate
            drops ×0.1 after 75% of the steps.
        warmup_epochs: epochs over which γ and μ ramp up from 0.
        validation_size: fraction or count of training images held out for
            model selection (never the test set).
        backbone: `"dsh_cnn"`, `"mlp"`, or `"auto"` (MLP for 8×8 digits, the
            DSH CNN otherwise).
        augment: random flips and shifts during training.
        max_train_images: train on the first `n` images only (quick runs).
        seed: seed of the split, the shuffling and the initial weights.
        output_dir: where `best.keras`, `summary.json` and TensorBoard logs go.
    """

    dataset: str = "digits"
    data_dir: str | None = None
    num_blocks: int = 4
    block_size: int = 16
    gamma: float = 1.0
    mu: float = 1.0
    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_epochs: float = 5.0
    validation_size: float = 0.1
    backbone: str = "auto"
    augment: bool = False
    max_train_images: int | None = None
    seed: int = 0
    output_dir: str = "subic_run"

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
        check_non_negative("gamma", self.gamma)
        check_non_negative("mu", self.mu)
        check_int("epochs", self.epochs, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_non_negative("warmup_epochs", self.warmup_epochs)
        if not self.learning_rate > 0:
            raise ValueError(
                f"learning_rate must be > 0, received {self.learning_rate}"
            )
        if self.max_train_images is not None:
            check_int("max_train_images", self.max_train_images, minimum=2)


def load_images(name: str, data_dir: str | None = None, limit: int | None = None):
    """Loads a dataset as uint8 images with a channel axis, `(n, H, W, C)`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`.
    """
    if name == "digits":
        (x_train, y_train), (x_test, y_test) = datasets.load_digits()
    elif name == "cifar10":
        (x_train, y_train), (x_test, y_test) = datasets.load_cifar10(
            data_dir, max_per_split=limit
        )
    elif name == "fashion_mnist":
        (x_train, y_train), (x_test, y_test) = datasets.load_fashion_mnist(
            data_dir, max_per_split=limit
        )
    else:
        raise ValueError(f"dataset must be one of {DATASETS}, received {name!r}")
    if x_train.ndim == 3:
        x_train, x_test = x_train[..., None], x_test[..., None]
    if limit is not None:
        x_train, y_train = x_train[:limit], y_train[:limit]
    return (x_train, y_train), (x_test, y_test)


def mlp_backbone(input_shape, units: int = 256, name: str = "mlp") -> keras.Model:
    """A two-layer perceptron on flattened images, for tiny inputs (digits)."""
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            keras.layers.Flatten(),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
        ],
        name=name,
    )


def standardization(images: np.ndarray) -> keras.layers.Normalization:
    """A Normalization layer with `images`' channel statistics, on `[0, 1]` inputs."""
    mean, std = datasets.channel_statistics(images)
    return keras.layers.Normalization(
        axis=-1, mean=mean, variance=np.square(std), name="standardize"
    )


def build_model(config: TrainConfig, x_train: np.ndarray, num_classes: int) -> Subic:
    """The SuBiC network of `config` for images shaped like `x_train`."""
    shape = x_train.shape[1:]
    kind = config.backbone
    if kind == "auto":
        kind = "mlp" if min(shape[:2]) < 16 else "dsh_cnn"
    if kind == "dsh_cnn":
        backbone = backbones.dsh_cnn(input_shape=shape)
    else:
        backbone = mlp_backbone(shape)
    return build_subic(
        backbone,
        config.num_blocks,
        config.block_size,
        num_classes,
        gamma=config.gamma,
        mu=config.mu,
        input_shape=shape,
        preprocessing=standardization(x_train),
        optimizer=None,
    )


def learning_rate_schedule(rate: float, total_steps: int):
    """`rate`, then `rate / 10` after 75% of the steps."""
    boundary = max(1, int(0.75 * total_steps))
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        [boundary], [rate, rate / 10]
    )


def train(config: TrainConfig, verbose: int | str = "auto") -> dict:
    """Trains SuBiC as configured, keeping the best-validation checkpoint.

    Writes `best.keras` (the train model with the lowest validation loss,
    saved atomically and never from a diverged epoch), `summary.json` and
    TensorBoard logs under `config.output_dir`.

    Returns:
        The summary: configuration, best epoch, validation and test metrics,
        wall time, and `"stopped_on_nan"`.
    """
    start = time.time()
    keras.utils.set_random_seed(config.seed)
    (x_train, y_train), (x_test, y_test) = load_images(
        config.dataset, config.data_dir, config.max_train_images
    )
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    train_idx, val_idx = datasets.train_validation_split(
        y_train, config.validation_size, seed=config.seed
    )
    x_val, y_val = x_train[val_idx], y_train[val_idx]
    x_fit, y_fit = x_train[train_idx], y_train[train_idx]
    subic = build_model(config, x_fit, num_classes)
    fit_data = datasets.make_dataset(
        x_fit,
        y_fit,
        config.batch_size,
        shuffle=True,
        augment=config.augment,
        seed=config.seed,
    )
    val_data = datasets.make_dataset(x_val, y_val, 256)
    steps = math.ceil(len(x_fit) / config.batch_size) * config.epochs
    subic.compile(
        keras.optimizers.Adam(learning_rate_schedule(config.learning_rate, steps))
    )

    os.makedirs(config.output_dir, exist_ok=True)
    best_path = os.path.join(config.output_dir, "best.keras")
    # Select among epochs with the full entropy weights (after the warm-up).
    first = min(math.ceil(config.warmup_epochs), config.epochs - 1)
    checkpoint = BestModelCheckpoint(
        best_path, monitor="val_loss", verbose=0, start_epoch=first
    )
    callbacks = [
        EntropyWarmup(config.warmup_epochs),
        keras.callbacks.TerminateOnNaN(),
        checkpoint,
        keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs")),
    ]
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    history = subic.train_model.fit(
        fit_data,
        validation_data=val_data,
        epochs=config.epochs,
        callbacks=callbacks,
        verbose=verbose,
        # `fit_data` shuffles itself; Keras's default shuffle=True would only
        # warn that it ignores the flag for a tf.data.Dataset.
        shuffle=False,
    )
    epochs_run = len(history.history.get("loss", []))
    # Only TerminateOnNaN stops training early here.
    stopped_on_nan = bool(subic.train_model.stop_training)
    summary = {
        "config": dataclasses.asdict(config),
        "bits": config.num_blocks * int(math.log2(config.block_size)),
        "num_train": len(x_fit),
        "num_validation": len(x_val),
        "num_test": len(x_test),
        "epochs_run": epochs_run,
        "stopped_on_nan": stopped_on_nan,
        "best_epoch": None
        if checkpoint.best_epoch is None
        else checkpoint.best_epoch + 1,
        "best_val_loss": None if checkpoint.best_epoch is None else checkpoint.best,
        "checkpoint": best_path if checkpoint.best_epoch is not None else None,
    }
    if checkpoint.best_epoch is not None:
        best = Subic.from_train_model(keras.saving.load_model(best_path))
        test_data = datasets.make_dataset(x_test, y_test, 256)
        summary["test"] = evaluate_classification(best, test_data, y_test)
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
