import keras
import numpy as np
import pytest
from reference import block_entropy, block_softmax, entropy_bits

from subic_keras.models import metrics

M, K = 3, 8


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    return [
        block_softmax(rng.normal(size=(n, M * K)) * 3, M, K).astype("float32")
        for n in (5, 9)
    ]


def _stream(metric, batches):
    for batch in batches:
        metric.update_state(None, batch)
    return float(metric.result())


def test_mean_block_entropy_streams():
    batches = _batches()
    expected = block_entropy(np.concatenate(batches), M, K).mean()
    np.testing.assert_allclose(
        _stream(metrics.MeanBlockEntropy(M, K), batches), expected, rtol=1e-5
    )


def test_mean_block_entropy_sample_weight():
    probs = _batches()[0]
    weights = np.array([1, 0, 2, 0, 1], "float32")
    metric = metrics.MeanBlockEntropy(M, K)
    metric.update_state(None, probs, sample_weight=weights)
    expected = np.average(block_entropy(probs, M, K), weights=weights)
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-5)


def test_batch_block_entropy_is_entropy_of_mean_over_stream():
    batches = _batches(1)
    mean = np.concatenate(batches).reshape(-1, M, K).mean(0)
    expected = entropy_bits(mean).sum()
    np.testing.assert_allclose(
        _stream(metrics.BatchBlockEntropy(M, K), batches), expected, rtol=1e-5
    )


def test_one_hot_closeness():
    batches = _batches(2)
    blocks = np.concatenate(batches).reshape(-1, M, K)
    ordered = -np.sort(-blocks, axis=-1)
    metric = metrics.OneHotCloseness(M, K)
    np.testing.assert_allclose(
        _stream(metric, batches), ordered[:, :, 0].mean(), rtol=1e-5
    )
    np.testing.assert_allclose(
        metric.sorted_block(), ordered.reshape(-1, K).mean(0), rtol=1e-5
    )
    first = metrics.OneHotCloseness(M, K, block_index=0)
    _stream(first, batches)
    np.testing.assert_allclose(first.sorted_block(), ordered[:, 0].mean(0), rtol=1e-5)
    one_hot = np.eye(K, dtype="float32")[[1, 5]]
    ideal = metrics.OneHotCloseness(1, K)
    ideal.update_state(None, one_hot)
    np.testing.assert_allclose(ideal.sorted_block(), np.eye(K)[0])


def test_bin_usage_and_support_entropy():
    batches = _batches(3)
    codes = np.concatenate(batches).reshape(-1, M, K).argmax(-1)
    counts = np.stack([np.bincount(codes[:, m], minlength=K) for m in range(M)])
    usage = metrics.BinUsage(M, K)
    np.testing.assert_allclose(_stream(usage, batches), (counts > 0).mean(), rtol=1e-6)
    np.testing.assert_array_equal(usage.histogram(), counts)
    support = metrics.SupportEntropy(M, K)
    expected = entropy_bits(counts / counts.sum(-1, keepdims=True)).mean()
    np.testing.assert_allclose(_stream(support, batches), expected, rtol=1e-5)
    uniform = metrics.SupportEntropy(1, 4)
    uniform.update_state(None, np.eye(4, dtype="float32"))
    np.testing.assert_allclose(float(uniform.result()), 2.0)


def test_ties_count_toward_lowest_bin():
    usage = metrics.BinUsage(1, 4)
    usage.update_state(None, np.array([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]], "float32"))
    np.testing.assert_array_equal(usage.histogram(), [[1, 0, 1, 0]])


def test_reset_state():
    metric = metrics.BatchBlockEntropy(M, K)
    _stream(metric, _batches())
    metric.reset_state()
    assert float(metric.result()) == 0.0


@pytest.mark.parametrize(
    "metric",
    [
        metrics.MeanBlockEntropy(2, 16),
        metrics.BatchBlockEntropy(2, 16),
        metrics.OneHotCloseness(2, 16, block_index=1),
        metrics.BinUsage(2, 16),
        metrics.SupportEntropy(2, 16),
    ],
)
def test_config_round_trip(metric):
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(metric)
    )
    assert type(clone) is type(metric)
    assert clone.get_config() == metric.get_config()


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size must be >= 2, received 1"):
        metrics.BinUsage(2, 1)
    with pytest.raises(
        ValueError, match="block_index must be < num_blocks = 2, received 2"
    ):
        metrics.OneHotCloseness(2, 4, block_index=2)
    with pytest.raises(ValueError, match=r"2 \* 4 = 8, received 6"):
        metrics.MeanBlockEntropy(2, 4).update_state(None, np.zeros((1, 6), "float32"))
