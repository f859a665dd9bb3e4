"""`build_training_state`: a new model's first train step is traced once,
and trains exactly as Keras's own deferred build does."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from subic_keras import prebuild
from subic_keras.data import pixels
from subic_keras.data.pixels import ImageModel


class Counting(ImageModel):
    """Counts the Python runs of `train_step`: one per trace."""

    traces = 0

    def train_step(self, data):
        Counting.traces += 1
        return super().train_step(data)


def _model(seed=0) -> Counting:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3)(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = Counting(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (32, 6, 6, 3), dtype=np.uint8), rng.integers(0, 3, 32)


@pytest.mark.parametrize("kind", ["arrays", "dataset"])
def test_the_first_train_step_is_traced_once(kind):
    x, y = _data()
    model = _model()
    Counting.traces = 0
    if kind == "arrays":
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    else:
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        model.fit(data, epochs=2, shuffle=False, verbose=0)
    assert Counting.traces == 1
    assert model.optimizer.built


def test_weights_equal_those_of_keras_s_own_build(monkeypatch):
    x, y = _data()
    ours = _model()
    ours.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    monkeypatch.setattr(pixels, "build_training_state", lambda *args: None)
    Counting.traces = 0
    deferred = _model()
    deferred.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert Counting.traces == 2  # Keras's build: traced with and without variables
    for a, b in zip(ours.get_weights(), deferred.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_what_it_cannot_read_is_left_to_keras():
    x, y = _data()
    model = _model()

    def batches():
        while True:
            yield x[:8], y[:8]

    prebuild.build_training_state(model, batches())
    assert not model.optimizer.built
    model.fit(batches(), steps_per_epoch=2, shuffle=False, verbose=0)  # Keras builds it
    assert model.optimizer.built
    uncompiled = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    prebuild.build_training_state(uncompiled, np.zeros((4, 2)), np.zeros((4, 1)))
    assert getattr(uncompiled, "optimizer", None) is None


def test_wrong_data_still_gets_keras_s_error():
    model = _model()
    with pytest.raises(ValueError, match="expected shape"):
        model.fit(np.zeros((8, 5, 5, 3), np.uint8), np.zeros(8), verbose=0)
