"""`EpochCheckpoints`: a training run that, stopped, goes on from its last
finished epoch when it is run again with the same settings.

After every epoch the model is saved with its optimizer's state as
`<stem>.epoch-<e>.keras` (atomically; the earlier epoch's file is removed
once the new one is in place), beside `<stem>.resume.json`, which holds
the run's key: a digest of what it started from and trains on, and its
settings. A run whose key differs starts afresh and removes them; a
finished run removes them too (`finish`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re

import keras
import numpy as np

from subic_keras._io import atomic_path, load_keras_file

_EPOCH = re.compile(r"\.epoch-(\d+)\.keras$")


def run_key(model: keras.Model, pictures: np.ndarray, settings: dict) -> str:
    """SHA-256 of a model's weights, the pictures it trains on and `settings`
    (JSON-serializable): what a checkpoint must match to be resumed."""
    digest = hashlib.sha256()
    for weights in model.get_weights():
        digest.update(np.ascontiguousarray(weights).tobytes())
    digest.update(np.ascontiguousarray(pictures).tobytes())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves the model after every epoch, resumed by `resume`.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile("adam", "mse")
    >>> x = np.zeros((8, 3), "float32")
    >>> checkpoints = EpochCheckpoints("tuned.keras", run_key(model, x, {}))
    >>> start, model, state = checkpoints.resume(model)  # (0, model, {}) at first
    >>> start, state
    (0, {})
    >>> history = model.fit(
    ...     x, x[:, :1], epochs=2, initial_epoch=start, callbacks=[checkpoints],
    ...     verbose=0,
    ... )
    >>> checkpoints.finish()

    Args:
        stem: the path the checkpoint files are named after (the output's).
        key: `run_key` of the run.

    What the run measured before its first epoch (`remember`, JSON) is kept
    in `<stem>.resume.json` and handed back by `resume`.
    """

    def __init__(self, stem: str | os.PathLike, key: str):
        super().__init__()
        self.stem = os.fspath(stem)
        self.key = key
        self.state: dict = {}

    @property
    def record(self) -> str:
        return self.stem + ".resume.json"

    def _epoch_files(self) -> dict[int, str]:
        found = {}
        for path in glob.glob(glob.escape(self.stem) + ".epoch-*.keras"):
            match = _EPOCH.search(path)
            if match and os.path.isfile(path) and not os.path.islink(path):
                found[int(match.group(1))] = path
        return found

    def resume(self, model: keras.Model) -> tuple[int, keras.Model, dict]:
        """`(epochs done, the model to train, the saved state)`: the last
        epoch's model with its optimizer where this run's checkpoints are,
        else `(0, model, {})` and any other run's checkpoints removed."""
        files = self._epoch_files()
        try:
            with open(self.record, encoding="utf-8") as file:
                saved = json.loads(file.read(1 << 20))
        except (OSError, ValueError):
            saved = None
        if isinstance(saved, dict) and saved.get("key") == self.key and files:
            done = max(files)
            resumed = load_keras_file(files[done], compile=True)
            self.state = dict(saved.get("state") or {})
            return done, resumed, dict(self.state)
        self.finish()
        self.state = {}
        self.remember()
        return 0, model, {}

    def remember(self, **state) -> None:
        """Adds to the state kept for a resumed run (and writes it)."""
        self.state.update(state)
        with atomic_path(self.record, suffix=".json") as tmp:
            with open(tmp, "w", encoding="utf-8") as file:
                json.dump({"key": self.key, "state": self.state}, file)

    def on_epoch_end(self, epoch, logs=None):
        path = f"{self.stem}.epoch-{epoch + 1}.keras"
        with atomic_path(path, suffix=".keras") as tmp:
            self.model.save(tmp)
        for done, earlier in self._epoch_files().items():
            if done != epoch + 1:
                os.remove(earlier)

    def finish(self) -> None:
        """Removes the checkpoint files (the run is done, or another's)."""
        for path in self._epoch_files().values():
            os.remove(path)
        if os.path.isfile(self.record) and not os.path.islink(self.record):
            os.remove(self.record)
