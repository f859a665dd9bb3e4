"""Training callbacks: entropy warm-up, validation retrieval mAP, best-epoch
selection, epoch-level TensorBoard logs and a NaN-safe, atomic checkpoint;
and one short line per epoch with the time left. (`PredictionProgress`,
the bar of `predict`, is the models' own: `subic_keras.models.prediction`.)"""

from __future__ import annotations

import math
import os
import sys
import time

import keras
import numpy as np

from subic_keras._io import atomic_path, make_folders
from subic_keras._validation import check_int, check_non_negative
from subic_keras.config import QUERY_KINDS
from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.evaluation import scoring
from subic_keras.models.losses import BlockEntropyLoss
from subic_keras.models.prediction import PredictionProgress

__all__ = [
    "BestModelCheckpoint",
    "BestWeights",
    "EntropyWarmup",
    "EpochProgress",
    "EpochTensorBoard",
    "PredictionProgress",
    "RetrievalValidation",
    "duration",
]


def _all_finite(logs: dict) -> bool:
    return all(np.all(np.isfinite(value)) for value in logs.values())


def _entropy_losses(model: keras.Model) -> list[BlockEntropyLoss]:
    losses = getattr(model, "loss", None)
    if isinstance(losses, dict):
        losses = list(losses.values())
    elif not isinstance(losses, (list, tuple)):
        losses = [losses]
    return [loss for loss in losses if isinstance(loss, BlockEntropyLoss)]


class EntropyWarmup(keras.callbacks.Callback):
    """Ramps the entropy terms' weights linearly from 0 over the first epochs.

    With `γ = μ = 1` from the first step, blocks saturate to one-hot before
    the classifier has learnt anything, the block softmax's gradient vanishes
    and training stalls.
    This callback multiplies `γ` and `μ` of every compiled SuBiC entropy loss
    by `min(1, t / epochs)`, `t` counting epochs in fractions of batches.

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 4, 16, num_classes=10)
    >>> history = subic.train_model.fit(images / 255, labels, epochs=2, verbose=0,
    ...                                 callbacks=[EntropyWarmup(epochs=1)])
    >>> len(history.history["loss"])
    2

    Args:
        epochs: length of the ramp in epochs; `0` applies full weights at once.
    """

    def __init__(self, epochs: float = 5.0):
        super().__init__()
        self.epochs = check_non_negative("epochs", epochs)
        self._epoch = 0

    def _set(self, progress: float) -> None:
        factor = 1.0 if self.epochs == 0 else min(1.0, progress / self.epochs)
        for loss in _entropy_losses(self.model):
            loss.warmup.assign(factor)

    def on_train_begin(self, logs=None):
        if not _entropy_losses(self.model):
            raise ValueError(
                "EntropyWarmup found no SuBiC entropy loss in the model's compiled "
                f"loss, received loss={getattr(self.model, 'loss', None)!r}"
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.params.get("steps") if self.params else None
        if steps:
            self._set(self._epoch + batch / steps)

    def on_train_end(self, logs=None):
        self._set(math.inf)


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves the model when a monitored value improves; atomically, never on NaN.

    Unlike `keras.callbacks.ModelCheckpoint`, the file is written to a
    temporary path and renamed into place, so an interrupted save leaves the
    previous best intact, and an epoch whose logs hold any NaN or infinite
    value is never saved: a diverged model cannot overwrite the last good one.

    Args:
        filepath: the `.keras` file to write.
        monitor: the logged value to watch, e.g. `"val_loss"`.
        mode: `"min"` or `"max"`.
        verbose: print a line when the model is saved.
        start_epoch: the first epoch (0-based) that may be saved; while the
            entropy weights ramp up (`EntropyWarmup`) the loss is not
            comparable across epochs.
    """

    def __init__(
        self, filepath: str, monitor="val_loss", mode="min", verbose=1, start_epoch=0
    ):
        super().__init__()
        self.start_epoch = check_int("start_epoch", start_epoch, minimum=0)
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', received {mode!r}")
        if not str(filepath).endswith(".keras"):
            raise ValueError(f"filepath must end in .keras, received {filepath!r}")
        self.filepath = str(filepath)
        self.monitor = monitor
        self.mode = mode
        self.verbose = verbose
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.monitor not in logs:
            raise ValueError(
                f"monitor {self.monitor!r} is not among the logged values "
                f"{sorted(logs)}"
            )
        if not _all_finite(logs):
            if self.verbose:
                print(
                    f"\nEpoch {epoch + 1}: non-finite values logged; "
                    f"{self.filepath} is left unchanged"
                )
            return
        value = float(logs[self.monitor])
        if epoch < self.start_epoch:
            return
        if value < self.best if self.mode == "min" else value > self.best:
            if self.verbose:
                print(
                    f"\nEpoch {epoch + 1}: {self.monitor} improved to {value:.5f}, "
                    f"saving {self.filepath}"
                )
            self.best, self.best_epoch = value, epoch
            with atomic_path(self.filepath, suffix=".keras") as tmp:
                self.model.save(tmp)


class BestWeights(keras.callbacks.Callback):
    """Keeps the weights of the best epoch in memory and restores them at the end.

    Selection by a logged value, like `keras.callbacks.ModelCheckpoint` with
    `save_best_only=True` but without a file per improvement: an epoch whose
    logs hold a NaN or infinite value is never selected, and when training
    ends (normally, by `TerminateOnNaN`, or by another callback) the model
    holds the best epoch's weights. SuBiC's recipe selects by validation
    retrieval mAP (`RetrievalValidation`, placed before this callback).

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 4, 16, num_classes=10)
    >>> selector = BestWeights("val_map_fc0")
    >>> history = subic.train_model.fit(
    ...     images[:40] / 255, labels[:40], epochs=2, verbose=0,
    ...     callbacks=[RetrievalValidation(subic, images[40:], labels[40:]),
    ...                selector])
    >>> selector.best_epoch in (0, 1)   # the model now holds that epoch
    True

    Args:
        monitor: the logged value to watch, e.g. `"val_map_fc0"` or
            `"val_accuracy"`.
        mode: `"max"` or `"min"`.
        start_epoch: the first epoch (0-based) that may be selected.
        restore: set the best weights on the model when training ends.

    Attributes:
        best: the best monitored value, `best_epoch` its 0-based epoch
            (`None` while no epoch qualified), `history` the value of every
            epoch (NaN for a non-finite epoch), `best_logs` that epoch's logs.
    """

    def __init__(
        self,
        monitor: str,
        mode: str = "max",
        start_epoch: int = 0,
        restore: bool = True,
    ):
        super().__init__()
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', received {mode!r}")
        self.monitor = monitor
        self.mode = mode
        self.start_epoch = check_int("start_epoch", start_epoch, minimum=0)
        self.restore = bool(restore)
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None
        self.best_logs: dict = {}
        self.best_weights: list | None = None
        self.history: list[float] = []

    def _improves(self, value: float) -> bool:
        return value < self.best if self.mode == "min" else value > self.best

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.monitor not in logs:
            raise ValueError(
                f"monitor {self.monitor!r} is not among the logged values "
                f"{sorted(logs)}; a callback that logs it must come first"
            )
        # Resumed runs start at a later epoch: keep `history` indexed by epoch.
        del self.history[epoch:]
        self.history.extend([math.nan] * (epoch - len(self.history)))
        if not _all_finite(logs):
            self.history.append(math.nan)
            return
        value = float(logs[self.monitor])
        self.history.append(value)
        if epoch >= self.start_epoch and self._improves(value):
            self.best, self.best_epoch = value, epoch
            self.best_logs = {key: float(np.mean(v)) for key, v in logs.items()}
            self.best_weights = [w.copy() for w in self.model.get_weights()]

    def on_train_end(self, logs=None):
        if self.restore and self.best_weights is not None:
            self.model.set_weights(self.best_weights)


def _length(images) -> int:
    from subic_keras.data import streams

    if streams.is_stream(images):
        raise ValueError(
            "labels must be None for a stream of (image, label) pairs, received "
            "labels as well"
        )
    return len(images)


class RetrievalValidation(keras.callbacks.Callback):
    """Logs retrieval mAP on held-out images after every epoch.

    A tenth of the validation images (seeded, `query_fraction`) query the
    rest; the ranking of every query over that database is scored by mAP
    with pessimistic ties (relevant items last among equal scores). For a
    `Subic`, each query kind in `queries` is logged as `val_map_<kind>`:
    `val_map_fc0` for the paper's `z*` (Sec. 3.3, Eq. 9) and
    `val_map_class_posterior` for `W₁ s*`. Any other
    `subic_keras.evaluation.scoring.Scorer` (a hashing baseline) is logged as
    `val_map`, with `queries=None`. Put it before callbacks that read these
    values (`BestWeights`, `EarlyStopping`).

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 4, 16, num_classes=10)
    >>> validation = RetrievalValidation(subic, images[40:], labels[40:])
    >>> history = subic.train_model.fit(images[:40] / 255, labels[:40], verbose=0,
    ...                                 callbacks=[validation])
    >>> sorted(key for key in history.history if key.startswith("val_map"))
    ['val_map_class_posterior', 'val_map_fc0']

    Args:
        scorer: the `Subic` (or other scorer) whose model is being fitted.
        images: validation images: uint8 pixels or float model inputs, or a
            stream of `(image, label)` pairs (`subic_keras.data.streams`).
        labels: their class ids `(n,)`; `None` for a stream.
        queries: the query kinds of a `Subic` to score; `None` scores the
            scorer as it is, as `val_map`.
        query_fraction: the fraction of `images` used as queries (at least 10).
        seed: seed of the query draw.
    """

    def __init__(
        self,
        scorer,
        images,
        labels=None,
        queries=("fc0", "class_posterior"),
        query_fraction: float = 0.1,
        seed: int = 0,
    ):
        super().__init__()
        streamed = labels is None
        if streamed:
            from subic_keras.data import streams

            # A stream's labels, from one pass; its inputs are read again
            # after every epoch, a batch at a time.
            labels = streams.summarize(images, "validation").labels
        self.scorer, self.images, self.labels = scorer, images, np.asarray(labels)
        if queries is not None:
            queries = tuple(queries)
            unknown = [kind for kind in queries if kind not in QUERY_KINDS]
            if not queries or unknown:
                raise ValueError(
                    f"queries must be a non-empty subset of {QUERY_KINDS} or None, "
                    f"received {queries!r}"
                )
        if not 0 < query_fraction < 1:
            raise ValueError(
                f"query_fraction must be in (0, 1), received {query_fraction!r}"
            )
        count = len(self.labels) if streamed else _length(images)
        if len(self.labels) != count or count < 20:
            raise ValueError(
                "images and labels must be the same length, at least 20, received "
                f"{count} images and {len(self.labels)} labels"
            )
        self.queries = queries
        self.num_queries = max(10, int(len(self.labels) * query_fraction))
        self.seed = check_int("seed", seed, minimum=0)

    @property
    def names(self) -> list[str]:
        """The names this callback logs."""
        if self.queries is None:
            return ["val_map"]
        return [f"val_map_{kind}" for kind in self.queries]

    def scores(self) -> dict[str, float]:
        """Validation mAP of the model's current weights, per logged name."""
        kinds = (None,) if self.queries is None else self.queries
        result, database = {}, None
        for name, kind in zip(self.names, kinds):
            scorer = self.scorer if kind is None else self.scorer.with_query(kind)
            scores, query_labels, database_labels, database = scoring.protocol_scores(
                scorer,
                self.images,
                self.labels,
                "random",
                seed=self.seed,
                database=database,
                num_queries=self.num_queries,
            )
            result[name] = float(
                evaluation.mean_average_precision(
                    scores, query_labels, database_labels, ties="pessimistic"
                )
            )
        return result

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        if not _all_finite(logs):
            logs.update(dict.fromkeys(self.names, math.nan))
            return
        logs.update(self.scores())


class EpochTensorBoard(keras.callbacks.Callback):
    """Writes every logged value to TensorBoard once per epoch.

    `keras.callbacks.TensorBoard` writes a summary of every logged value on
    every batch, whatever its `update_freq`; that synchronises each step
    with the host and halves the training rate of a small CNN on a CPU
    (measured by `benchmarks/train_overhead.py`). This callback writes at
    epoch ends only, in TensorBoard's usual layout: `log_dir/train` and
    `log_dir/validation` (for `val_`-prefixed values), scalars
    `epoch_<name>`.

    Args:
        log_dir: the run's log directory.
    """

    def __init__(self, log_dir: str):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self._writers: dict = {}

    def _writer(self, name: str):
        import tensorflow as tf

        if name not in self._writers:
            # Made without following a link: a `train` link planted in
            # the log folder never receives the events.
            path = make_folders(self.log_dir, name)
            self._writers[name] = tf.summary.create_file_writer(path)
        return self._writers[name]

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf

        for key, value in (logs or {}).items():
            split, name = "train", key
            if key.startswith("val_"):
                split, name = "validation", key[4:]
            with self._writer(split).as_default():
                tf.summary.scalar(f"epoch_{name}", float(np.mean(value)), step=epoch)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: `"48 s"`, `"4 min 10 s"`, `"1 h 05 min"`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class EpochProgress(keras.callbacks.Callback):
    """One line per epoch: the stage, the epoch, its main figures, the time
    spent and an estimate of what is left of the stage.

    The estimate is the mean time of the epochs run so far (by this
    callback, so a resumed run counts only its own) times the epochs left.
    The figures shown are the loss, the accuracies and the validation mAPs;
    the other logs stay in TensorBoard.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> _ = model.fit(np.zeros((8, 3)), np.zeros((8, 1)), epochs=2, verbose=0,
    ...               callbacks=[EpochProgress("fitting", stream=sys.stdout)])
    ... # doctest: +ELLIPSIS
    fitting epoch 1/2: loss 0.000 (... s; about ... s left)
    fitting epoch 2/2: loss 0.000 (... s)

    Args:
        stage: the name the lines start with ("pre-training", "SuBiC").
        stream: where the lines go (standard output by default).
    """

    def __init__(self, stage: str, stream=None):
        super().__init__()
        self.stage, self.stream = stage, stream
        self._start: float | None = None
        self._first: int | None = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._start is None:  # once: a stage fitted in phases runs on
            self._start, self._first = time.perf_counter(), epoch

    def on_epoch_end(self, epoch, logs=None):
        assert self._start is not None and self._first is not None
        total = int(self.params.get("epochs") or epoch + 1)
        elapsed = time.perf_counter() - self._start
        left = total - (epoch + 1)
        logs = logs or {}
        shown = [key for key in ("loss", "accuracy", "val_accuracy") if key in logs]
        shown += sorted(key for key in logs if key.startswith("val_map"))
        figures = ", ".join(f"{key} {float(np.mean(logs[key])):.3f}" for key in shown)
        timing = duration(elapsed)
        if left > 0:
            rate = elapsed / (epoch + 1 - self._first)
            timing += f"; about {duration(rate * left)} left"
        print(
            f"{self.stage} epoch {epoch + 1}/{total}: {figures} ({timing})",
            file=self.stream or sys.stdout,
            flush=True,
        )
