"""SuBiC's training loss: scaled cross-entropy and the two entropy terms.

For a mini-batch of `T` examples, block probabilities `b̃_i` (`M` blocks of
size `K`) and class probabilities `s_i` (paper Eq. 6):

    Loss = (1/T) Σ_i ℓ(s_i, y_i)
         + γ/(M log2 K) · (1/T) Σ_i E(b̃_i)      # mean block entropy
         − μ/(M log2 K) · E(b̄),  b̄ = (1/T) Σ_i b̃_i   # batch block entropy

with `ℓ(s, y) = −log2 s[y] / log2 C` and `E(p) = −Σ_k p[k] log2 p[k]` summed
over the `M` blocks. Each term is a Keras `Loss`: `ScaledCrossEntropy`,
`MeanBlockEntropyLoss`, `BatchBlockEntropyLoss`, and `SubicEntropyLoss` for the two
entropy terms on one output.

Every entropy loss returns per-example values, so Keras's own reduction and
its division by the number of replicas under `tf.distribute` apply unchanged.
The batch entropy is the same for every example of the global batch: it is
computed from `b̄` all-reduced across replicas, and its gradient through the
all-reduce is exact, so data-parallel training matches one device.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from subic_keras._validation import check_block_shape, check_int, check_non_negative

_LN2 = math.log(2.0)


def as_blocks(probs, num_blocks: int, block_size: int) -> tf.Tensor:
    """Casts to float32 and reshapes `(batch, M * K)` to `(batch, M, K)`."""
    probs = tf.cast(probs, tf.float32)
    width = probs.shape[-1]
    if width is not None and width != num_blocks * block_size:
        raise ValueError(
            "probs must have last dimension num_blocks * block_size = "
            f"{num_blocks} * {block_size} = {num_blocks * block_size}, "
            f"received {width}"
        )
    return tf.reshape(probs, (-1, num_blocks, block_size))


def entropy_bits(p: tf.Tensor) -> tf.Tensor:
    """`−Σ p log2 p` over the last axis, with `0 · log 0 = 0`.

    `xlogy` has value and gradient 0 where `p = 0`, so saturated blocks give
    finite gradients where `p * log(p)` would give `0 * -inf = nan`.
    """
    return -tf.reduce_sum(tf.math.xlogy(p, p), axis=-1) / _LN2


def block_entropy(probs, num_blocks: int, block_size: int) -> tf.Tensor:
    """Per-example block entropy in bits, `E(b̃_i) = Σ_m E(b̃_im)`.

    Example:

    >>> probs = np.full((2, 8), 0.25, "float32")  # M=2 uniform blocks of K=4
    >>> block_entropy(probs, num_blocks=2, block_size=4).numpy()
    array([4., 4.], dtype=float32)

    Args:
        probs: block probabilities `(batch, M * K)`, each block summing to one.
        num_blocks: number of blocks `M`.
        block_size: block size `K`.

    Returns:
        A float32 tensor `(batch,)` with values in `[0, M log2 K]`.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    return tf.reduce_sum(entropy_bits(as_blocks(probs, num_blocks, block_size)), -1)


def batch_block_entropy(probs, num_blocks: int, block_size: int) -> tf.Tensor:
    """Entropy in bits of the batch-averaged code, `Σ_m E(b̄_m)`.

    `b̄ = (1/T) Σ_i b̃_i` is the mean over the *global* batch: inside a
    `tf.distribute` replica context with several replicas, the per-replica
    sums and counts are all-reduced before the entropy is taken, since the
    entropy of a mean does not decompose over replicas.

    Example:

    >>> probs = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], "float32")
    >>> batch_block_entropy(probs, num_blocks=1, block_size=4).numpy().item()
    1.0

    Args:
        probs: block probabilities `(batch, M * K)`.
        num_blocks: number of blocks `M`.
        block_size: block size `K`.

    Returns:
        A float32 scalar in `[0, M log2 K]`.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    blocks = as_blocks(probs, num_blocks, block_size)
    total = tf.reduce_sum(blocks, axis=0)
    count = tf.cast(tf.shape(blocks)[0], tf.float32)
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, total)
        count = context.all_reduce(tf.distribute.ReduceOp.SUM, count)
    return tf.reduce_sum(entropy_bits(total / tf.maximum(count, 1.0)))


def _check_labels(labels: tf.Tensor, num_classes) -> tf.Tensor:
    """Rejects class labels outside `[0, C)` with a message naming them.

    Eagerly this is a `ValueError`; inside a traced `fit` step it is an
    assertion op whose `InvalidArgumentError` carries the same message.
    """
    message = f"y_true must hold class labels in [0, {num_classes}), received"
    if tf.executing_eagerly():
        values = np.asarray(labels)
        bad = values[(values < 0) | (values >= num_classes)]
        if bad.size:
            raise ValueError(f"{message} {sorted(set(bad.tolist()))[:10]}")
        return labels
    num_classes = tf.cast(num_classes, labels.dtype)
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(labels, message=message),
            tf.debugging.assert_less(labels, num_classes, message=message),
        ]
    ):
        return tf.identity(labels)


@keras.saving.register_keras_serializable(package="subic_keras")
class ScaledCrossEntropy(keras.losses.Loss):
    """Cross-entropy in units of `log2 C`: `ℓ(s, y) = −log2 s[y] / log2 C`.

    Scaling by `log2 C` makes a uniform classifier's loss 1 whatever the
    number of classes, so that it is commensurate with the entropy terms,
    themselves scaled by their maximum `M log2 K`.

    Example:

    >>> loss = ScaledCrossEntropy()
    >>> loss(np.array([0, 1]), np.full((2, 4), 0.25)).numpy().item()
    1.0

    Args:
        from_logits: whether `y_pred` holds logits rather than probabilities.
        num_classes: optional `C`; by default the width of `y_pred`.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-example losses `(batch,)` before Keras's reduction.
    """

    def __init__(
        self,
        from_logits: bool = False,
        num_classes: int | None = None,
        name: str = "scaled_cross_entropy",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.from_logits = bool(from_logits)
        self.num_classes = (
            None if num_classes is None else check_int("num_classes", num_classes, 2)
        )

    def call(self, y_true, y_pred):
        y_pred = tf.cast(y_pred, tf.float32)
        num_classes = self.num_classes or y_pred.shape[-1]
        if num_classes is None:
            num_classes = tf.shape(y_pred)[-1]
        elif y_pred.shape[-1] is not None and y_pred.shape[-1] != num_classes:
            raise ValueError(
                f"y_pred must have {num_classes} classes in its last dimension, "
                f"received shape {tuple(y_pred.shape)}"
            )
        labels = tf.cast(tf.reshape(y_true, (-1,)), tf.int32)
        labels = _check_labels(labels, num_classes)
        if self.from_logits:
            nats = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, y_pred)
        else:
            picked = tf.gather(y_pred, labels, axis=-1, batch_dims=1)
            # Clipping keeps log finite for a zero probability; the smallest
            # normal float32 keeps every unclipped value exact.
            nats = -tf.math.log(tf.clip_by_value(picked, np.finfo(np.float32).tiny, 1))
        return nats / tf.math.log(tf.cast(num_classes, tf.float32))

    def get_config(self):
        config = super().get_config()
        config.update(
            {"from_logits": self.from_logits, "num_classes": self.num_classes}
        )
        return config


class BlockEntropyLoss(keras.losses.Loss):
    """Entropy terms of SuBiC's loss; `y_true` is ignored.

    The weights are stored in non-trainable variables so that a callback
    (`subic_keras.trainers.callbacks.EntropyWarmup`) can ramp them during training
    without retracing the train step; `warmup` multiplies both.
    """

    def __init__(self, num_blocks, block_size, name, reduction, dtype):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.num_blocks, self.block_size = check_block_shape(num_blocks, block_size)
        self.max_bits = self.num_blocks * math.log2(self.block_size)
        self.warmup = tf.Variable(1.0, trainable=False, dtype=tf.float32)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if y_true is None:
            # The entropy terms need no target; Keras's base class does.
            y_true = tf.zeros(tf.shape(y_pred)[:1])
        return super().__call__(y_true, y_pred, sample_weight)

    def _scale(self, weight: float) -> tf.Tensor:
        return self.warmup * (weight / self.max_bits)

    def _mean_term(self, y_pred, gamma: float) -> tf.Tensor:
        return self._scale(gamma) * block_entropy(
            y_pred, self.num_blocks, self.block_size
        )

    def _batch_term(self, y_pred, mu: float) -> tf.Tensor:
        value = -self._scale(mu) * batch_block_entropy(
            y_pred, self.num_blocks, self.block_size
        )
        # One value per example, so that Keras's mean over the batch and its
        # 1/replicas scaling give exactly the batch term's gradient.
        return tf.fill(tf.shape(y_pred)[:1], value)

    def get_config(self):
        config = super().get_config()
        config.update({"num_blocks": self.num_blocks, "block_size": self.block_size})
        return config


@keras.saving.register_keras_serializable(package="subic_keras")
class MeanBlockEntropyLoss(BlockEntropyLoss):
    """γ-weighted mean block entropy: `γ/(M log2 K) · E(b̃_i)` per example.

    Minimising it pushes every block toward a one-hot vector.

    Example:

    >>> loss = MeanBlockEntropyLoss(num_blocks=2, block_size=4, gamma=1.0)
    >>> loss(None, np.full((3, 8), 0.25)).numpy().item()
    1.0

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        gamma: weight `γ >= 0`.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-example values `(batch,)` in `[0, γ]` before Keras's reduction.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        gamma: float = 1.0,
        name: str = "mean_block_entropy",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(num_blocks, block_size, name, reduction, dtype)
        self.gamma = check_non_negative("gamma", gamma)

    def call(self, y_true, y_pred):
        return self._mean_term(y_pred, self.gamma)

    def get_config(self):
        return {**super().get_config(), "gamma": self.gamma}


@keras.saving.register_keras_serializable(package="subic_keras")
class BatchBlockEntropyLoss(BlockEntropyLoss):
    """μ-weighted negative batch entropy: `−μ/(M log2 K) · E(b̄)`.

    Minimising it spreads the batch over all `K` bins of every block. The
    value is the same for each example; `b̄` is the global-batch mean under
    `tf.distribute` (see `batch_block_entropy`).

    Example:

    >>> loss = BatchBlockEntropyLoss(num_blocks=1, block_size=2, mu=1.0)
    >>> loss(None, np.array([[1.0, 0.0], [0.0, 1.0]])).numpy().item()
    -1.0

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        mu: weight `μ >= 0`.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-example values `(batch,)` in `[−μ, 0]` before Keras's reduction.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        mu: float = 1.0,
        name: str = "batch_block_entropy",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(num_blocks, block_size, name, reduction, dtype)
        self.mu = check_non_negative("mu", mu)

    def call(self, y_true, y_pred):
        return self._batch_term(y_pred, self.mu)

    def get_config(self):
        return {**super().get_config(), "mu": self.mu}


@keras.saving.register_keras_serializable(package="subic_keras")
class SubicEntropyLoss(BlockEntropyLoss):
    """Both entropy terms on one output: `MeanBlockEntropyLoss + BatchBlockEntropyLoss`.

    `γ/(M log2 K) · E(b̃_i) − μ/(M log2 K) · E(b̄)` per example; compile it on
    the block-probability output beside `ScaledCrossEntropy` on the class
    output to obtain SuBiC's full loss.

    Example:

    >>> loss = SubicEntropyLoss(num_blocks=2, block_size=4, gamma=1.0, mu=1.0)
    >>> one_hot = np.array([[1, 0, 0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0, 0, 0]])
    >>> loss(None, one_hot.astype("float32")).numpy().item()  # E(b̃)=0, E(b̄)=2 bits
    -0.5

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        gamma: weight `γ >= 0` of the mean block entropy.
        mu: weight `μ >= 0` of the batch block entropy.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-example values `(batch,)` in `[−μ, γ]` before Keras's reduction.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        gamma: float = 1.0,
        mu: float = 1.0,
        name: str = "subic_entropy",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(num_blocks, block_size, name, reduction, dtype)
        self.gamma = check_non_negative("gamma", gamma)
        self.mu = check_non_negative("mu", mu)

    def call(self, y_true, y_pred):
        return self._mean_term(y_pred, self.gamma) + self._batch_term(y_pred, self.mu)

    def get_config(self):
        return {**super().get_config(), "gamma": self.gamma, "mu": self.mu}


@keras.saving.register_keras_serializable(package="subic_keras")
class InstanceContrastiveLoss(BlockEntropyLoss):
    """An instance code's loss: each picture against its own altered copy.

    `y_pred` holds the block probabilities of a batch of `2B` pictures, the
    `B` first and `B` last two altered copies of the same `B` pictures
    (`subic_keras.instance.instance_code.copy_batches`). Copies `i` and `j` are compared
    by SuBiC's own score between soft codes, the expected share of equal
    blocks `s_ij = (1/M) Σ_m b̃ᵃ_im · b̃ᵇ_jm` (Eq. 10 with `b̃` for both), and
    each copy must find its pair among the batch (InfoNCE, both ways):

        L_i = −log softmax_j(s_ij / τ)[i],

    plus SuBiC's entropy terms (Eq. 8) on all `2B`: `γ` keeps each block
    one-hot, `μ` spreads the codes over the whole support. The other
    pictures of the batch are the negatives; no label is used.

    Example:

    >>> loss = InstanceContrastiveLoss(2, 4, temperature=0.1)
    >>> a, b = [1, 0, 0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0, 1]
    >>> paired = np.array([a, b, a, b], "float32")   # copies i and B + i alike
    >>> swapped = np.array([a, b, b, a], "float32")
    >>> float(loss(None, paired)) < float(loss(None, swapped))
    True

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        temperature: `τ > 0` of the softmax over the batch.
        gamma: weight `γ >= 0` of the mean block entropy.
        mu: weight `μ >= 0` of the batch block entropy.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-example values `(2B,)` before Keras's reduction.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        temperature: float = 0.1,
        gamma: float = 0.1,
        mu: float = 1.0,
        feature_weight: float = 1.0,
        name: str = "instance_contrastive",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(num_blocks, block_size, name, reduction, dtype)
        self.temperature = check_non_negative("temperature", temperature)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, received {temperature}")
        self.gamma = check_non_negative("gamma", gamma)
        self.mu = check_non_negative("mu", mu)
        self.feature_weight = check_non_negative("feature_weight", feature_weight)

    def call(self, y_true, y_pred):
        blocks = as_blocks(y_pred, self.num_blocks, self.block_size)
        flat = tf.reshape(blocks, (-1, self.num_blocks * self.block_size))
        half = tf.shape(flat)[0] // 2
        first, second = flat[:half], flat[half : 2 * half]
        # s_ij: the expected share of equal blocks between copies i and j.
        scores = tf.matmul(first, second, transpose_b=True) / self.num_blocks
        logits = scores / self.temperature
        pairs = tf.range(half)
        forward = tf.nn.sparse_softmax_cross_entropy_with_logits(pairs, logits)
        backward = tf.nn.sparse_softmax_cross_entropy_with_logits(
            pairs, tf.transpose(logits)
        )
        contrast = tf.concat([forward, backward], axis=0)
        return (
            contrast
            + self._mean_term(y_pred, self.gamma)
            + self._batch_term(y_pred, self.mu)
        )

    def get_config(self):
        return {
            **super().get_config(),
            "temperature": self.temperature,
            "gamma": self.gamma,
            "mu": self.mu,
            "feature_weight": self.feature_weight,
        }


def _info_nce(copies: tf.Tensor, scale: float) -> tf.Tensor:
    """InfoNCE both ways between the halves of `copies` `(2B, d)`: copy `i`
    of the first half must score its pair, copy `i` of the second, above
    the others (scores: dot products times `scale`)."""
    half = tf.shape(copies)[0] // 2
    first, second = copies[:half], copies[half : 2 * half]
    logits = tf.matmul(first, second, transpose_b=True) * scale
    pairs = tf.range(half)
    forward = tf.nn.sparse_softmax_cross_entropy_with_logits(pairs, logits)
    backward = tf.nn.sparse_softmax_cross_entropy_with_logits(
        pairs, tf.transpose(logits)
    )
    return tf.concat([forward, backward], axis=0)
