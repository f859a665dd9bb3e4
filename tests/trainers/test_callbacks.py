import os

import keras
import numpy as np
import pytest

from subic_keras import build_subic
from subic_keras.trainers.callbacks import (
    BestModelCheckpoint,
    BestWeights,
    EntropyWarmup,
    EpochTensorBoard,
    RetrievalValidation,
)


def _subic():
    backbone = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu")]
    )
    return build_subic(backbone, 2, 4, 3)


def _data(n=40):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, n)


class _Record(keras.callbacks.Callback):
    def __init__(self, loss):
        super().__init__()
        self.loss, self.seen = loss, []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(float(self.loss.warmup.numpy()))


def test_entropy_warmup_ramps_linearly_then_holds():
    subic = _subic()
    entropy = subic.train_model.loss["block_probs"]
    record = _Record(entropy)
    x, y = _data(40)
    subic.train_model.fit(
        x, y, batch_size=10, epochs=3, verbose=0, callbacks=[EntropyWarmup(2), record]
    )
    # 4 steps per epoch; factor = (epoch + batch / 4) / 2, capped at 1.
    expected = [min(1.0, (e + b / 4) / 2) for e in range(3) for b in range(4)]
    np.testing.assert_allclose(record.seen, expected, rtol=1e-6)
    assert float(entropy.warmup.numpy()) == 1.0


def test_entropy_warmup_changes_the_loss():
    subic = _subic()
    x, y = _data(40)
    history = subic.train_model.fit(
        x, y, batch_size=40, epochs=1, verbose=0, callbacks=[EntropyWarmup(1)]
    )
    # In the first step of the ramp the entropy terms weigh 0.
    assert history.history["block_probs_loss"][0] == 0.0


def test_entropy_warmup_needs_entropy_loss():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile("sgd", "mse")
    x, _ = _data(8)
    with pytest.raises(ValueError, match="found no SuBiC entropy loss"):
        model.fit(x, np.zeros((8, 3)), verbose=0, callbacks=[EntropyWarmup(1)])
    with pytest.raises(
        ValueError, match="epochs must be a finite number >= 0, received -1.0"
    ):
        EntropyWarmup(-1)


class _PoisonAfter(keras.callbacks.Callback):
    """Sets every weight to NaN at the end of a given epoch's training."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._current == self.epoch:
            for weight in self.model.trainable_weights:
                weight.assign(np.full(weight.shape, np.nan, "float32"))

    def on_epoch_begin(self, epoch, logs=None):
        self._current = epoch


def test_nan_never_overwrites_the_best_checkpoint(tmp_path):
    subic = _subic()
    x, y = _data(40)
    path = tmp_path / "best.keras"
    checkpoint = BestModelCheckpoint(str(path), monitor="val_loss", verbose=0)
    history = subic.train_model.fit(
        x,
        y,
        validation_data=(x, y),
        epochs=5,
        verbose=0,
        callbacks=[_PoisonAfter(2), keras.callbacks.TerminateOnNaN(), checkpoint],
    )
    assert len(history.history["loss"]) == 3  # stopped in the poisoned epoch
    assert subic.train_model.stop_training
    assert checkpoint.best_epoch in (0, 1)
    saved = keras.saving.load_model(str(path))
    assert all(np.all(np.isfinite(w.numpy())) for w in saved.weights)
    assert [f for f in os.listdir(tmp_path) if f != "best.keras"] == []  # no temp files


def test_checkpoint_arguments():
    with pytest.raises(
        ValueError, match="filepath must end in .keras, received 'model.h5'"
    ):
        BestModelCheckpoint("model.h5")
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', received 'low'"):
        BestModelCheckpoint("m.keras", mode="low")
    subic = _subic()
    x, y = _data(8)
    with pytest.raises(
        ValueError, match="monitor 'val_acc' is not among the logged values"
    ):
        subic.train_model.fit(
            x,
            y,
            epochs=1,
            verbose=0,
            callbacks=[BestModelCheckpoint("/tmp/x.keras", "val_acc")],
        )


def test_best_weights_restores_the_best_finite_epoch():
    subic = _subic()
    x, y = _data(40)
    selector = BestWeights("val_loss", mode="min")
    snapshots = []

    class _Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            snapshots.append([w.copy() for w in self.model.get_weights()])

    subic.train_model.fit(
        x,
        y,
        validation_data=(x, y),
        epochs=5,
        verbose=0,
        callbacks=[
            _PoisonAfter(3),
            keras.callbacks.TerminateOnNaN(),
            _Snapshot(),
            selector,
        ],
    )
    assert len(selector.history) == 4 and np.isnan(selector.history[3])
    finite = selector.history[:3]
    assert selector.best_epoch == int(np.argmin(finite))
    assert selector.best == min(finite)
    # The model holds the selected epoch's weights, not the poisoned ones.
    for now, then in zip(
        subic.train_model.get_weights(), snapshots[selector.best_epoch]
    ):
        np.testing.assert_array_equal(now, then)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        BestWeights("val_loss", mode="up")


def test_retrieval_validation_logs_map_per_query(tmp_path):
    subic = _subic()
    x, y = _data(60)
    validation = RetrievalValidation(subic, x, y, seed=3)
    history = subic.train_model.fit(
        x,
        y,
        epochs=2,
        verbose=0,
        callbacks=[
            validation,
            BestWeights("val_map_fc0"),
            EpochTensorBoard(tmp_path / "logs"),
        ],
    )
    for kind in ("fc0", "class_posterior"):
        values = history.history[f"val_map_{kind}"]
        assert len(values) == 2 and all(0 < v <= 1 for v in values)
    # BestWeights restored the epoch with the best logged mAP.
    assert validation.scores()["val_map_fc0"] == pytest.approx(
        max(history.history["val_map_fc0"])
    )
    assert sorted(os.listdir(tmp_path / "logs")) == ["train", "validation"]
    with pytest.raises(ValueError, match="queries must be a non-empty subset"):
        RetrievalValidation(subic, x, y, queries=("z",))
    with pytest.raises(ValueError, match="query_fraction must be in"):
        RetrievalValidation(subic, x, y, query_fraction=1.0)
    with pytest.raises(ValueError, match="at least 20"):
        RetrievalValidation(subic, x[:10], y[:10])
