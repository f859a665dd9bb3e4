import keras
import numpy as np
import pytest
import tensorflow as tf

from subic_keras import build_subic
from subic_keras.data.pixels import PIXEL_LEVELS, ImageModel, scale_pixels


def _all_levels() -> np.ndarray:
    return np.arange(256, dtype=np.uint8).reshape(16, 16)


def test_pixel_levels_are_numpys_quotients():
    levels = _all_levels()
    np.testing.assert_array_equal(
        PIXEL_LEVELS[levels], levels.astype(np.float32) / np.float32(255)
    )


def test_scale_pixels_is_exact_in_a_graph():
    # Inside tf.function, `x / 255.0` may become `x * (1 / 255)`; the table
    # gives NumPy's quotients whatever the optimiser does.
    levels = _all_levels()
    scaled = tf.function(scale_pixels)(tf.constant(levels))
    np.testing.assert_array_equal(scaled.numpy(), levels.astype("float32") / 255)
    floats = np.full((2, 3), 0.5, np.float32)
    assert scale_pixels(floats) is floats


def _model(seed: int) -> ImageModel:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    model = ImageModel(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def test_image_model_fits_and_predicts_uint8_as_x_over_255(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, 64)
    scaled = images.astype("float32") / 255
    on_pixels, on_floats = _model(1), _model(1)
    on_pixels.fit(images, labels, batch_size=16, epochs=2, shuffle=False, verbose=0)
    on_floats.fit(scaled, labels, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(on_pixels.get_weights(), on_floats.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        on_pixels.predict(images, verbose=0), on_floats.predict(scaled, verbose=0)
    )
    # The scaling is part of the saved model.
    on_pixels.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(loaded) is ImageModel
    np.testing.assert_array_equal(
        loaded.predict(images, verbose=0), on_floats.predict(scaled, verbose=0)
    )


@pytest.fixture(scope="module")
def trained_subic():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 400)
    # Images whose colour tells the class, with noise: codes vary.
    images = np.clip(
        labels[:, None, None, None] * 60 + rng.normal(0, 40, (400, 8, 8, 3)), 0, 255
    ).astype(np.uint8)
    backbone = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(32)]
    )
    subic = build_subic(backbone, num_blocks=4, block_size=16, num_classes=4)
    # As a Keras user would: `fit` on the loader's uint8 images.
    subic.train_model.fit(images, labels, batch_size=50, epochs=3, verbose=0)
    return subic, images


def test_subic_on_uint8_is_subic_on_x_over_255(trained_subic, tmp_path):
    subic, images = trained_subic
    scaled = images.astype("float32") / 255
    codes = subic.encode(images)
    assert len(np.unique(codes, axis=0)) > 1
    np.testing.assert_array_equal(codes, subic.encode(scaled))
    for kind in ("fc0", "class_posterior"):
        np.testing.assert_array_equal(
            subic.query(images, kind=kind), subic.query(scaled, kind=kind)
        )
    predicted = subic.train_model.predict(images, verbose=0)
    expected = subic.train_model.predict(scaled, verbose=0)
    for name in predicted:
        np.testing.assert_array_equal(predicted[name], expected[name])
    np.testing.assert_array_equal(
        subic.classifier.predict(images, verbose=0),
        subic.classifier.predict(scaled, verbose=0),
    )
