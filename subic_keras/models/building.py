"""`build_subic`: SuBiC's encoder assembled on a backbone, as the functional
train and test graphs that share its weights (paper Sec. 3).
"""

from __future__ import annotations

import keras

from subic_keras._validation import check_block_shape, check_int, check_non_negative
from subic_keras.models.layers import BlockSoftmax
from subic_keras.models.subic import BLOCK_PROBS, CLASS_PROBS, FC0, FC1, Subic, softmax
from subic_keras.models.train_model import SubicTrainModel


def attach_backbone(
    backbone: keras.layers.Layer,
    input_shape: tuple[int, ...] | None = None,
    preprocessing: keras.layers.Layer | None = None,
):
    """`(inputs, features)`: a new input through `preprocessing` and `backbone`.

    Shared by SuBiC and the hashing baselines, so that every head sits on a
    backbone the same way.

    Raises:
        TypeError: if `backbone` is not a Keras layer or model.
        ValueError: if the input shape is unknown or the backbone's output is
            not a batch of vectors.
    """
    if not isinstance(backbone, keras.layers.Layer):
        raise TypeError(
            "backbone must be a Keras model or layer, received "
            f"{type(backbone).__name__}"
        )
    if input_shape is None:
        try:
            input_shape = tuple(backbone.input_shape[1:])
        except (AttributeError, ValueError) as error:
            raise ValueError(
                f"input_shape is required for backbone {backbone.name!r}, which "
                "defines no input shape"
            ) from error
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    features = backbone(inputs if preprocessing is None else preprocessing(inputs))
    if len(features.shape) != 2:
        raise ValueError(
            "backbone must output feature vectors (batch, d), received shape "
            f"{tuple(features.shape)}; add pooling or Flatten to the backbone"
        )
    return inputs, features


def build_subic(
    backbone: keras.layers.Layer,
    num_blocks: int,
    block_size: int,
    num_classes: int,
    gamma: float = 0.3,
    mu: float = 0.3,
    *,
    input_shape: tuple[int, ...] | None = None,
    preprocessing: keras.layers.Layer | None = None,
    optimizer="adam",
    name: str = "subic",
) -> Subic:
    """Puts SuBiC's encoder and classifier on a backbone.

    The train graph is `backbone → FC0 (M·K, ReLU) → BlockSoftmax → FC1 (C,
    softmax)`, with outputs `class_probs` and `block_probs`; the test views
    (`encoder`, `query_encoder`, `classifier`, `code_classifier`) share its
    weights. Codes carry `M·log2 K` bits.

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), num_blocks=8, block_size=64,
    ...                     num_classes=10)
    >>> history = subic.train_model.fit(images, labels, epochs=1, verbose=0)
    >>> codes = subic.encode(images)    # uint8 images `(n, 32, 32, 3)`
    >>> codes.shape, codes.dtype, int(codes.max()) < 64
    ((64, 8), dtype('int32'), True)

    Images are uint8 pixels in `[0, 255]` or floats in `[0, 1]`: every model
    it builds scales uint8 itself (`subic_keras.data.pixels.ImageModel`), so uint8
    `x` gives exactly the outputs of `x.astype("float32") / 255`, in `fit`,
    `predict`, `encode`, `query` and the exported signatures.

    Args:
        backbone: a Keras model or layer mapping inputs to feature vectors
            `(batch, d)`.
        num_blocks: number of blocks `M >= 1`.
        block_size: block size `K >= 2`.
        num_classes: number of classes `C >= 2` of FC1.
        gamma: weight `γ >= 0` of the mean block entropy (Eq. 8). The paper
            uses `γ = μ = 1` (Sec. 4, chosen by cross-validating `γ/μ`); our
            default, 0.3, won a validation sweep over {0.03, 0.1, 0.3} (and
            an earlier one over {0.1, 0.3, 1, 3}) on CIFAR-10 after classifier
            pre-training, and is the setting of `subic_keras.trainers.recipe.Recipe`.
        mu: weight `μ >= 0` of the batch block entropy (Eq. 8); see `gamma`.
        input_shape: the input shape without batch dimension; required when
            the backbone does not define one.
        preprocessing: an optional layer applied to the inputs before the
            backbone (e.g. `keras.layers.Normalization` with the training
            set's channel statistics), so that the saved model and its
            exports take plain images.
        optimizer: the optimizer `train_model` is compiled with; `None`
            leaves it uncompiled.
        name: the train model's name.

    Returns:
        A `Subic` holding the train model and its views.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    gamma = check_non_negative("gamma", gamma)
    mu = check_non_negative("mu", mu)
    inputs, features = attach_backbone(backbone, input_shape, preprocessing)
    z = keras.layers.Dense(num_blocks * block_size, activation="relu", name=FC0)(
        features
    )
    # float32 block probabilities under mixed precision: their entropies
    # (Eq. 8) and codes need more than float16's 11 bits.
    soft_codes = BlockSoftmax(
        num_blocks, block_size, dtype="float32", name=BLOCK_PROBS
    )(z)
    logits = keras.layers.Dense(num_classes, name=FC1)(soft_codes)
    outputs = {CLASS_PROBS: softmax(logits, CLASS_PROBS), BLOCK_PROBS: soft_codes}
    subic = Subic(SubicTrainModel(inputs, outputs, name=name), gamma=gamma, mu=mu)
    if optimizer is not None:
        subic.compile(optimizer)
    return subic
