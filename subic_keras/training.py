"""End-to-end training of a SuBiC model on an image dataset (`subic train`).

`train` loads a dataset, holds out a validation split and runs the recipe
of `subic_keras.trainers.recipe` with the settings of a `TrainConfig`;
`train_baseline` trains a supervised hashing baseline (DSH, DLBHC) on the
same data with the same budget, for comparisons that differ only in the
method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from subic_keras._io import atomic_path, make_folders, output_target
from subic_keras.baselines.dlbhc import build_dlbhc
from subic_keras.baselines.dsh import build_dsh
from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.baselines.training import train_hashing
from subic_keras.config import APPLICATIONS, CLASS_NAMES, TRAIN_OUTPUTS
from subic_keras.config import BACKBONES as BACKBONES
from subic_keras.config import TrainConfig as TrainConfig
from subic_keras.config import default_cache_dir as default_cache_dir
from subic_keras.data import datasets
from subic_keras.data.datasets import load_images
from subic_keras.data.folders import FolderChangedError, folder_failure
from subic_keras.data.images import labelled_files as read_labelled_files
from subic_keras.models import backbones
from subic_keras.models.backbones import mlp_backbone
from subic_keras.models.building import build_subic
from subic_keras.models.subic import CLASS_PROBS, Subic, float32_copy
from subic_keras.trainers.callbacks import EpochProgress, EpochTensorBoard
from subic_keras.trainers.recipe import (
    MIN_VALIDATION,
    Recipe,
    pretrain_backbone,
    train_subic,
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
    if kind in APPLICATIONS:
        return backbones.keras_application(
            APPLICATIONS[kind], tuple(shape), weights=config.weights
        )
    if kind == "dsh_cnn":
        return backbones.dsh_cnn(input_shape=shape)
    return mlp_backbone(shape)


def _preprocessing(config: TrainConfig, images: np.ndarray) -> keras.layers.Layer:
    """What goes between the `[0, 1]` pixels and the backbone: the channel
    standardisation of the recipe, or, for a `keras.applications` network,
    the `0..255` range its own preprocessing expects."""
    if config.backbone in APPLICATIONS:
        return keras.layers.Rescaling(255.0, name="to_0_255")
    return standardization(images)


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
        preprocessing=_preprocessing(config, x_train),
        optimizer=None,
    )


def train(
    config: TrainConfig,
    verbose: int | str = "auto",
    callbacks=(),
    on_skipped: Callable[[list], None] | None = None,
    overwrite: bool = False,
) -> dict:
    """Trains SuBiC with the recipe of `subic_keras.trainers.recipe` as configured.

    Writes `best.keras` (the model of the best validation epoch, its query
    chosen on validation; saved atomically), `summary.json` (both stages)
    and TensorBoard logs (`logs/pretrain`, `logs/subic`) under
    `config.output_dir`. The pre-trained backbone is cached in
    `config.cache_dir`: a second run with the same dataset, seed and
    pre-training budget (at any bit-rate) skips stage 1, and an interrupted
    pre-training resumes.

    Args:
        config: the settings.
        verbose: `fit`'s verbosity; `"auto"`: one short line per epoch with
            its main figures and the time left (`EpochProgress`).
        callbacks: more Keras callbacks, given to both stages' `fit`.
        on_skipped: called with the files the folder check passed over
            (`paths.SkippedFile`s), as soon as the folder is checked and
            before the first epoch (`--images` runs; an empty list else).
        overwrite: replace a link or a file that stands where an output
            goes (the link itself); without it, such an output is refused
            before training (a save never writes through a link).

    Returns:
        The summary: configuration, both stages, best epoch, validation and
        test metrics, wall time, and `"stopped_on_nan"`.
    """
    start = time.time()
    data = _data(config)
    if on_skipped is not None:
        on_skipped(list(data.skipped))
    x_test, y_test = data.splits[4:]
    shape = data.shape
    recipe = _recipe(config, shape)
    cache_dir = config.cache_dir or default_cache_dir()
    created = not os.path.exists(config.output_dir)
    _make_outputs(config.output_dir, overwrite)

    keras.utils.set_random_seed(config.seed)
    policy = keras.mixed_precision.global_policy()
    if config.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        subic, run = _train_subic(
            config, data, shape, recipe, cache_dir, callbacks, verbose
        )
    except tf.errors.OpError as error:
        _remove_if_empty(config.output_dir, created)
        # A folder that lost a whole class mid-training: one line, not
        # TensorFlow's traceback of the stream's Python call.
        failure = folder_failure(error)
        if failure is None:
            raise
        raise FolderChangedError(failure) from None
    except BaseException:
        _remove_if_empty(config.output_dir, created)
        raise
    finally:
        keras.mixed_precision.set_global_policy(policy)
    if config.mixed_precision:
        subic = float32_copy(subic)
    subic.train_model.class_names = data.class_names
    subic.train_model.data_source = _data_source(config)
    best_path = os.path.join(config.output_dir, "best.keras")
    recorded = dataclasses.asdict(config)
    if config.images is not None:  # trained on a folder, not on `dataset`
        recorded["dataset"] = None
    summary = {
        "config": recorded,
        "data": _data_source(config),
        "recipe": run.pop("recipe"),
        "cache_dir": cache_dir,
        "bits": run["bits"],
        "num_train": data.num_train,
        "num_validation": data.num_validation,
        "num_test": None if x_test is None else len(x_test),
        "class_names": data.class_names,
        "skipped_files": [dataclasses.asdict(s) for s in data.skipped],
        **run,
        "checkpoint": None,
    }
    if run["best_epoch"] is not None:
        with atomic_path(best_path, suffix=".keras", replace=overwrite) as tmp:
            subic.train_model.save(tmp)
        summary["checkpoint"] = best_path
        if x_test is not None:
            test_data = datasets.make_dataset(x_test, y_test, 256)
            summary["test"] = evaluate_classification(subic, test_data, y_test)
    summary["wall_seconds"] = round(time.time() - start, 1)
    summary_path = os.path.join(config.output_dir, "summary.json")
    with atomic_path(summary_path, replace=overwrite) as tmp:
        with open(tmp, "w") as handle:
            json.dump(summary, handle, indent=2)
    return summary


BASELINES = ("dsh", "dlbhc")


def train_baseline(
    config: TrainConfig, method: str = "dsh", verbose: int | str = 0
) -> tuple[HashingNetwork, dict]:
    """A supervised hashing baseline trained as `train` trains SuBiC.

    The same data and splits as `train(config)` (without the classes of
    `config.exclude_classes`), the same stage 1 (the backbone pre-trained
    as a classifier, cached in `config.cache_dir` under the same key, so a
    SuBiC run of this configuration and the baseline share it), then the
    method's own loss for `config.epochs` epochs with the recipe's schedule
    and validation-mAP selection (`baselines.train_hashing`), at SuBiC's
    code length, `num_blocks · log2(block_size)` bits:

    - `"dsh"`: DSH's pairwise loss, its paper's margin `2B` and `α = 0.01`,
      codes `sign(u)`;
    - `"dlbhc"`: DLBHC's sigmoid latent layer before the classifier, codes
      `> 0.5`.

    Nothing is written outside the cache: save or score the network
    returned.

    Example:

    >>> config = TrainConfig(
    ...     dataset="digits", pretrain_epochs=1, epochs=1, cache_dir="cache")
    >>> dsh, summary = train_baseline(config, "dsh")
    >>> summary["bits"], summary["method"]
    (48, 'dsh')

    Args:
        config: the settings of the SuBiC run to compare with.
        method: one of `BASELINES`.
        verbose: `fit`'s verbosity.

    Returns:
        `(network, summary)`: the trained `HashingNetwork` and a JSON-ready
        summary (`method`, `bits`, `pretraining`, `train_hashing`'s record,
        `num_train`, `num_validation`, `wall_seconds`).

    Raises:
        ValueError: for an unknown `method`, or for a configuration or data
            `train` refuses.
    """
    if method not in BASELINES:
        raise ValueError(f"method must be one of {BASELINES}, received {method!r}")
    start = time.time()
    data = _data(config)
    x_fit, y_fit, validation = _fit_and_validation(data)
    recipe = _recipe(config, data.shape)
    bits = config.bits
    keras.utils.set_random_seed(config.seed)
    backbone = _backbone(config, data.shape)
    preprocessing = _preprocessing(config, x_fit)
    pretraining = None
    if recipe.pretrain_epochs:
        pretraining = pretrain_backbone(
            backbone,
            x_fit,
            y_fit,
            validation,
            num_classes=data.num_classes,
            recipe=recipe,
            seed=config.seed,
            preprocessing=preprocessing,
            cache_dir=config.cache_dir or default_cache_dir(),
            verbose=verbose,
        )
    # Re-seeded so that the head starts alike whether stage 1 ran or was
    # read from the cache.
    keras.utils.set_random_seed(config.seed)
    head = {"input_shape": data.shape, "preprocessing": preprocessing}
    network: HashingNetwork
    if method == "dsh":
        network = build_dsh(backbone, bits, None, 0.01, optimizer=None, **head)
    else:
        network = build_dlbhc(backbone, bits, data.num_classes, optimizer=None, **head)
    stage = train_hashing(
        network,
        x_fit,
        y_fit,
        validation,
        recipe=recipe,
        seed=config.seed,
        verbose=verbose,
    )
    summary = {
        "method": method,
        "bits": bits,
        "pretraining": pretraining,
        **stage,
        "num_train": data.num_train,
        "num_validation": data.num_validation,
        "wall_seconds": round(time.time() - start, 1),
    }
    return network, summary


@dataclasses.dataclass
class _TrainingData:
    # x_fit, y_fit, x_val, y_val, x_test (or None), y_test: arrays, or for a
    # folder the training and validation streams with labels None.
    splits: tuple
    shape: tuple
    num_classes: int
    num_train: int
    num_validation: int
    class_names: list[str] | None
    skipped: list


def _data(config: TrainConfig) -> _TrainingData:
    """The training, validation and test splits `config` names."""
    if config.images is not None:
        return _folder_data(config)
    (x_train, y_train), (x_test, y_test) = load_images(
        config.dataset, config.data_dir, config.max_train_images
    )
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    names: list[str] | None = CLASS_NAMES[config.dataset]
    names = names if names is not None and len(names) == num_classes else None
    if config.exclude_classes:
        (x_train, y_train), (x_test, y_test), names = _without_classes(
            config.exclude_classes,
            num_classes,
            (x_train, y_train, x_test, y_test),
            names,
        )
        num_classes -= len(config.exclude_classes)
    train_idx, val_idx = datasets.train_validation_split(
        y_train, config.validation_size, seed=0
    )
    splits = (x_train[train_idx], y_train[train_idx], x_train[val_idx])
    return _TrainingData(
        (*splits, y_train[val_idx], x_test, y_test),
        x_train.shape[1:],
        num_classes,
        len(train_idx),
        len(val_idx),
        names,
        [],
    )


def _without_classes(excluded, num_classes: int, arrays, names):
    """The training and test arrays without the `excluded` classes, the
    others numbered `0, 1, ...` in order (the test split keeps the seen
    classes: what the summary's classification figures are measured on)."""
    if max(excluded) >= num_classes:
        raise ValueError(
            f"exclude_classes must be class ids below {num_classes} (the "
            f"dataset's classes), received {list(excluded)}"
        )
    if len(excluded) >= num_classes - 1:
        raise ValueError(
            f"exclude_classes must leave at least 2 of the {num_classes} classes, "
            f"received {list(excluded)}"
        )
    seen = np.setdiff1d(np.arange(num_classes), excluded)
    number = np.full(num_classes, -1, np.int64)
    number[seen] = np.arange(len(seen))
    x_train, y_train, x_test, y_test = arrays
    kept_train = number[y_train] >= 0
    kept_test = number[y_test] >= 0
    return (
        (x_train[kept_train], number[y_train[kept_train]]),
        (x_test[kept_test], number[y_test[kept_test]]),
        None if names is None else [names[c] for c in seen],
    )


def _folder_data(config: TrainConfig) -> _TrainingData:
    """A labelled folder, streamed (`datasets.image_folder`): validation held
    out of it (or its own folder), no test split (the summary reports
    validation only)."""
    assert config.images is not None
    separate = config.validation_images is not None
    folder = datasets.image_folder(
        config.images,
        config.image_size,
        validation_split=None if separate else _folder_validation_size(config),
        max_images=config.max_train_images,
    )
    skipped = list(folder.skipped)
    validation, num_validation = folder.validation, len(folder.validation_paths)
    if config.validation_images is not None:
        held_out = datasets.image_folder(
            config.validation_images, config.image_size, shuffle=False
        )
        if held_out.class_names != folder.class_names:
            raise ValueError(
                f"the validation folder's classes {held_out.class_names} differ "
                f"from the training folder's {folder.class_names}"
            )
        skipped += held_out.skipped
        validation, num_validation = held_out.training, len(held_out.training_paths)
    return _TrainingData(
        (folder.training, None, validation, None, None, None),
        (config.image_size, config.image_size, 3),
        len(folder.class_names),
        len(folder.training_paths),
        num_validation,
        folder.class_names,
        skipped,
    )


def _folder_validation_size(config: TrainConfig) -> float | int:
    """`config.validation_size`, but at least the 20 pictures that model
    selection needs when a fraction of a small folder would hold fewer."""
    size = config.validation_size
    if isinstance(size, float):
        assert config.images is not None
        listed = len(read_labelled_files(config.images)[0])
        if size * listed < MIN_VALIDATION:
            return min(MIN_VALIDATION, listed // 2)
    return size


def evaluate_classification(subic: Subic, data, labels: np.ndarray) -> dict:
    """Top-1 accuracy from soft codes `b̃` and from binary codes `b`."""
    # Both from one pass through the backbone: the classifier's binary path
    # branches off the train model's graph at FC0.
    both = keras.Model(
        subic.train_model.inputs,
        [subic.train_model.get_layer(CLASS_PROBS).output, subic.classifier.output],
    )
    soft, binary = both.predict(
        data.map(tf.autograph.experimental.do_not_convert(lambda x, y: x)), verbose=0
    )
    return {
        "accuracy_soft": float(np.mean(soft.argmax(-1) == labels)),
        "accuracy_binary": float(np.mean(binary.argmax(-1) == labels)),
    }


def _recipe(config: TrainConfig, shape) -> Recipe:
    """The configuration's recipe; augmentation only where pictures are big
    enough for shifts and flips to keep them natural."""
    return config.recipe(augment=min(shape[:2]) >= 16)


def _fit_and_validation(data: _TrainingData) -> tuple:
    """`(x_fit, y_fit, validation)`: validation as `(x, y)` arrays, or a
    stream for a folder."""
    x_fit, y_fit, x_val, y_val, _, _ = data.splits
    return x_fit, y_fit, x_val if y_val is None else (x_val, y_val)


def _train_subic(config, data, shape, recipe, cache_dir, callbacks, verbose):
    x_fit, y_fit, validation = _fit_and_validation(data)
    logs = os.path.join(config.output_dir, "logs")
    progress: tuple[list, list] = ([], [])
    if verbose == "auto":  # a short line per epoch, not Keras's
        progress = ([EpochProgress("pre-training")], [EpochProgress("SuBiC")])
        verbose = 0
    return train_subic(
        _backbone(config, shape),
        config.num_blocks,
        config.block_size,
        x_fit,
        y_fit,
        validation,
        num_classes=data.num_classes,
        recipe=recipe,
        seed=config.seed,
        preprocessing=_preprocessing(config, x_fit),
        cache_dir=cache_dir,
        pretrain_callbacks=[
            EpochTensorBoard(os.path.join(logs, "pretrain")),
            *progress[0],
            *callbacks,
        ],
        callbacks=[
            EpochTensorBoard(os.path.join(logs, "subic")),
            *progress[1],
            *callbacks,
        ],
        verbose=verbose,
    )


def _make_outputs(output_dir: str, overwrite: bool) -> None:
    """Makes the output folder and its log folders, and checks that no link
    (or anything but our own kind of entry) stands where an output goes,
    before any training: a save never writes through a link."""
    for stage in ("pretrain", "subic"):
        make_folders(output_dir, "logs", stage, replace=overwrite)
    for name in TRAIN_OUTPUTS[:2]:
        output_target(os.path.join(output_dir, name), replace=overwrite)


def _remove_if_empty(folder: str, created: bool) -> None:
    """A training that failed before writing anything leaves no folder of
    its own behind (e.g. weights that could not be downloaded)."""
    if created:
        logs = os.path.join(folder, "logs")
        for empty in (os.path.join(logs, "pretrain"), os.path.join(logs, "subic")):
            with contextlib.suppress(OSError):
                os.rmdir(empty)
        for empty in (logs, folder):
            with contextlib.suppress(OSError):
                os.rmdir(empty)


def _data_source(config: TrainConfig) -> dict:
    """What the model was trained on, for the commands that default to it."""

    def absolute(path):
        return None if path is None else os.path.abspath(os.path.expanduser(path))

    if config.images is not None:
        return {"dataset": None, "data_dir": None, "images": absolute(config.images)}
    source = {
        "dataset": config.dataset,
        "data_dir": absolute(config.data_dir),
        "images": None,
    }
    if config.exclude_classes:  # `subic evaluate --protocol unseen` reads them
        source["held_out_classes"] = ",".join(map(str, config.exclude_classes))
    return source
