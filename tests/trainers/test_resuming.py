"""A training run resumed from its last finished epoch (trainers/resuming.py)."""

import os

import keras
import numpy as np
import pytest

from subic_keras.trainers.resuming import EpochCheckpoints, run_key

x = np.random.default_rng(0).normal(size=(64, 5)).astype("float32")
y = x @ np.arange(5, dtype="float32")[:, None]


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    return model


class _Stop(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt  # as a user's ^C, after epoch 2's save


def _fit(model, checkpoints, start=0, stop=False):
    callbacks = [checkpoints, *([_Stop()] if stop else [])]
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=4,
        shuffle=False,
        verbose=0,
        initial_epoch=start,
        callbacks=callbacks,
    )


def test_a_stopped_run_goes_on_to_the_weights_of_one_that_never_stopped(tmp_path):
    whole = _model()
    whole.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)

    stem = tmp_path / "tuned.keras"
    key = run_key(_model(), x, {"epochs": 4})
    first = EpochCheckpoints(stem, key)
    done, model, state = first.resume(_model())
    assert (done, state) == (0, {})
    first.remember(before=0.25)
    with pytest.raises(KeyboardInterrupt):
        _fit(model, first, stop=True)
    # One epoch's file at a time, beside the run's record.
    assert sorted(os.listdir(tmp_path)) == [
        "tuned.keras.epoch-2.keras",
        "tuned.keras.resume.json",
    ]

    again = EpochCheckpoints(stem, run_key(_model(), x, {"epochs": 4}))
    done, model, state = again.resume(_model())
    assert (done, state) == (2, {"before": 0.25})
    assert int(model.optimizer.iterations.numpy()) == 2 * 4
    _fit(model, again, start=done)
    again.finish()
    assert os.listdir(tmp_path) == []
    for ours, theirs in zip(model.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_another_runs_checkpoints_are_not_resumed_but_removed(tmp_path):
    stem = tmp_path / "tuned.keras"
    first = EpochCheckpoints(stem, run_key(_model(), x, {"epochs": 4}))
    _, model, _ = first.resume(_model())
    with pytest.raises(KeyboardInterrupt):
        _fit(model, first, stop=True)
    other = EpochCheckpoints(stem, run_key(_model(), x, {"epochs": 5}))
    done, model, state = other.resume(_model())
    assert (done, state) == (0, {})
    assert sorted(os.listdir(tmp_path)) == ["tuned.keras.resume.json"]
    assert run_key(_model(), x[:-1], {}) != run_key(_model(), x, {})


def test_a_link_planted_as_an_epochs_file_is_never_loaded(tmp_path):
    stem = tmp_path / "tuned.keras"
    key = run_key(_model(), x, {})
    first = EpochCheckpoints(stem, key)
    first.resume(_model())
    target = tmp_path / "elsewhere.keras"
    _model().save(target)
    os.symlink(target, tmp_path / "tuned.keras.epoch-9.keras")
    done, _, _ = EpochCheckpoints(stem, key).resume(_model())
    assert done == 0 and target.exists()
