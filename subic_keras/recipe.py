"""SuBiC's training recipe: pre-train the backbone as a classifier, then SuBiC.

The recipe behind our CIFAR-10 numbers (the paper's Table 2 set-up) and the
defaults of `subic train`:

1. **Pre-training** (`pretrain_backbone`): the backbone plus one softmax
   layer is trained as a plain classifier with cross-entropy, and the epoch
   with the best validation accuracy is kept. It is cached by everything
   it depends on (backbone architecture and initial weights, preprocessing,
   data, budget, seed), and resumes after an interruption.
2. **SuBiC** (`train_subic`): SuBiC's head (`build_subic`: FC0, block
   softmax, FC1) on the pre-trained backbone, trained end to end with the
   loss of Eq. 8, the entropy weights ramped in over the first third of
   the epochs (`callbacks.EntropyWarmup`); after every epoch the codes are
   scored by retrieval mAP on the validation split
   (`callbacks.RetrievalValidation`) and the best epoch is kept
   (`callbacks.BestWeights`). The query, the paper's `z*` (Sec. 3.3) or the
   class-posterior `W₁ s*`, is then chosen by validation mAP and saved with
   the model (`Subic.default_query`).

Every stage is a plain `model.fit` with callbacks, so a Keras user can run
either stage with their own training code.

How the defaults (`Recipe`) were chosen, all on a validation split of the
training set (never the test set), with the DSH CNN on CIFAR-10:

- `pretrain_epochs=50`, `epochs=5`: with 30 + 4 epochs the 48-bit mAP was
  0.032 lower (mean of 3 seeds); SuBiC's own stage saturates within a few
  epochs once the backbone is trained.
- `gamma=mu=0.3`: the best of a sweep over {0.03, 0.1, 0.3} after
  pre-training (an earlier sweep over {0.1, 0.3, 1, 3} found the weak end
  best); the paper uses `γ = μ = 1` from scratch (Sec. 4), which on our
  machines saturates the blocks before the classifier learns.
- `warmup_fraction=1/3`: with full weights from the first step the blocks
  saturate to one-hot within an epoch and training stalls.
- `learning_rate=1e-3` (Adam, ×0.1 after 75% of the steps): 3e-4 was worse.
- `batch_size=200`: the paper's (Sec. 4).
- `augment=True`: random flips and shifts of up to 4 pixels; turn it off
  for inputs that are not natural images (features, 8×8 digits).
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
import numpy as np

from subic_keras import datasets, streams
from subic_keras._io import atomic_path
from subic_keras._validation import check_block_shape, check_int
from subic_keras.callbacks import BestWeights, EntropyWarmup, RetrievalValidation
from subic_keras.config import QUERY_KINDS
from subic_keras.config import Recipe as Recipe
from subic_keras.models import Subic, build_subic, leaf_layers

# The validation pictures that model selection needs (`train_subic`).
MIN_VALIDATION = 20
_CACHE_FORMAT = 1
_PRETRAIN_HEAD = "classes"


def learning_rate_schedule(rate: float, total_steps: int):
    """`rate`, then `rate / 10` after 75% of the steps."""
    boundary = max(1, int(0.75 * total_steps))
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        [boundary], [rate, rate / 10]
    )


def stage_optimizer(
    recipe: Recipe, num_images: int, epochs: int, steps_per_epoch: int | None = None
):
    """Adam at `recipe.learning_rate` for a stage of `epochs` over `num_images`
    (`learning_rate_schedule`: ×0.1 after 75% of the stage's steps); a
    stream's own `steps_per_epoch` (batches) replaces the count of batches
    of `recipe.batch_size`."""
    if steps_per_epoch is None:
        steps_per_epoch = math.ceil(num_images / recipe.batch_size)
    steps = steps_per_epoch * epochs
    return keras.optimizers.Adam(learning_rate_schedule(recipe.learning_rate, steps))


def fit_dataset(
    images, labels, batch_size: int, *, shuffle: bool, augment: bool, seed: int
):
    """A `tf.data` pipeline of `(inputs, labels)` for one stage's `fit`.

    uint8 images go through `datasets.make_dataset` (scaled to `[0, 1]`,
    optionally augmented); float inputs (e.g. precomputed features) are
    batched as they are, and cannot be augmented. A stream of `(image,
    label)` pairs (`subic_keras.streams`, `labels=None`) goes through
    `datasets.make_stream_dataset`, in its own order (`shuffle` is the
    stream's business).
    """
    if streams.is_stream(images):
        return datasets.make_stream_dataset(
            images, batch_size, augment=augment, seed=seed
        )
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return datasets.make_dataset(
            images, labels, batch_size, shuffle=shuffle, augment=augment, seed=seed
        )
    if augment:
        raise ValueError(
            "augment=True needs uint8 images, received inputs of dtype "
            f"{images.dtype}; pass augment=False for features"
        )
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels))
    if shuffle:
        data = data.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
    return data.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _check_split(name: str, images, labels) -> tuple[np.ndarray, np.ndarray]:
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
        raise TypeError(
            f"{name} images must be uint8 pixels or float inputs, received dtype "
            f"{images.dtype}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"{name} labels must be a vector of one class id per image, received "
            f"{len(images)} images and labels of shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer) or (
        len(labels) and labels.min() < 0
    ):
        raise ValueError(
            f"{name} labels must be non-negative integer class ids, received "
            f"dtype {labels.dtype}"
        )
    if images.dtype != np.uint8 and not np.all(np.isfinite(images)):
        raise ValueError(f"{name} inputs must be finite, received NaN or infinity")
    return images, labels


def _num_classes(num_classes, *label_sets) -> int:
    needed = int(max(labels.max() for labels in label_sets if len(labels))) + 1
    if num_classes is None:
        return check_int("num_classes", max(needed, 2), minimum=2)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    if needed > num_classes:
        raise ValueError(
            f"num_classes is {num_classes}, but the labels reach class {needed - 1}"
        )
    return num_classes


class Split:
    """One split of a stage's data: arrays, or a stream read only when needed.

    A stream is summarised (`streams.summarize`, one pass) only for what
    its structure does not tell: its labels (the class count when
    `num_classes` is not given; validation), its batch count when its
    cardinality is unknown, and its digest for the pre-training cache.
    """

    def __init__(self, name: str, images, labels):
        self.name = name
        self.is_stream = streams.is_stream(images)
        if self.is_stream:
            if labels is not None:
                raise ValueError(
                    f"{name} labels must be None when the images are a stream of "
                    f"(image, label) pairs, received {type(labels).__name__}"
                )
            self.images, self._labels = images, None
            streams.check_pixel_range(images, name)  # checks the elements too
        else:
            self.images, self._labels = _check_split(name, images, labels)

    @property
    def summary(self) -> streams.StreamSummary:
        """The stream's one-pass summary (made once: `streams.summarize`)."""
        return streams.summarize(self.images, self.name)

    @property
    def labels(self) -> np.ndarray:
        return self.summary.labels if self._labels is None else self._labels

    @property
    def fit_labels(self):
        """The labels to pass beside `images`: `None` for a stream."""
        return self._labels

    def __len__(self) -> int:
        if self._labels is not None:
            return len(self._labels)
        return self.summary.count

    def known_count(self) -> int | None:
        """The number of examples, if known without reading a stream."""
        if not self.is_stream or streams.known_summary(self.images) is not None:
            return len(self)
        dataset = streams.as_dataset(self.images, self.name)
        spec = dataset.element_spec
        count = int(dataset.cardinality())
        return count if count >= 0 and spec[1].shape.rank == 0 else None

    def optimizer(self, recipe: Recipe, epochs: int):
        """`stage_optimizer` for `epochs` over this split."""
        return stage_optimizer(recipe, 0, epochs, self.steps(recipe.batch_size))

    @property
    def input_shape(self) -> tuple:
        if self.is_stream:
            spec = streams.labelled_batches(self.images, 1, self.name).element_spec
            return tuple(spec[0].shape[1:])
        return tuple(np.shape(self.images)[1:])

    def steps(self, batch_size: int) -> int:
        """Batches per epoch."""
        if not self.is_stream:
            return math.ceil(len(self) / batch_size)
        known = int(streams.labelled_batches(self.images, batch_size).cardinality())
        return known if known > 0 else self.summary.steps(batch_size)

    def digest(self) -> str:
        if self.is_stream:
            return self.summary.digest
        return _digest(self.images, self.labels)

    def training_batches(self, recipe: Recipe, seed: int):
        """A stage's training batches: shuffled, augmented if `recipe.augment`."""
        return fit_dataset(
            self.images,
            self.fit_labels,
            recipe.batch_size,
            shuffle=True,
            augment=recipe.augment,
            seed=seed,
        )

    def validation_batches(self, seed: int):
        """Keras's validation batches, in order, as they are."""
        return fit_dataset(
            self.images, self.fit_labels, 256, shuffle=False, augment=False, seed=seed
        )


def check_data(
    images,
    labels,
    validation,
    num_classes=None,
    input_shape=None,
    *,
    classifies: bool = True,
):
    """Checked `(training, validation, num_classes, input_shape)`: a stage's
    data, arrays or streams, as two `Split`s.

    With `classifies` (a model with a softmax over the classes) and no
    `num_classes`, validation classes that training lacks are refused: the
    class count would silently grow to include them."""
    training = Split("training", images, labels)
    if not isinstance(validation, (tuple, list)) or len(validation) != 2:
        if not streams.is_stream(validation):
            raise ValueError(
                "validation must be a pair (images, labels) or a stream of "
                f"(image, label) pairs, received {type(validation).__name__}"
            )
        validation = (validation, None)
    held_out = Split("validation", *validation)
    if classifies and num_classes is None:
        # Training's labels are read here anyway, for the class count.
        unknown = np.setdiff1d(held_out.labels, training.labels)
        if len(unknown):
            raise ValueError(
                f"validation holds classes that training does not: "
                f"{unknown[:10].tolist()}; a classifier cannot learn them (give "
                "num_classes to train one anyway)"
            )
    if num_classes is None or not training.is_stream:
        # A stream's labels are read (one pass) only when the class count
        # is not given.
        num_classes = _num_classes(num_classes, training.labels, held_out.labels)
    else:
        num_classes = _num_classes(num_classes, held_out.labels)
    return training, held_out, num_classes, tuple(input_shape or training.input_shape)


def _data_digest(training: Split, validation: Split) -> str:
    if not training.is_stream and not validation.is_stream:
        return _digest(
            training.images, training.labels, validation.images, validation.labels
        )
    digests = training.digest() + validation.digest()
    return hashlib.sha256(digests.encode()).hexdigest()


def _digest(*arrays) -> str:
    hasher = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        hasher.update(f"{array.dtype.str}{array.shape}".encode())
        hasher.update(array.data.cast("B"))
    return hasher.hexdigest()


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
    return keras.Model(inputs, outputs, name="pretrain_classifier")


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
        os.makedirs(self.directory, exist_ok=True)
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


def _read_state(directory: str) -> dict | None:
    path = os.path.join(directory, "state.json")
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


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
            `labels=None` (`subic_keras.streams`).
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
            backbone.load_weights(weights_path)
            with open(record_path) as handle:
                return {**json.load(handle), "cached": True}

    classifier = _classifier(backbone, preprocessing, input_shape, num_classes)
    selector = BestWeights("val_accuracy", mode="max")
    stage_callbacks = [selector, keras.callbacks.TerminateOnNaN(), *callbacks]
    phases = [(0, recipe.frozen_epochs), (recipe.frozen_epochs, recipe.pretrain_epochs)]
    flags = _trainable_flags(backbone)
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


def train_subic(
    backbone: keras.layers.Layer,
    num_blocks: int,
    block_size: int,
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
    pretrain_callbacks=(),
    callbacks=(),
    verbose: int | str = 0,
) -> tuple[Subic, dict]:
    """Trains SuBiC with the two-stage recipe (module docstring).

    Stage 1 (`pretrain_backbone`, skipped when `recipe.pretrain_epochs` is
    0) trains `backbone` in place. Stage 2 re-seeds the random generators
    with `seed`, copies the backbone's architecture with fresh layers and
    the pre-trained weights (so the head's initial weights do not depend on
    whether stage 1 ran or came from the cache), builds SuBiC on it
    (`build_subic` with `recipe.gamma`, `recipe.mu`) and fits it with the
    entropy warm-up, keeping the epoch with the best validation mAP of the
    paper's query `z*`. The query kind with the higher validation mAP at that
    epoch becomes the model's `default_query`.

    Example:

    >>> subic, summary = train_subic(
    ...     backbones.dsh_cnn(), 8, 64, images[:40], labels[:40],
    ...     (images[40:], labels[40:]), recipe=Recipe(pretrain_epochs=1, epochs=1))
    >>> codes = subic.encode(images / 255)
    >>> queries = subic.query(images / 255)   # the kind chosen on validation
    >>> codes.shape, queries.shape, summary["query"] in QUERY_KINDS
    ((64, 8), (64, 512), True)

    `Recipe()`'s budgets are the validated defaults for CIFAR-10-sized data;
    the small ones above only keep the example short.

    Args:
        backbone: a Keras model mapping inputs to feature vectors: any of
            `subic_keras.backbones` or your own.
        num_blocks, block_size: `M` and `K`; codes have `M·log2 K` bits.
        images, labels: the training inputs (uint8 images, or float inputs
            such as features) and their class ids; or a stream of
            `(image, label)` pairs, batched or not, and `labels=None`
            (`subic_keras.streams`: read in its own order, so shuffle it).
        validation: `(images, labels)` held out from training, for model
            selection (at least 20), or a stream of `(image, label)` pairs.
        num_classes: number of classes; from the labels if `None`.
        recipe: the budgets and weights (`Recipe()`: our validated defaults);
            `batch_size` batches unbatched streams.
        seed: seed of the initial weights, data order and augmentation.
        preprocessing: a layer applied to the inputs before the backbone,
            saved with the model (e.g. `keras.layers.Normalization`).
        input_shape: the input shape, if the backbone does not define one.
        cache_dir: cache of the pre-training (`pretrain_backbone`).
        pretrain_callbacks, callbacks: more Keras callbacks for the two
            stages' `fit`.
        verbose: `fit`'s verbosity; the default 0 prints nothing, `"auto"`
            shows Keras's progress bar as `model.fit` does.

    Returns:
        `(subic, summary)`: the trained `Subic` (best validation epoch,
        query chosen) and a JSON-ready summary of both stages.
    """
    start = time.time()
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    training, held_out, num_classes, input_shape = check_data(
        images, labels, validation, num_classes, input_shape
    )
    if len(held_out) < MIN_VALIDATION:
        raise ValueError(
            f"validation must hold at least {MIN_VALIDATION} images for model "
            f"selection, received {len(held_out)} (hold out more: subic "
            "train's --validation-size, or more pictures)"
        )
    pretraining = None
    if recipe.pretrain_epochs:
        pretraining = pretrain_backbone(
            backbone,
            images,
            labels,
            validation,
            num_classes=num_classes,
            recipe=recipe,
            seed=seed,
            preprocessing=preprocessing,
            input_shape=input_shape,
            cache_dir=cache_dir,
            callbacks=pretrain_callbacks,
            verbose=verbose,
        )

    stage_start = time.time()
    keras.utils.set_random_seed(seed)
    fresh = _fresh_copy(backbone)
    fresh.set_weights(backbone.get_weights())
    subic = build_subic(
        fresh,
        num_blocks,
        block_size,
        num_classes,
        gamma=recipe.gamma,
        mu=recipe.mu,
        input_shape=input_shape,
        preprocessing=_fresh_copy(preprocessing),
        optimizer=None,
    )
    subic.compile(training.optimizer(recipe, recipe.epochs))
    validator = RetrievalValidation(
        subic, held_out.images, held_out.fit_labels, queries=QUERY_KINDS
    )
    selector = BestWeights(f"val_map_{QUERY_KINDS[0]}", mode="max")
    history = subic.train_model.fit(
        training.training_batches(recipe, seed),
        validation_data=held_out.validation_batches(seed),
        epochs=recipe.epochs,
        callbacks=[
            EntropyWarmup(recipe.warmup_epochs),
            validator,
            selector,
            keras.callbacks.TerminateOnNaN(),
            *callbacks,
        ],
        verbose=verbose,
        shuffle=False,
    )
    losses = history.history.get("loss", [])
    summary = {
        "pretrain": pretraining,
        "recipe": dataclasses.asdict(recipe),
        "seed": seed,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "bits": num_blocks * int(math.log2(block_size)),
        "num_classes": num_classes,
        "epochs_run": len(losses),
        # TerminateOnNaN ends the epoch it stops in with a NaN loss.
        "stopped_on_nan": bool(losses) and not math.isfinite(losses[-1]),
        "best_epoch": None,
        "query": None,
    }
    if selector.best_epoch is not None:
        at_best = {kind: selector.best_logs[f"val_map_{kind}"] for kind in QUERY_KINDS}
        subic.default_query = max(QUERY_KINDS, key=lambda kind: at_best[kind])
        summary.update(
            best_epoch=selector.best_epoch + 1,
            validation_map=at_best,
            query=subic.default_query,
        )
    summary["validation_map_per_epoch"] = {
        kind: [float(v) for v in history.history.get(f"val_map_{kind}", [])]
        for kind in QUERY_KINDS
    }
    summary["subic_train_seconds"] = round(time.time() - stage_start, 1)
    summary["train_seconds"] = round(time.time() - start, 1)
    return subic, summary
