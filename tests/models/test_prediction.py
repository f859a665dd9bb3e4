import keras
import numpy as np

from subic_keras.models.prediction import predict


def _two_outputs():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = {
        "a": keras.layers.Dense(3)(hidden),
        "b": keras.layers.Dense(2, activation="softmax")(hidden),
    }
    return keras.Model(inputs, outputs)


def test_a_first_call_on_one_batch_is_direct_and_gives_predicts_outputs():
    keras.utils.set_random_seed(1)
    model = _two_outputs()
    x = np.random.default_rng(0).normal(size=(20, 6)).astype("float32")
    direct = predict(model, x, 32, "outputs", False)
    assert model.predict_function is None  # no function traced
    traced = predict(model, x, 32, "outputs", False)
    assert model.predict_function is not None
    assert sorted(direct) == sorted(traced) == ["a", "b"]
    for name in direct:
        assert isinstance(direct[name], np.ndarray)
        np.testing.assert_allclose(direct[name], traced[name], rtol=1e-6)


def test_more_rows_than_a_batch_or_a_dataset_go_through_model_predict():
    model = _two_outputs()
    x = np.zeros((20, 6), "float32")
    outputs = predict(model, x, 8, "outputs", False)
    assert model.predict_function is not None
    assert outputs["a"].shape == (20, 3)
    other = _two_outputs()
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices(x).batch(8)
    assert predict(other, data, 32, "outputs", False)["b"].shape == (20, 2)
    assert other.predict_function is not None
