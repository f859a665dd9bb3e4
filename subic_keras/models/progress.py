"""A progress bar of `model.predict` on standard error, for encoding."""

from __future__ import annotations

import sys

import keras

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
