"""Streams (`tf.data`, `PyDataset`) through the recipe, the baselines and the
evaluation: the same results as arrays, nothing read more than needed."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from subic_keras.baselines import build_dsh, train_hashing
from subic_keras.data import datasets, streams
from subic_keras.evaluation import scoring
from subic_keras.models import backbones
from subic_keras.trainers import callbacks, recipe, training_data

SHAPE = (16, 16, 3)


def _pictures(n, seed):
    """uint8 pictures whose red channel tells their class (4 classes)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 4)
    images = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    images[..., 0] = (labels * 60)[:, None, None].astype(np.uint8)
    return images, labels


@pytest.fixture(scope="module")
def pictures():
    return _pictures(180, 0), _pictures(60, 1)


class _Counting(keras.utils.PyDataset):
    """A PyDataset of `(images, labels)` batches that counts its reads."""

    def __init__(self, images, labels, batch_size):
        super().__init__()
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.reads = 0

    @property
    def num_batches(self):
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, index):
        self.reads += 1
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.images[part], self.labels[part]


def _train(images, labels, validation, seed=3, **kwargs):
    keras.utils.set_random_seed(seed)
    backbone = backbones.dsh_cnn(input_shape=SHAPE)
    budget = recipe.Recipe(pretrain_epochs=0, epochs=2, batch_size=32)
    return recipe.train_subic(
        backbone, 4, 16, images, labels, validation, recipe=budget, seed=seed, **kwargs
    )


def test_a_user_pipeline_gives_the_codes_of_the_arrays_path(pictures):
    (x, y), (xv, yv) = pictures
    arrays, arrays_summary = _train(x, y, (xv, yv))
    # The user's pipeline shuffles as the arrays path does (same seed, same
    # global seed): the recipe must not read it beyond fit's own passes.
    keras.utils.set_random_seed(3)
    pairs = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        len(x), seed=3, reshuffle_each_iteration=True
    )
    validation = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(7)
    streamed, streamed_summary = _train(pairs, None, validation, num_classes=4)
    assert (
        streamed_summary["validation_map_per_epoch"]
        == arrays_summary["validation_map_per_epoch"]
    )
    everything = np.concatenate([x, xv]), np.concatenate([y, yv])
    np.testing.assert_array_equal(
        streamed.encode(everything[0]), arrays.encode(everything[0])
    )
    as_arrays = scoring.evaluate(arrays, *everything, "random", num_queries=24)
    as_stream = scoring.evaluate(
        streamed,
        tf.data.Dataset.from_tensor_slices(everything).batch(50),
        None,
        "random",
        num_queries=24,
    )
    for key in ("map", "map_expected", "map_21point", "precision@10"):
        assert as_stream[key] == as_arrays[key]


def test_pretraining_from_a_stream_equals_arrays(pictures):
    (x, y), (xv, yv) = pictures
    budget = recipe.Recipe(pretrain_epochs=2, batch_size=32, augment=True)
    weights = []
    for streamed in (False, True):
        keras.utils.set_random_seed(5)
        backbone = backbones.dsh_cnn(input_shape=SHAPE)
        if streamed:
            data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
                len(x), seed=5, reshuffle_each_iteration=True
            )
            record = recipe.pretrain_backbone(
                backbone,
                data,
                None,
                tf.data.Dataset.from_tensor_slices((xv, yv)),
                num_classes=4,
                recipe=budget,
                seed=5,
            )
            assert record["key"] is None and record["num_train"] == len(x)
        else:
            recipe.pretrain_backbone(
                backbone, x, y, (xv, yv), num_classes=4, recipe=budget, seed=5
            )
        weights.append(backbone.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_a_py_dataset_and_the_cache_key_of_a_stream(pictures, tmp_path):
    (x, y), (xv, yv) = pictures
    data = _Counting(x, y, 40)
    budget = recipe.Recipe(pretrain_epochs=1, epochs=1, batch_size=32)
    keras.utils.set_random_seed(0)
    subic, summary = recipe.train_subic(
        backbones.dsh_cnn(input_shape=SHAPE),
        4,
        16,
        data,
        None,
        _Counting(xv, yv, 16),
        recipe=budget,
        cache_dir=tmp_path,
    )
    # One batch read for its types, one pass for the class count and cache
    # key, one per epoch.
    assert data.reads == 1 + 5 * 3
    assert summary["num_classes"] == 4 and summary["pretrain"]["num_train"] == 180
    assert subic.encode(xv).shape == (60, 4)
    # The stream's digest does not depend on its order: a reshuffled copy
    # finds the cached pre-training.
    order = np.random.default_rng(1).permutation(len(x))
    keras.utils.set_random_seed(0)
    again = recipe.pretrain_backbone(
        backbones.dsh_cnn(input_shape=SHAPE),
        _Counting(x[order], y[order], 40),
        None,
        _Counting(xv, yv, 16),
        recipe=budget,
        cache_dir=tmp_path,
    )
    assert again["cached"] and again["key"] == summary["pretrain"]["key"]


def test_hashing_baseline_and_validation_callback_take_streams(pictures):
    (x, y), (xv, yv) = pictures
    keras.utils.set_random_seed(0)
    dsh = build_dsh(backbones.dsh_cnn(input_shape=SHAPE), bits=12)
    pairs = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(180, seed=0)
    summary = train_hashing(
        dsh,
        pairs,
        None,
        tf.data.Dataset.from_tensor_slices((xv, yv)),
        recipe=recipe.Recipe(epochs=1, batch_size=32),
    )
    assert summary["epochs_run"] == 1 and summary["best_epoch"] == 1
    validation = callbacks.RetrievalValidation(
        dsh, tf.data.Dataset.from_tensor_slices((xv, yv)).batch(9), queries=None
    )
    assert validation.scores()["val_map"] == pytest.approx(
        callbacks.RetrievalValidation(dsh, xv, yv, queries=None).scores()["val_map"]
    )


def test_summary_matches_the_arrays_statistics(pictures):
    (x, y), _ = pictures
    data = tf.data.Dataset.from_tensor_slices((x, y))
    summary = streams.summarize(data)
    assert summary.count == 180 and summary.num_batches is None
    assert summary.steps(32) == 6 and summary.element_shape == SHAPE
    np.testing.assert_array_equal(summary.labels, y)
    for a, b in zip(datasets.channel_statistics(data), datasets.channel_statistics(x)):
        np.testing.assert_array_equal(a, b)
    batched = streams.summarize(data.batch(50))
    assert batched.num_batches == 4 and batched.digest == summary.digest
    reversed_order = tf.data.Dataset.from_tensor_slices((x[::-1], y[::-1]))
    assert streams.summarize(reversed_order).digest == summary.digest
    changed = tf.data.Dataset.from_tensor_slices((x, (y + 1) % 4))
    assert streams.summarize(changed).digest != summary.digest


def test_an_evaluated_stream_must_keep_its_order(pictures):
    (x, y), _ = pictures
    subic = recipe.build_subic(backbones.dsh_cnn(input_shape=SHAPE), 4, 16, 4)
    shuffling = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        180, seed=1, reshuffle_each_iteration=True
    )
    with pytest.raises(ValueError, match="must keep its order"):
        scoring.evaluate(subic, shuffling, None, "random", num_queries=20)
    with pytest.raises(ValueError, match="labels must be given with array inputs"):
        scoring.evaluate(subic, x, None, "random", num_queries=20)


@pytest.mark.parametrize(
    "data, labels, message",
    [
        (lambda x, y: tf.data.Dataset.from_tensor_slices(x), None, "must give"),
        (
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y.astype("float32"))),
            None,
            "labels must be integer class ids, received float32",
        ),
        (
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)),
            np.zeros(3),
            "training labels must be None when the images are a stream",
        ),
        (
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)).take(0),
            None,
            "must hold at least one example, received none",
        ),
        (
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y - 5)),
            None,
            "labels must be non-negative class ids, received -5",
        ),
        (
            lambda x, y: tf.data.Dataset.from_tensor_slices((x.astype("int32"), y)),
            None,
            "images must be uint8 pixels or float inputs, received int32",
        ),
    ],
)
def test_bad_streams_are_named(pictures, data, labels, message):
    (x, y), validation = pictures
    with pytest.raises((ValueError, TypeError), match=message):
        recipe.train_subic(
            backbones.dsh_cnn(input_shape=SHAPE),
            4,
            16,
            data(x, y),
            labels,
            validation,
            recipe=recipe.Recipe(pretrain_epochs=0, epochs=1),
        )


def test_augmenting_a_float_stream_is_refused(pictures):
    (x, y), _ = pictures
    floats = tf.data.Dataset.from_tensor_slices((x / 255, y))
    with pytest.raises(ValueError, match="augment=True needs uint8 images"):
        datasets.make_stream_dataset(floats, 8, augment=True)
    batch, labels = next(iter(datasets.make_stream_dataset(floats, 8)))
    assert batch.dtype == tf.float32 and tuple(labels.shape) == (8,)


def test_float_pictures_on_the_0_255_scale_are_refused(pictures):
    (x, y), (xv, yv) = pictures
    # keras.utils.image_dataset_from_directory's scale: floats in 0..255.
    wrong = tf.data.Dataset.from_tensor_slices((x.astype("float32"), y)).batch(32)
    with pytest.raises(
        ValueError, match=r"must be in \[0, 1\].*tf.cast\(x, tf.uint8\)"
    ):
        _train(wrong, None, (xv, yv), num_classes=4)
    streams.check_pixel_range(wrong.map(lambda a, b: (a / 255, b)))  # accepted
    features = tf.data.Dataset.from_tensor_slices(
        (np.full((8, 5), 300.0), np.zeros(8, int))
    )
    streams.check_pixel_range(features)  # feature vectors: any range


def test_an_endless_stream_is_refused_in_one_line():
    pairs = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2)
    ).repeat()
    with pytest.raises(ValueError, match="training is an endless stream"):
        recipe.check_data(pairs, None, (np.zeros((2, 8, 8, 3), np.uint8), [0, 1]))


def test_every_batch_of_float_pictures_is_range_checked():
    good = np.full((256, 4, 4, 3), 0.5, np.float32)
    pairs = tf.data.Dataset.from_tensor_slices(
        (np.concatenate([good, good[:4] * 255]), np.arange(260) % 2)
    )
    training_data.Split("training", pairs, None)  # the first batch is in [0, 1]
    batches = datasets.make_stream_dataset(pairs, 256).as_numpy_iterator()
    next(batches)
    message = re.escape(streams.PIXEL_RANGE_ERROR)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        next(batches)


def test_validation_classes_unknown_to_training_are_refused():
    x = np.zeros((6, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"classes that training does not: \[9\]"):
        recipe.check_data(x, np.arange(6) % 3, (x[:2], np.array([0, 9])))
