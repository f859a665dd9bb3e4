"""SuBiC's block non-linearities: block softmax, block one-hot, block argmax.

A SuBiC code is `M` blocks of size `K`. A layer here takes inputs of width
`M * K` in which block `m` occupies columns `[m * K, (m + 1) * K)` and acts on
each block independently.
"""

from __future__ import annotations

import keras
from keras import ops

from subic_keras._validation import check_block_shape, check_width


def first_max_index(blocks):
    """Index of each block's maximum, `(..., M)` int32, ties to the lowest index.

    `argmax` kernels do not promise which of several maxima they return, and
    SuBiC's inputs meet exact ties often (ReLU zeros, saturated softmax), so
    the lowest index among the maxima is taken explicitly, with operations
    that LiteRT supports natively.

    Args:
        blocks: a tensor `(..., M, K)`.

    Returns:
        An int32 tensor `(..., M)` with values in `[0, K)`; a block without a
        maximum (holding NaN) gets `K − 1`, never an out-of-range index.
    """
    size = ops.shape(blocks)[-1]
    is_max = ops.equal(blocks, ops.max(blocks, axis=-1, keepdims=True))
    candidates = ops.where(is_max, ops.arange(size, dtype="int32"), size)
    return ops.minimum(ops.min(candidates, axis=-1), size - 1)


class _BlockLayer(keras.layers.Layer):
    """Shared state of the block layers: `(num_blocks, block_size)`."""

    def __init__(self, num_blocks: int, block_size: int, **kwargs):
        super().__init__(**kwargs)
        self.num_blocks, self.block_size = check_block_shape(num_blocks, block_size)

    def build(self, input_shape):
        check_width("inputs", input_shape[-1], self.num_blocks, self.block_size)
        super().build(input_shape)

    def _blocks(self, inputs):
        """Reshapes `(..., M * K)` to `(..., M, K)`."""
        shape = ops.shape(inputs)
        return ops.reshape(inputs, (*shape[:-1], self.num_blocks, self.block_size))

    def _flat(self, blocks):
        """Reshapes `(..., M, K)` back to `(..., M * K)`."""
        shape = ops.shape(blocks)
        return ops.reshape(blocks, (*shape[:-2], self.num_blocks * self.block_size))

    def _first_argmax(self, inputs):
        return first_max_index(self._blocks(inputs))

    def get_config(self):
        config = super().get_config()
        config.update({"num_blocks": self.num_blocks, "block_size": self.block_size})
        return config


@keras.saving.register_keras_serializable(package="subic_keras")
class BlockSoftmax(_BlockLayer):
    """Block softmax, SuBiC's training-time encoder non-linearity.

    For each block `z_m` (`K` values) of the input,

    `b̃_m = exp(z_m) / ‖exp(z_m)‖_1`,

    so every block of the output is a probability vector. The softmax is
    computed in float32 whatever the layer's dtype policy, then cast to the
    compute dtype, so that the layer is safe under `mixed_float16`.

    Example:

    >>> layer = BlockSoftmax(num_blocks=2, block_size=4)
    >>> probs = layer(np.random.rand(3, 8))
    >>> probs.shape
    TensorShape([3, 8])

    Args:
        num_blocks: number of blocks `M >= 1`.
        block_size: size `K >= 2` of each block.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Returns:
        A tensor of the input's shape whose blocks each sum to one.
    """

    def call(self, inputs):
        blocks = self._blocks(ops.cast(inputs, "float32"))
        return ops.cast(self._flat(ops.softmax(blocks, axis=-1)), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="subic_keras")
class BlockOneHot(_BlockLayer):
    """Block one-hot encoding, SuBiC's test-time binary encoder.

    For each block `z_m` of the input,

    `b_m[k] = 1 if k = argmax_r z_m[r] else 0`,

    with ties broken toward the lowest index. Because the block softmax is
    monotonic within a block, `BlockOneHot(z) = BlockOneHot(BlockSoftmax(z))`.
    The layer has no gradient (it is used at test time only) and converts to
    LiteRT with builtin operations.

    Example:

    >>> layer = BlockOneHot(num_blocks=2, block_size=3)
    >>> layer(np.array([[0.1, 0.7, 0.2, 0.5, 0.5, 0.0]]))
    <tf.Tensor: ... numpy=array([[0., 1., 0., 1., 0., 0.]], dtype=float32)>

    Args:
        num_blocks: number of blocks `M >= 1`.
        block_size: size `K >= 2` of each block.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Returns:
        A tensor of the input's shape with exactly one 1 per block.
    """

    def call(self, inputs):
        indices = self._first_argmax(inputs)
        positions = ops.arange(self.block_size, dtype="int32")
        one_hot = ops.equal(ops.expand_dims(indices, -1), positions)
        return ops.cast(self._flat(one_hot), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="subic_keras")
class BlockArgmax(_BlockLayer):
    """Integer SuBiC codes: the index of the active entry of each block.

    `c_m = argmax_r z_m[r]`, ties broken toward the lowest index, so that
    `BlockOneHot(z)` is the one-hot expansion of `c`. These `M` integers in
    `[0, K)` are the form in which codes are stored and indexed
    (`M * log2 K` bits when bit-packed).

    Example:

    >>> layer = BlockArgmax(num_blocks=2, block_size=3)
    >>> layer(np.array([[0.1, 0.7, 0.2, 0.5, 0.5, 0.0]]))
    <tf.Tensor: ... numpy=array([[1, 0]], dtype=int32)>

    Args:
        num_blocks: number of blocks `M >= 1`.
        block_size: size `K >= 2` of each block.
        **kwargs: base layer keyword arguments (`name`, ...).

    Returns:
        An int32 tensor of shape `(..., M)`.
    """

    def call(self, inputs):
        return self._first_argmax(inputs)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_blocks)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="int32")
