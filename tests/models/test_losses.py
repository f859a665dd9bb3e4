import keras
import numpy as np
import pytest
import tensorflow as tf
from reference import (
    batch_block_entropy,
    block_entropy,
    block_softmax,
    scaled_cross_entropy,
    subic_loss_terms,
)

from subic_keras import BlockSoftmax
from subic_keras.models import losses

CASES = [(1, 2, 3), (4, 16, 32), (8, 64, 16), (2, 256, 5)]


def _probs(num_blocks, block_size, batch, seed=0, scale=3.0):
    z = (
        np.random.default_rng(seed).normal(size=(batch, num_blocks * block_size))
        * scale
    )
    return block_softmax(z, num_blocks, block_size).astype("float32")


@pytest.mark.parametrize("num_blocks,block_size,batch", CASES)
def test_entropy_functions_match_reference(num_blocks, block_size, batch):
    probs = _probs(num_blocks, block_size, batch)
    np.testing.assert_allclose(
        losses.block_entropy(probs, num_blocks, block_size).numpy(),
        block_entropy(probs, num_blocks, block_size),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        losses.batch_block_entropy(probs, num_blocks, block_size).numpy(),
        batch_block_entropy(probs, num_blocks, block_size),
        rtol=1e-5,
    )


def test_entropy_of_one_hot_and_uniform_codes():
    one_hot = np.eye(4, dtype="float32")[[0, 1, 2, 3]]
    np.testing.assert_allclose(losses.block_entropy(one_hot, 1, 4).numpy(), 0.0)
    np.testing.assert_allclose(losses.batch_block_entropy(one_hot, 1, 4).numpy(), 2.0)
    uniform = np.full((2, 12), 0.25, "float32")
    np.testing.assert_allclose(losses.block_entropy(uniform, 3, 4).numpy(), 6.0)


@pytest.mark.parametrize("num_blocks,block_size,batch", CASES)
@pytest.mark.parametrize("gamma,mu", [(1.0, 1.0), (0.3, 2.5), (0.0, 1.0)])
def test_entropy_losses_match_reference(num_blocks, block_size, batch, gamma, mu):
    probs = _probs(num_blocks, block_size, batch, seed=1)
    mean_term, batch_term = subic_loss_terms(probs, num_blocks, block_size, gamma, mu)
    mean_loss = losses.MeanBlockEntropyLoss(num_blocks, block_size, gamma=gamma)
    batch_loss = losses.BatchBlockEntropyLoss(num_blocks, block_size, mu=mu)
    both = losses.SubicEntropyLoss(num_blocks, block_size, gamma=gamma, mu=mu)
    labels = np.zeros(batch)
    np.testing.assert_allclose(
        mean_loss(labels, probs).numpy(), mean_term, rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        batch_loss(None, probs).numpy(), batch_term, rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        both(None, probs).numpy(), mean_term + batch_term, rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("num_classes", [2, 10, 100])
def test_scaled_cross_entropy_matches_reference(num_classes):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(16, num_classes)).astype("float32") * 2
    probs = tf.nn.softmax(logits).numpy()
    labels = rng.integers(0, num_classes, 16)
    expected = scaled_cross_entropy(labels, probs.astype(np.float64)).mean()
    np.testing.assert_allclose(
        losses.ScaledCrossEntropy()(labels, probs).numpy(), expected, rtol=1e-5
    )
    from_logits = losses.ScaledCrossEntropy(from_logits=True)
    np.testing.assert_allclose(from_logits(labels, logits).numpy(), expected, rtol=1e-5)
    # A uniform classifier costs exactly 1, whatever C.
    uniform = np.full((3, num_classes), 1 / num_classes, "float32")
    np.testing.assert_allclose(
        losses.ScaledCrossEntropy()([0, 1, 1], uniform).numpy(), 1.0, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_finite_values_and_gradients_at_saturation(dtype):
    num_blocks, block_size = 3, 8
    rng = np.random.default_rng(3)
    z = rng.choice([-1e4, 1e4, 0.0], size=(6, num_blocks * block_size)).astype(dtype)
    z[0] = 1e4  # every entry tied at the maximum
    z[1] = -1e4
    z = tf.Variable(z)
    loss = losses.SubicEntropyLoss(num_blocks, block_size)
    for probs_fn in (
        lambda v: BlockSoftmax(num_blocks, block_size, dtype=dtype)(v),
        lambda v: tf.cast(BlockSoftmax(num_blocks, block_size)(v), dtype),
    ):
        with tf.GradientTape() as tape:
            value = loss(None, probs_fn(z))
        gradient = tape.gradient(value, z)
        assert np.isfinite(value.numpy())
        assert np.all(np.isfinite(gradient.numpy()))
    logits = tf.Variable(np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 0.0]], dtype))
    for from_logits in (True, False):
        with tf.GradientTape() as tape:
            out = logits if from_logits else tf.nn.softmax(tf.cast(logits, "float32"))
            value = losses.ScaledCrossEntropy(from_logits=from_logits)([1, 0], out)
        assert np.isfinite(value.numpy())
        assert np.all(np.isfinite(tape.gradient(value, logits).numpy()))


def test_labels_outside_range():
    probs = np.full((2, 4), 0.25, "float32")
    with pytest.raises(
        ValueError, match=r"y_true must hold class labels in \[0, 4\), received \[4\]"
    ):
        losses.ScaledCrossEntropy()(np.array([0, 4]), probs)
    with pytest.raises(ValueError, match=r"received \[-1\]"):
        losses.ScaledCrossEntropy()(np.array([-1, 0]), probs)

    @tf.function
    def traced(labels):
        return losses.ScaledCrossEntropy()(labels, probs)

    with pytest.raises(
        tf.errors.InvalidArgumentError, match="y_true must hold class labels"
    ):
        traced(tf.constant([0, 7]))


@pytest.mark.parametrize(
    "build,message",
    [
        (
            lambda: losses.MeanBlockEntropyLoss(2, 4, gamma=-1.0),
            "gamma must be a finite number >= 0, received -1.0",
        ),
        (
            lambda: losses.BatchBlockEntropyLoss(2, 4, mu=-0.5),
            "mu must be a finite number >= 0, received -0.5",
        ),
        (
            lambda: losses.SubicEntropyLoss(2, 4, mu=float("nan")),
            "mu must be a finite number >= 0",
        ),
        (lambda: losses.SubicEntropyLoss(0, 4), "num_blocks must be >= 1, received 0"),
        (lambda: losses.SubicEntropyLoss(2, 1), "block_size must be >= 2, received 1"),
        (
            lambda: losses.ScaledCrossEntropy(num_classes=1),
            "num_classes must be >= 2, received 1",
        ),
    ],
)
def test_bad_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_wrong_width():
    with pytest.raises(ValueError, match=r"2 \* 4 = 8, received 6"):
        losses.block_entropy(np.full((1, 6), 1 / 6), 2, 4)
    with pytest.raises(ValueError, match="received shape"):
        losses.ScaledCrossEntropy(num_classes=3)([0], np.full((1, 4), 0.25))


@pytest.mark.parametrize(
    "loss",
    [
        losses.ScaledCrossEntropy(from_logits=True, num_classes=7),
        losses.MeanBlockEntropyLoss(4, 16, gamma=0.5),
        losses.BatchBlockEntropyLoss(4, 16, mu=2.0),
        losses.SubicEntropyLoss(4, 16, gamma=0.5, mu=2.0),
    ],
)
def test_config_round_trip(loss):
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(loss)
    )
    assert type(clone) is type(loss)
    assert clone.get_config() == loss.get_config()


@pytest.mark.slow
@pytest.mark.xdist_group("mirrored")
def test_mirrored_strategy_matches_one_device(mirrored_checks):
    """Batch entropy on the global batch: same loss and gradients on 2 replicas."""
    result = mirrored_checks["losses"]
    assert result["replicas"] == 2
    np.testing.assert_allclose(
        result["mirrored_loss"], result["single_loss"], rtol=1e-5
    )
    np.testing.assert_allclose(
        result["mirrored_batch_term"], result["single_batch_term"], rtol=1e-5
    )
    assert result["max_gradient_difference"] <= 1e-5 * result["max_gradient"]
    # The check can fail: per-replica batch entropies would not match.
    assert (
        abs(result["per_replica_batch_entropy"] - result["global_batch_entropy"]) > 1e-3
    )
