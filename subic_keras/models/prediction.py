"""Predictions for encoding: `predict`, and its progress bar on standard
error (`PredictionProgress`)."""

from __future__ import annotations

import sys
import weakref

import keras
import numpy as np

from subic_keras._validation import check_int


class PredictionProgress(keras.callbacks.Callback):
    """A progress bar of `model.predict` on standard error (tqdm).

    Keras's own bar writes to standard output, where `subic search` prints its
    JSON results; this one keeps standard output clean, and shows nothing
    when standard error is not a terminal.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> outputs = model.predict(np.zeros((10, 3)), batch_size=4, verbose=0,
    ...                         callbacks=[PredictionProgress("encoding", 10)])

    Args:
        description: what is being predicted, shown before the bar.
        total: the number of items (rows) to predict.
    """

    def __init__(self, description: str, total: int):
        super().__init__()
        self.description = description
        self.total = check_int("total", total, minimum=0)
        self._bar = None

    def on_predict_begin(self, logs=None):
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=self.total,
            desc=self.description,
            unit="img",
            file=sys.stderr,
            disable=None,  # only on a terminal
            leave=False,
        )

    def on_predict_batch_end(self, batch, logs=None):
        outputs = (logs or {}).get("outputs")
        first = keras.tree.flatten(outputs)[0] if outputs is not None else None
        self._bar.update(len(first) if first is not None else 1)

    def on_predict_end(self, logs=None):
        self._bar.close()


# Models `predict` has called directly once (its docstring says why).
_CALLED_DIRECTLY: weakref.WeakSet = weakref.WeakSet()


def predict(model, inputs, batch_size: int, description: str, progress: bool):
    """`model.predict(inputs)`, with a progress bar named `description` on a
    terminal's standard error when `progress` (and `inputs` is an array).

    A model's first call on one batch (an array of at most `batch_size`
    rows) runs the model directly. `predict` first traces a function for
    the model object, which costs more than a small batch: every command
    and every reload pays it, and a one-picture search or a small folder
    never gets it back. Later calls go through `predict`: its traced
    function is the faster from then on for networks of many small ops
    (MobileNet's)."""
    if (
        isinstance(inputs, np.ndarray)
        and len(inputs) <= batch_size
        and getattr(model, "predict_function", None) is None
        and model not in _CALLED_DIRECTLY
    ):
        _CALLED_DIRECTLY.add(model)
        outputs = model(keras.ops.convert_to_tensor(inputs), training=False)
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)
    callbacks = []
    if progress and isinstance(inputs, np.ndarray):
        callbacks.append(PredictionProgress(description, len(inputs)))
    return model.predict(inputs, batch_size=batch_size, verbose=0, callbacks=callbacks)
