"""Training callbacks: entropy warm-up and a NaN-safe, atomic best checkpoint."""

from __future__ import annotations

import math

import keras
import numpy as np

from subic_keras._io import atomic_path
from subic_keras._validation import check_int, check_non_negative
from subic_keras.losses import _BlockEntropyLoss


def _entropy_losses(model: keras.Model) -> list[_BlockEntropyLoss]:
    losses = getattr(model, "loss", None)
    if isinstance(losses, dict):
        losses = list(losses.values())
    elif not isinstance(losses, (list, tuple)):
        losses = [losses]
    return [loss for loss in losses if isinstance(loss, _BlockEntropyLoss)]


class EntropyWarmup(keras.callbacks.Callback):
    """Ramps the entropy terms' weights linearly from 0 over the first epochs.

    With `γ = μ = 1` from the first step, blocks saturate to one-hot before
    the classifier has learnt anything, the block softmax's gradient vanishes
    and training stalls (see SPEC.md, "Measured on this project's machines").
    This callback multiplies `γ` and `μ` of every compiled SuBiC entropy loss
    by `min(1, t / epochs)`, `t` counting epochs in fractions of batches.

    Example:

    >>> subic.train_model.fit(dataset, epochs=30, shuffle=False,
    ...                       callbacks=[EntropyWarmup(epochs=5)])

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
        if not all(np.all(np.isfinite(value)) for value in logs.values()):
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
