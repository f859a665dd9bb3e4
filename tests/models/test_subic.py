import keras
import numpy as np
import pytest
import tensorflow as tf

from subic_keras import Subic, SubicIndex, SubicTrainModel, build_subic
from subic_keras.data import datasets
from subic_keras.models import backbones, losses

M, K, C = 4, 8, 5


def _mlp(name="mlp"):
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(16),
        ],
        name=name,
    )


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 12)).astype("float32"), rng.integers(0, C, n)


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    subic = build_subic(_mlp(), M, K, C, gamma=0.5, mu=2.0)
    x, y = _data()
    subic.train_model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    return subic, x


def test_views_share_weights_and_agree(trained):
    subic, x = trained
    z = subic.query_encoder.predict(x, verbose=0)
    codes = subic.encoder.predict(x, verbose=0)
    assert z.shape == (len(x), M * K) and codes.shape == (len(x), M)
    assert codes.dtype == np.int32 and np.all(z >= 0)
    np.testing.assert_array_equal(codes, z.reshape(-1, M, K).argmax(-1))
    one_hot = np.eye(K, dtype="float32")[codes].reshape(len(x), -1)
    np.testing.assert_allclose(
        subic.classifier.predict(x, verbose=0),
        subic.code_classifier.predict(one_hot, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )
    shared = {id(v) for v in subic.train_model.weights}
    for view in (subic.query_encoder, subic.encoder, subic.classifier):
        assert {id(v) for v in view.weights} <= shared
    assert {id(v) for v in subic.code_classifier.weights} <= shared
    outputs = subic.train_model.predict(x, verbose=0)
    assert set(outputs) == {"class_probs", "block_probs"}
    np.testing.assert_allclose(outputs["class_probs"].sum(-1), 1.0, rtol=1e-5)


def test_class_posterior_query_scores_codes_by_fc1_logits(trained):
    subic, x = trained
    kernel, bias = subic.train_model.get_layer("fc1").get_weights()
    posterior = subic.train_model.predict(x, verbose=0)["class_probs"]
    query = subic.query(x, kind="class_posterior")
    assert query.shape == (len(x), M * K) and query.dtype == np.float32
    np.testing.assert_allclose(query, posterior @ kernel.T, rtol=1e-5, atol=1e-6)
    # qᵀb = Σ_c s_c (W₁ᵀ b)_c: FC1's logits of each stored code, averaged over
    # the query's posterior, up to a constant per query (the bias term).
    codes = subic.encode(x)
    one_hot = np.eye(K, dtype="float32")[codes].reshape(len(x), -1)
    logits = one_hot @ kernel + bias
    expected = posterior @ logits.T - (posterior @ bias)[:, None]
    np.testing.assert_allclose(query @ one_hot.T, expected, rtol=1e-4, atol=1e-5)
    index = SubicIndex(M, K)
    index.add(codes)
    scores, ids = index.search(query[:3], k=len(x))
    np.testing.assert_allclose(
        scores, np.take_along_axis(expected[:3], ids, axis=1), rtol=1e-4, atol=1e-5
    )
    shared = {id(v) for v in subic.train_model.weights}
    assert {id(v) for v in subic.class_query_encoder.weights} <= shared
    np.testing.assert_array_equal(
        subic.query(x), subic.query_encoder.predict(x, batch_size=256, verbose=0)
    )
    with pytest.raises(ValueError, match="kind must be one of .* received 'z'"):
        subic.query(x, kind="z")


def test_fit_logs_losses_and_code_metrics(trained):
    subic, x = trained
    _, y = _data()
    logs = subic.train_model.evaluate(x, y, verbose=0, return_dict=True)
    for name in (
        "class_probs_loss",
        "block_probs_loss",
        "class_probs_accuracy",
        "block_probs_mean_block_entropy",
        "block_probs_batch_block_entropy",
        "block_probs_one_hot_closeness",
        "block_probs_bin_usage",
        "block_probs_support_entropy",
    ):
        assert np.isfinite(logs[name]), name
    assert 0 <= logs["block_probs_mean_block_entropy"] <= M * np.log2(K)
    # The compiled loss is the sum of the terms (SPEC.md's Loss).
    np.testing.assert_allclose(
        logs["loss"], logs["class_probs_loss"] + logs["block_probs_loss"], rtol=1e-4
    )


def test_keras_round_trip(trained, tmp_path):
    subic, x = trained
    path = str(tmp_path / "subic.keras")
    subic.train_model.save(path)
    reloaded = keras.saving.load_model(path)  # no custom_objects
    assert isinstance(reloaded, SubicTrainModel)
    again = Subic.from_train_model(reloaded)
    assert (again.num_blocks, again.block_size, again.num_classes) == (M, K, C)
    assert (again.gamma, again.mu) == (0.5, 2.0)
    for name in ("query_encoder", "encoder", "classifier"):
        np.testing.assert_array_equal(
            getattr(again, name).predict(x, verbose=0),
            getattr(subic, name).predict(x, verbose=0),
        )
    _, y = _data()
    reloaded.fit(x, y, epochs=1, verbose=0)


def test_training_modes():
    subic = build_subic(_mlp(), M, K, C)
    x, y = _data()
    everything = len(subic.train_model.trainable_weights)
    subic.set_training_mode("2-layer")
    assert len(subic.train_model.trainable_weights) == 4  # FC0 and FC1
    frozen = [w.numpy() for w in subic.backbone.weights]
    subic.train_model.fit(x, y, epochs=1, verbose=0)
    for before, after in zip(frozen, subic.backbone.weights):
        np.testing.assert_array_equal(before, after.numpy())
    subic.set_training_mode("3-layer")
    assert len(subic.train_model.trainable_weights) == 6
    last = subic.backbone.layers[-1].kernel.numpy()
    first = subic.backbone.layers[0].kernel.numpy()
    subic.train_model.fit(x, y, epochs=1, verbose=0)
    assert not np.array_equal(last, subic.backbone.layers[-1].kernel.numpy())
    np.testing.assert_array_equal(first, subic.backbone.layers[0].kernel.numpy())
    subic.set_training_mode("full")
    assert len(subic.train_model.trainable_weights) == everything
    with pytest.raises(ValueError, match="mode must be one of"):
        subic.set_training_mode("1-layer")
    features = build_subic(backbones.feature_input(12), M, K, C)
    with pytest.raises(ValueError, match="3-layer training needs a backbone"):
        features.set_training_mode("3-layer")


def test_preprocessing_layer_is_not_the_backbone():
    norm = keras.layers.Normalization(mean=np.zeros(12), variance=np.ones(12))
    subic = build_subic(_mlp("trunk"), M, K, C, preprocessing=norm)
    assert subic.backbone.name == "trunk"
    subic.set_training_mode("2-layer")
    assert len(subic.train_model.trainable_weights) == 4


def test_mixed_precision_training_step():
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        subic = build_subic(_mlp(), M, K, C)
        x, y = _data()
        history = subic.train_model.fit(x, y, epochs=1, verbose=0)
        codes = subic.encoder.predict(x, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    assert np.isfinite(history.history["loss"][0])
    assert codes.dtype == np.int32 and codes.max() < K


def test_labels_outside_classes_fail_in_fit():
    subic = build_subic(_mlp(), M, K, C)
    x, _ = _data(8)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"y_true must hold class labels in \[0, 5\)",
    ):
        subic.train_model.fit(x, np.full(8, C), epochs=1, verbose=0)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"num_blocks": 0}, ValueError, "num_blocks must be >= 1, received 0"),
        ({"block_size": 1}, ValueError, "block_size must be >= 2, received 1"),
        ({"num_classes": 1}, ValueError, "num_classes must be >= 2, received 1"),
        ({"num_classes": 3.0}, TypeError, "num_classes must be an integer"),
        (
            {"gamma": -1.0},
            ValueError,
            "gamma must be a finite number >= 0, received -1.0",
        ),
        ({"mu": -2}, ValueError, "mu must be a finite number >= 0, received -2.0"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    arguments = {"num_blocks": M, "block_size": K, "num_classes": C, **kwargs}
    with pytest.raises(error, match=message):
        build_subic(_mlp(), **arguments)


def test_bad_backbones():
    with pytest.raises(
        TypeError, match="backbone must be a Keras model or layer, received str"
    ):
        build_subic("resnet", M, K, C)
    with pytest.raises(ValueError, match="input_shape is required"):
        build_subic(keras.layers.Dense(8), M, K, C)
    conv = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3)])
    with pytest.raises(
        ValueError,
        match=r"feature vectors \(batch, d\), received shape \(None, 6, 6, 4\)",
    ):
        build_subic(conv, M, K, C)
    with pytest.raises(ValueError, match="must be a SuBiC train model"):
        Subic(_mlp())


def test_one_epoch_on_cifar10_subset_lowers_training_loss(shared_data_dir):
    (x, y), _ = datasets.load_cifar10(
        shared_data_dir / "cifar-10-batches-bin", max_per_split=2000
    )
    keras.utils.set_random_seed(0)
    mean, std = datasets.channel_statistics(x)
    norm = keras.layers.Normalization(mean=mean, variance=std**2)
    subic = build_subic(
        backbones.dsh_cnn(), 8, 64, 10, preprocessing=norm, optimizer=None
    )
    subic.compile(keras.optimizers.Adam(1e-3))
    data = datasets.make_dataset(x, y, 100)
    before = subic.train_model.evaluate(data, verbose=0, return_dict=True)
    subic.train_model.fit(
        datasets.make_dataset(x, y, 100, shuffle=True),
        epochs=1,
        verbose=0,
        shuffle=False,
    )
    after = subic.train_model.evaluate(data, verbose=0, return_dict=True)
    assert after["loss"] < before["loss"] - 0.01, (before["loss"], after["loss"])
    assert after["class_probs_loss"] < before["class_probs_loss"]


def test_losses_compile_alone_on_a_custom_model():
    inputs = keras.Input((12,))
    soft = keras.layers.Dense(M * K)(inputs)
    from subic_keras import BlockSoftmax

    probs = BlockSoftmax(M, K)(soft)
    model = keras.Model(inputs, probs)
    model.compile("sgd", loss=losses.SubicEntropyLoss(M, K))
    x, _ = _data()
    history = model.fit(x, np.zeros(len(x)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_code_statistics_describe_the_codes_of_images():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(40, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=40)
    backbone = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten()])
    subic = build_subic(backbone, num_blocks=2, block_size=4, num_classes=3)
    stats = subic.code_statistics(images, labels)
    codes = subic.encode(images / 255)
    used = [len(np.unique(codes[:, m])) for m in range(2)]
    assert stats["bins_used_per_block"] == used
    assert stats["first_block_bins_used"] == used[0]
    assert sum(stats["first_block_support_sorted"]) == 40
    assert stats["sorted_first_block"] == sorted(stats["sorted_first_block"])[::-1]
    assert sum(stats["sorted_first_block"]) == pytest.approx(1.0, abs=1e-5)
    assert 0.0 <= stats["mean_block_entropy_bits"] <= 2 * 2
    assert 0.0 <= stats["support_entropy_bits"] <= 2
    assert 0.0 <= stats["accuracy_binary"] <= 1.0
    assert "accuracy_soft" in stats
    assert "accuracy_soft" not in subic.code_statistics(images)
    with pytest.raises(ValueError, match=r"labels must have shape \(40,\)"):
        subic.code_statistics(images, labels[:5])


def test_encode_and_query_take_uint8_as_x_over_255():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(30, 8, 8, 3), dtype=np.uint8)
    backbone = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten()])
    subic = build_subic(backbone, num_blocks=3, block_size=8, num_classes=2)
    scaled = images.astype("float32") / 255
    np.testing.assert_array_equal(subic.encode(images), subic.encode(scaled))
    np.testing.assert_allclose(subic.query(images), subic.query(scaled), rtol=1e-6)
    assert subic.encode(images[:0]).shape == (0, 3)
    assert subic.query(images[:0]).shape == (0, 24)
    bad = scaled.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="images must be finite, received 1 NaN"):
        subic.encode(bad)
    with pytest.raises(
        ValueError, match=r"shape \(n, 8, 8, 3\), received \(30, 8, 8\)"
    ):
        subic.query(scaled[..., 0])


def test_encode_and_query_take_a_tf_data_pipeline():
    import tensorflow as tf

    from subic_keras.models import backbones
    from subic_keras.models.building import build_subic

    subic = build_subic(backbones.dsh_cnn(), 4, 16, 3)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(37, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=37)
    codes, queries = subic.encode(images), subic.query(images, kind="fc0")
    # Pairs, unbatched; images alone, batched; floats in [0, 1].
    pairs = tf.data.Dataset.from_tensor_slices((images, labels))
    np.testing.assert_array_equal(subic.encode(pairs, batch_size=8), codes)
    batched = tf.data.Dataset.from_tensor_slices(images).batch(5)
    # Other batch sizes take other kernels: equal up to float32 rounding.
    np.testing.assert_allclose(subic.query(batched, kind="fc0"), queries, atol=1e-5)
    floats = tf.data.Dataset.from_tensor_slices(images.astype("float32") / 255)
    np.testing.assert_array_equal(subic.encode(floats), codes)
    with pytest.raises(
        ValueError, match=r"shape \(32, 32, 3\).*received .*\(16, 16, 3\)"
    ):
        subic.encode(tf.data.Dataset.from_tensor_slices(images[:, :16, :16]))
    with pytest.raises(TypeError, match="uint8 pixels or floats.*int32"):
        subic.encode(tf.data.Dataset.from_tensor_slices(images.astype("int32")))


def test_a_first_small_encoding_traces_no_function_and_gives_the_same_codes():
    keras.utils.set_random_seed(3)
    subic = build_subic(_mlp(), M, K, C)
    x, _ = _data(40)
    first = subic.encode(x)  # one batch of 40: no function traced
    assert subic.encoder.predict_function is None
    second = subic.encode(x)  # called again: through `Model.predict`
    assert subic.encoder.predict_function is not None
    np.testing.assert_array_equal(first, second)
    # More rows than a batch: `Model.predict`, a batch at a time.
    fresh = build_subic(_mlp(), M, K, C)
    fresh.query(x, batch_size=16)
    assert fresh.query_encoder.predict_function is not None
