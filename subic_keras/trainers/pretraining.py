"""Stage 1 of SuBiC's recipe: the backbone pre-trained as a classifier
(`pretrain_backbone`), cached by everything it depends on and resumed
after an interruption (`subic_keras.trainers.recipe` describes the recipe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import math
import os
import shutil
import time

import keras

from subic_keras._io import atomic_path, make_folders
from subic_keras.config import Recipe
from subic_keras.data.paths import read_bytes
from subic_keras.data.pixels import ImageModel
from subic_keras.models.subic import leaf_layers
from subic_keras.trainers.callbacks import BestWeights
from subic_keras.trainers.training_data import Split, _data_digest, _digest, check_data

_CACHE_FORMAT = 1
# A record or a snapshot's state is a few kB: more is not one of ours.
_MAX_RECORD_BYTES = 1 << 24
_PRETRAIN_HEAD = "classes"


def _architecture(layer: keras.layers.Layer) -> list:
    """The layers' classes and configurations, without their (session) names."""

    def unnamed(config):
        if isinstance(config, dict):
            return {k: unnamed(v) for k, v in config.items() if k != "name"}
        if isinstance(config, (list, tuple)):
            return [unnamed(v) for v in config]
        return config

    return [
        [type(leaf).__name__, unnamed(leaf.get_config())] for leaf in leaf_layers(layer)
    ]


def pretraining_key(
    backbone, preprocessing, images, labels, validation, num_classes, recipe, seed
) -> str:
    """The cache key of a pre-training: a digest of everything it depends on.

    The data are arrays, or streams (`labels=None`), whose digest does not
    depend on the order of their examples (`streams.StreamSummary`).
    """
    training, held_out, _, _ = check_data(images, labels, validation, num_classes)
    return _pretraining_key(
        backbone, preprocessing, training, held_out, num_classes, recipe, seed
    )


def _pretraining_key(
    backbone, preprocessing, training: Split, held_out: Split, num_classes, recipe, seed
) -> str:
    """`pretraining_key` of data `check_data` has checked already."""
    parts = [backbone] + ([preprocessing] if preprocessing is not None else [])
    settings = {
        "format": _CACHE_FORMAT,
        "architecture": [_architecture(part) for part in parts],
        "initial_weights": _digest(*(w for p in parts for w in p.get_weights())),
        "data": _data_digest(training, held_out),
        "num_classes": num_classes,
        "epochs": recipe.pretrain_epochs,
        "batch_size": recipe.batch_size,
        "learning_rate": recipe.learning_rate,
        "augment": recipe.augment,
        "seed": seed,
    }
    if recipe.frozen_epochs:  # (absent from the keys of earlier releases)
        settings["frozen_epochs"] = recipe.frozen_epochs
    text = json.dumps(settings, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _classifier(backbone, preprocessing, input_shape, num_classes) -> keras.Model:
    inputs = keras.Input(input_shape, name="images")
    x = inputs if preprocessing is None else preprocessing(inputs)
    outputs = keras.layers.Dense(
        num_classes, activation="softmax", name=_PRETRAIN_HEAD
    )(backbone(x))
    # An `ImageModel`, so that its `fit` traces the first step once; its
    # batches are floats already (`fit_dataset`), which it takes as they are.
    return ImageModel(inputs, outputs, name="pretrain_classifier")


class _Progress(keras.callbacks.Callback):
    """Writes a resumable snapshot after every epoch of the pre-training.

    The classifier's weights with the optimizer's state, the weights of the
    best epoch so far, and then a `state.json` naming both: the state file
    is written last (atomically), so a snapshot is complete or absent.
    """

    def __init__(self, directory: str, selector: BestWeights):
        super().__init__()
        self.directory, self.selector = directory, selector

    def on_epoch_end(self, epoch, logs=None):
        folder, name = os.path.split(os.path.abspath(self.directory))
        make_folders(folder, name)  # a link there is refused, not followed
        state_path = os.path.join(self.directory, "state.json")
        last = os.path.join(self.directory, f"epoch-{epoch + 1}.weights.h5")
        with atomic_path(last, suffix=".weights.h5") as tmp:
            self.model.save_weights(tmp)
        best_epoch = self.selector.best_epoch
        best = None if best_epoch is None else f"best-{best_epoch + 1}.weights.h5"
        if best_epoch == epoch:
            # This epoch is the best so far: its snapshot is the best one.
            with atomic_path(
                os.path.join(self.directory, best), suffix=".weights.h5"
            ) as tmp:
                shutil.copyfile(last, tmp)
        state = {
            "epoch": epoch + 1,
            "weights_file": os.path.basename(last),
            "best_file": best,
            "best": None if best_epoch is None else self.selector.best,
            "best_epoch": best_epoch,
            "history": [None if math.isnan(v) else v for v in self.selector.history],
        }
        with atomic_path(state_path, suffix=".json") as tmp:
            with open(tmp, "w") as handle:
                json.dump(state, handle)
        keep = {state["weights_file"], state["best_file"], "state.json"}
        for path in glob.glob(os.path.join(self.directory, "*.weights.h5")):
            if os.path.basename(path) not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)


def _read_record(path: str, kind: str) -> dict:
    """A JSON file of the cache, read as every file is (`read_bytes`)."""
    return json.loads(read_bytes(path, _MAX_RECORD_BYTES, kind))


def _read_state(directory: str) -> dict | None:
    path = os.path.join(directory, "state.json")
    if not os.path.lexists(path):
        return None
    return _read_record(path, "pre-training state")


def _resume(classifier, selector: BestWeights, directory: str, epochs: int) -> int:
    """Loads an interrupted pre-training's snapshot; returns the epoch to start at."""
    state = _read_state(directory)
    if state is None:
        return 0
    if state["epoch"] > epochs:
        raise ValueError(
            f"the pre-training snapshot in {directory} has run {state['epoch']} "
            f"epochs, more than the {epochs} asked for"
        )
    classifier.optimizer.build(classifier.trainable_variables)
    if state["best_file"] is not None:
        classifier.load_weights(os.path.join(directory, state["best_file"]))
        selector.best_weights = classifier.get_weights()
        selector.best, selector.best_epoch = state["best"], state["best_epoch"]
    selector.history = [math.nan if v is None else v for v in state["history"]]
    classifier.load_weights(os.path.join(directory, state["weights_file"]))
    return int(state["epoch"])


def pretrain_backbone(
    backbone: keras.layers.Layer,
    images,
    labels,
    validation: tuple,
    *,
    num_classes: int | None = None,
    recipe: Recipe = Recipe(),
    seed: int = 0,
    preprocessing: keras.layers.Layer | None = None,
    input_shape: tuple[int, ...] | None = None,
    cache_dir: str | None = None,
    callbacks=(),
    verbose: int | str = 0,
) -> dict:
    """Stage 1: trains `backbone` in place as a softmax classifier.

    `backbone` plus one `Dense(num_classes, softmax)` layer is trained with
    cross-entropy for `recipe.pretrain_epochs` epochs (Adam, the recipe's
    schedule, batch size and augmentation); the backbone keeps the weights
    of the epoch with the best validation accuracy.

    With `cache_dir`, the result is cached under a key of everything it
    depends on (`pretraining_key`): a second call with the same inputs loads
    the weights instead of training, and a call with another backbone,
    initial weights, dataset, budget or seed trains anew. An interrupted
    pre-training resumes from its last finished epoch (the data order of
    the remaining epochs then differs from an uninterrupted run's).

    Example:

    >>> backbone = backbones.dsh_cnn()
    >>> record = pretrain_backbone(
    ...     backbone, images[:40], labels[:40], (images[40:], labels[40:]),
    ...     recipe=Recipe(pretrain_epochs=2), cache_dir="cache")
    >>> record["epochs"], record["best_epoch"] in (1, 2), record["cached"]
    (2, True, False)

    Args:
        backbone: a Keras model mapping inputs to feature vectors.
        images, labels: the training inputs (uint8 images or float inputs)
            and their class ids, or a stream of `(image, label)` pairs and
            `labels=None` (`subic_keras.data.streams`).
        validation: `(images, labels)` held out from training, or a stream.
        num_classes: classes of the softmax layer; from the labels if `None`.
        recipe: the budget (`pretrain_epochs`, >= 1 here), batch size,
            learning rate and augmentation.
        seed: seed of the data order and augmentation.
        preprocessing: a layer applied to the inputs before the backbone.
        input_shape: the input shape, if the backbone does not define one.
        cache_dir: where cached weights and resumable snapshots live.
        callbacks: more Keras callbacks for this stage's `fit`.
        verbose: `fit`'s verbosity; the default 0 prints nothing, `"auto"`
            shows Keras's progress bar as `model.fit` does.

    Returns:
        A JSON-ready record: `key`, `best_epoch` (1-based),
        `best_validation_accuracy`, `validation_accuracy_per_epoch`,
        `train_seconds` and `cached` (loaded from `cache_dir`).
    """
    start = time.time()
    if recipe.pretrain_epochs < 1:
        raise ValueError(
            "pretrain_backbone needs recipe.pretrain_epochs >= 1, received "
            f"{recipe.pretrain_epochs}"
        )
    training, held_out, num_classes, input_shape = check_data(
        images, labels, validation, num_classes, input_shape
    )
    key = None
    if cache_dir is not None or not (training.is_stream or held_out.is_stream):
        # A stream's digest costs a pass over it: only for the cache.
        key = _pretraining_key(
            backbone, preprocessing, training, held_out, num_classes, recipe, seed
        )
    paths = None if key is None or cache_dir is None else _cache_paths(cache_dir, key)
    if paths is not None:
        weights_path, record_path, _ = paths
        if os.path.isfile(record_path) and os.path.isfile(weights_path):
            record = _read_record(record_path, "pre-training record")
            backbone.load_weights(weights_path)
            return {**record, "cached": True}

    classifier = _classifier(backbone, preprocessing, input_shape, num_classes)
    selector = BestWeights("val_accuracy", mode="max")
    stage_callbacks = [selector, keras.callbacks.TerminateOnNaN(), *callbacks]
    flags = _trainable_flags(backbone)
    resumed = _fit_phases(
        classifier, backbone, flags, training, held_out, recipe, seed,
        stage_callbacks, selector, paths, verbose,
    )  # fmt: skip
    _restore_flags(backbone, flags)
    initial_epoch = resumed or 0
    if selector.best_epoch is None:
        raise RuntimeError(
            "pre-training produced no epoch with finite losses; lower "
            f"learning_rate (received {recipe.learning_rate})"
        )
    record = {
        "key": key,
        "epochs": recipe.pretrain_epochs,
        "best_epoch": selector.best_epoch + 1,
        "best_validation_accuracy": selector.best,
        "validation_accuracy_per_epoch": selector.history,
        "train_seconds": round(time.time() - start, 1),
        "resumed_at_epoch": initial_epoch or None,
        "num_train": training.known_count(),
        "num_validation": len(held_out),
        "num_classes": num_classes,
    }
    if paths is not None:
        _save_pretraining(backbone, record, *paths)
    return {**record, "cached": False}


def _fit_phases(
    classifier, backbone, flags, training, held_out, recipe, seed,
    stage_callbacks, selector, paths, verbose,
) -> int | None:  # fmt: skip
    """Fits the classifier: the backbone frozen for `recipe.frozen_epochs`,
    then fine-tuned at a tenth of the rate; a run interrupted is resumed
    from its partial state (`paths[2]`). Returns the epoch resumed at."""
    phases = [(0, recipe.frozen_epochs), (recipe.frozen_epochs, recipe.pretrain_epochs)]
    resumed = None
    for first, last in phases:
        if first == last:
            continue
        if recipe.frozen_epochs:
            _set_phase(backbone, flags, fine_tuning=first > 0)
        rate = recipe.learning_rate / (10 if first > 0 else 1)
        classifier.compile(
            training.optimizer(
                dataclasses.replace(recipe, learning_rate=rate), last - first
            ),
            "sparse_categorical_crossentropy",
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        phase_callbacks = list(stage_callbacks)
        start_at = first
        if paths is not None:
            partial = paths[2]
            if resumed is None:
                resumed = _resume(classifier, selector, partial, recipe.pretrain_epochs)
            if resumed >= last:
                continue  # this phase ended before the interruption
            start_at = max(first, resumed)
            phase_callbacks.insert(1, _Progress(partial, selector))
        classifier.fit(
            training.training_batches(recipe, seed),
            validation_data=held_out.validation_batches(seed),
            epochs=last,
            initial_epoch=start_at,
            callbacks=phase_callbacks,
            verbose=verbose,
            # The pipeline shuffles itself; Keras would only warn that it
            # ignores the flag for a tf.data.Dataset.
            shuffle=False,
        )
    return resumed


def _trainable_flags(backbone) -> list:
    return [(layer, layer.trainable) for layer in [backbone, *leaf_layers(backbone)]]


def _restore_flags(backbone, flags: list) -> None:
    for layer, trainable in flags:
        layer.trainable = trainable


def _set_phase(backbone, flags: list, *, fine_tuning: bool) -> None:
    """The trainable flags of a pre-training phase: the backbone frozen, or
    fine-tuned as it was given with batch normalisation frozen (so that it
    runs in inference mode)."""
    if not fine_tuning:
        backbone.trainable = False
        return
    _restore_flags(backbone, flags)
    for layer in leaf_layers(backbone):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


def _cache_paths(cache_dir: str, key: str) -> tuple[str, str, str]:
    """The pre-training's weights, record and resumable-snapshot paths."""
    cache_dir = os.path.expanduser(os.fspath(cache_dir))
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"cache_dir must be a directory that can be created or written, "
            f"received {cache_dir!r} ({error.strerror})"
        ) from error
    stem = os.path.join(cache_dir, f"pretrain-{key}")
    return f"{stem}.weights.h5", f"{stem}.json", f"{stem}.partial"


def _save_pretraining(
    backbone, record: dict, weights_path: str, record_path: str, partial: str
) -> None:
    """Writes the cache entry, then drops the resumable snapshot."""
    with atomic_path(weights_path, suffix=".weights.h5") as tmp:
        backbone.save_weights(tmp)
    with atomic_path(record_path, suffix=".json") as tmp:
        with open(tmp, "w") as handle:
            json.dump(record, handle, indent=2)
    for path in glob.glob(os.path.join(partial, "*")):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(partial)


def _fresh_copy(layer: keras.layers.Layer | None):
    if layer is None:
        return None
    if isinstance(layer, keras.Model):
        return keras.models.clone_model(layer)
    return keras.layers.deserialize(keras.layers.serialize(layer))
