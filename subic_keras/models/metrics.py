"""Streaming metrics of how binary-like and how well spread SuBiC codes are.

All metrics take the block probabilities `b̃` (`(batch, M * K)`) as `y_pred`
and ignore `y_true`, so they can be compiled on a model's block output. Their
states are sums, so they aggregate exactly across batches and replicas.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from subic_keras._validation import check_block_shape, check_int
from subic_keras.models.layers import first_max_index
from subic_keras.models.losses import as_blocks, block_entropy, entropy_bits


class _BlockMetric(keras.metrics.Metric):
    """Shared `(num_blocks, block_size)` state and config."""

    def __init__(self, num_blocks: int, block_size: int, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.num_blocks, self.block_size = check_block_shape(num_blocks, block_size)

    def _blocks(self, y_pred) -> tf.Tensor:
        return as_blocks(y_pred, self.num_blocks, self.block_size)

    def get_config(self):
        config = super().get_config()
        config.update({"num_blocks": self.num_blocks, "block_size": self.block_size})
        return config


@keras.saving.register_keras_serializable(package="subic_keras")
class MeanBlockEntropy(_BlockMetric):
    """Mean over examples of the code entropy `E(b̃_i) = Σ_m E(b̃_im)`, in bits.

    `0` when every block is one-hot; at most `M log2 K`.

    Example:

    >>> metric = MeanBlockEntropy(num_blocks=2, block_size=4)
    >>> metric.update_state(None, np.full((3, 8), 0.25))
    >>> float(metric.result())
    4.0

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        name, dtype: as for `keras.metrics.Metric`.

    Returns:
        `result()`: a scalar, the mean code entropy in bits.
    """

    def __init__(self, num_blocks, block_size, name="mean_block_entropy", dtype=None):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = block_entropy(y_pred, self.num_blocks, self.block_size)
        weights = tf.ones_like(values)
        if sample_weight is not None:
            weights = tf.reshape(tf.cast(sample_weight, values.dtype), (-1,))
        self.total.assign_add(tf.reduce_sum(values * weights))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self):
        return tf.math.divide_no_nan(self.total, self.count)


@keras.saving.register_keras_serializable(package="subic_keras")
class BatchBlockEntropy(_BlockMetric):
    """Entropy in bits of the mean code over every example seen, `Σ_m E(b̄_m)`.

    The streaming version of the loss's batch entropy: `b̄` is the average of
    `b̃` over all examples since the last reset (an epoch, or an evaluation
    set), so it measures how evenly the set uses each block's `K` bins.
    At most `M log2 K` (uniform usage).

    Example:

    >>> metric = BatchBlockEntropy(num_blocks=1, block_size=2)
    >>> metric.update_state(None, np.array([[1.0, 0.0]]))
    >>> metric.update_state(None, np.array([[0.0, 1.0]]))
    >>> float(metric.result())
    1.0

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        name, dtype: as for `keras.metrics.Metric`.

    Returns:
        `result()`: a scalar, the entropy of the mean code in bits.
    """

    def __init__(self, num_blocks, block_size, name="batch_block_entropy", dtype=None):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)
        self.total = self.add_variable(
            shape=(self.num_blocks, self.block_size), initializer="zeros", name="total"
        )
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        blocks = self._blocks(y_pred)
        self.total.assign_add(tf.reduce_sum(blocks, axis=0))
        self.count.assign_add(tf.cast(tf.shape(blocks)[0], self.dtype))

    def result(self):
        mean = tf.math.divide_no_nan(self.total, self.count)
        return tf.reduce_sum(entropy_bits(mean))


@keras.saving.register_keras_serializable(package="subic_keras")
class OneHotCloseness(_BlockMetric):
    """How close blocks are to one-hot: the sorted-and-averaged block.

    Each block `b̃_m` is sorted in decreasing order and the sorted vectors are
    averaged over examples (and over blocks, unless `block_index` selects
    one), as in the paper's Fig. 3 (left); the ideal is `[1, 0, ..., 0]`.
    `result()` is its first entry, the mean largest probability; the whole
    averaged vector is `sorted_block()`.

    Example:

    >>> metric = OneHotCloseness(num_blocks=1, block_size=3)
    >>> metric.update_state(None, np.array([[0.2, 0.7, 0.1]]))
    >>> metric.sorted_block()
    array([0.7, 0.2, 0.1], dtype=float32)

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        block_index: a block `m` in `[0, M)` to track alone; `None` averages
            all blocks.
        name, dtype: as for `keras.metrics.Metric`.

    Returns:
        `result()`: a scalar in `[1/K, 1]`.
    """

    def __init__(
        self,
        num_blocks,
        block_size,
        block_index: int | None = None,
        name="one_hot_closeness",
        dtype=None,
    ):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)
        if block_index is not None:
            block_index = check_int("block_index", block_index, minimum=0)
            if block_index >= self.num_blocks:
                raise ValueError(
                    f"block_index must be < num_blocks = {self.num_blocks}, "
                    f"received {block_index}"
                )
        self.block_index = block_index
        self.total = self.add_variable(
            shape=(self.block_size,), initializer="zeros", name="total"
        )
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        blocks = self._blocks(y_pred)
        if self.block_index is not None:
            blocks = blocks[:, self.block_index : self.block_index + 1]
        ordered = tf.sort(blocks, axis=-1, direction="DESCENDING")
        ordered = tf.reshape(ordered, (-1, self.block_size))
        self.total.assign_add(tf.reduce_sum(ordered, axis=0))
        self.count.assign_add(tf.cast(tf.shape(ordered)[0], self.dtype))

    def sorted_block(self) -> np.ndarray:
        """The averaged, sorted block `(K,)`, as a NumPy array."""
        return np.asarray(tf.math.divide_no_nan(self.total, self.count))

    def result(self):
        return tf.math.divide_no_nan(self.total[0], self.count)

    def get_config(self):
        return {**super().get_config(), "block_index": self.block_index}


class _SupportHistogram(_BlockMetric):
    """Counts, per block, how often each bin is the active one of `b`."""

    def __init__(self, num_blocks, block_size, name=None, dtype=None):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)
        self.counts = self.add_variable(
            shape=(self.num_blocks, self.block_size), initializer="zeros", name="counts"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        blocks = self._blocks(y_pred)
        one_hot = tf.one_hot(first_max_index(blocks), self.block_size, dtype=self.dtype)
        self.counts.assign_add(tf.reduce_sum(one_hot, axis=0))

    def histogram(self) -> np.ndarray:
        """The support counts `(M, K)` of the binary codes seen so far."""
        return np.asarray(self.counts)


@keras.saving.register_keras_serializable(package="subic_keras")
class BinUsage(_SupportHistogram):
    """Fraction of the `K` bins of each block that some code uses.

    The binary code `b = BlockOneHot(b̃)` of every example is counted into a
    per-block support histogram; `result()` is the fraction of non-empty bins
    averaged over blocks (1 when every bin of every block is used).

    Example:

    >>> metric = BinUsage(num_blocks=1, block_size=4)
    >>> metric.update_state(None, np.array([[0.9, 0.1, 0, 0], [0.2, 0.8, 0, 0]]))
    >>> float(metric.result())
    0.5

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        name, dtype: as for `keras.metrics.Metric`.

    Returns:
        `result()`: a scalar in `[1/K, 1]`.
    """

    def __init__(self, num_blocks, block_size, name="bin_usage", dtype=None):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)

    def result(self):
        used = tf.cast(self.counts > 0, self.dtype)
        return tf.reduce_mean(tf.reduce_mean(used, axis=-1))


@keras.saving.register_keras_serializable(package="subic_keras")
class SupportEntropy(_SupportHistogram):
    """Entropy of the binarised support histogram, in bits, averaged over blocks.

    The per-block histogram of active bins of `b` (see `BinUsage`) is
    normalised and its entropy taken; the ideal, uniform usage of the `K`
    bins, gives `log2 K` (the paper's Fig. 3, right).

    Example:

    >>> metric = SupportEntropy(num_blocks=1, block_size=4)
    >>> metric.update_state(None, np.eye(4))
    >>> float(metric.result())
    2.0

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.
        name, dtype: as for `keras.metrics.Metric`.

    Returns:
        `result()`: a scalar in `[0, log2 K]`.
    """

    def __init__(self, num_blocks, block_size, name="support_entropy", dtype=None):
        super().__init__(num_blocks, block_size, name=name, dtype=dtype)

    def result(self):
        totals = tf.reduce_sum(self.counts, axis=-1, keepdims=True)
        return tf.reduce_mean(entropy_bits(tf.math.divide_no_nan(self.counts, totals)))


def subic_metrics(num_blocks: int, block_size: int) -> list[keras.metrics.Metric]:
    """The four code metrics, ready for `compile(metrics={"block_probs": ...})`.

    Args:
        num_blocks: number of blocks `M`.
        block_size: block size `K`.

    Returns:
        `[MeanBlockEntropy, BatchBlockEntropy, OneHotCloseness, BinUsage,
        SupportEntropy]` instances.
    """
    return [
        MeanBlockEntropy(num_blocks, block_size),
        BatchBlockEntropy(num_blocks, block_size),
        OneHotCloseness(num_blocks, block_size),
        BinUsage(num_blocks, block_size),
        SupportEntropy(num_blocks, block_size),
    ]
