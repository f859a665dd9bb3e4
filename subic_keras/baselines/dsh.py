"""Deep Supervised Hashing (DSH; Liu, Wang, Shan, Chen, CVPR 2016).

A backbone is followed by a linear layer of `B` units giving relaxed codes
`u ∈ R^B`, trained on every pair of images of a mini-batch with

`L(u1, u2, s) = ½(1−s)‖u1−u2‖² + ½ s·max(m − ‖u1−u2‖², 0)
               + α(‖|u1| − 1‖₁ + ‖|u2| − 1‖₁)`,

`s = 0` for a similar pair (same class) and `1` for a dissimilar one, margin
`m = 2B`, `α = 0.01`. The codes are `sign(u)`, stored as bits `u > 0`, and
searched by Hamming distance.
"""

from __future__ import annotations

import keras
from keras import ops

from subic_keras._validation import check_int, check_non_negative
from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.data.pixels import ImageModel
from subic_keras.models.building import attach_backbone

RELAXED_CODES = "relaxed_codes"


def _check_margin(margin, bits: int) -> float:
    if margin is None:
        return 2.0 * bits
    margin = check_non_negative("margin", margin)
    if margin == 0:
        raise ValueError(f"margin must be > 0, received {margin}")
    return margin


@keras.saving.register_keras_serializable(package="subic_keras")
class DSHLoss(keras.losses.Loss):
    """DSH's pairwise loss over all pairs of a mini-batch, `y_true` = classes.

    For a batch of `T` relaxed codes `u_i` with labels `y_i`, let
    `d_ij = ‖u_i − u_j‖²`, `s_ij = [y_i ≠ y_j]`, `r_i = ‖|u_i| − 1‖₁`. The
    batch loss is the mean over the `P = T(T−1)/2` unordered pairs `i < j`
    of DSH's pair loss:

    `L = (1/P) Σ_{i<j} [½(1−s_ij) d_ij + ½ s_ij max(m − d_ij, 0)
                        + α (r_i + r_j)]`
    `  = (1/P) Σ_{i<j} [½(1−s_ij) d_ij + ½ s_ij max(m − d_ij, 0)]
         + 2α · (1/T) Σ_i r_i`,

    since every item is in `T − 1` pairs: the regulariser is, per item, twice
    the mean of `α r_i` (as in DSH, where each pair carries both items'
    terms). Self-pairs `i = j` are excluded; they would add 0 to the pair
    terms anyway.

    The loss returns per-item values `v_i = (1/(T−1)) Σ_{j≠i} L_ij`, whose
    mean over the batch (Keras's default `"sum_over_batch_size"` reduction)
    is exactly `L`; a `sample_weight` weights items as anchors. A batch of
    one item has no pair and a loss of 0.

    Under `tf.distribute`, each replica forms the pairs of its own part of
    the batch only, so the loss is the mean of the replicas' per-batch DSH
    losses, not the loss of the global batch's pairs (DSH itself is defined
    per mini-batch).

    Example:

    >>> loss = DSHLoss(bits=2, margin=4.0, alpha=0.0)
    >>> loss(np.array([0, 1]), np.array([[1.0, 1.0], [1.0, -1.0]])).numpy().item()
    0.0

    Args:
        bits: the code length `B` (the width of `y_pred`).
        margin: the margin `m > 0`; `None` for DSH's `2B`.
        alpha: the weight `α >= 0` of the regulariser pulling `|u|` to 1.
        name, reduction, dtype: as for `keras.losses.Loss`.

    Returns:
        Per-item values `(batch,)` before Keras's reduction.
    """

    def __init__(
        self,
        bits: int,
        margin: float | None = None,
        alpha: float = 0.01,
        name: str = "dsh_loss",
        reduction: str = "sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.bits = check_int("bits", bits, minimum=1)
        self.margin = _check_margin(margin, self.bits)
        self.alpha = check_non_negative("alpha", alpha)

    def call(self, y_true, y_pred):
        u = ops.cast(y_pred, "float32")
        if len(u.shape) != 2 or (u.shape[-1] is not None and u.shape[-1] != self.bits):
            raise ValueError(
                f"y_pred must have shape (batch, bits) = (batch, {self.bits}), "
                f"received shape {tuple(u.shape)}"
            )
        if len(y_true.shape) > 2 or (len(y_true.shape) == 2 and y_true.shape[1] != 1):
            raise ValueError(
                "y_true must hold one class label per item, shape (batch,) or "
                f"(batch, 1), received shape {tuple(y_true.shape)}"
            )
        labels = ops.reshape(y_true, (-1,))
        similar = ops.equal(labels[:, None], labels[None, :])
        squares = ops.sum(ops.square(u), axis=1)
        # ‖u_i‖² + ‖u_j‖² − 2⟨u_i, u_j⟩ needs T×T memory, not T×T×B; rounding
        # can make it slightly negative.
        distance = ops.maximum(
            squares[:, None] + squares[None, :] - 2.0 * ops.matmul(u, ops.transpose(u)),
            0.0,
        )
        pair = ops.where(
            similar, 0.5 * distance, 0.5 * ops.relu(self.margin - distance)
        )
        regulariser = self.alpha * ops.sum(ops.abs(ops.abs(u) - 1.0), axis=1)
        pair = pair + regulariser[:, None] + regulariser[None, :]
        size = ops.shape(u)[0]
        others = 1.0 - ops.eye(size, dtype="float32")
        count = ops.maximum(ops.cast(size, "float32") - 1.0, 1.0)
        return ops.sum(pair * others, axis=1) / count

    def get_config(self):
        config = super().get_config()
        config.update({"bits": self.bits, "margin": self.margin, "alpha": self.alpha})
        return config


class DSH(HashingNetwork):
    """A DSH network: its train model and its binary encoder.

    Build one with `build_dsh`, or rebuild it around a reloaded train model
    with `DSH.from_train_model`.

    Attributes:
        train_model: `images → u`, the relaxed codes `(batch, B)`, trained
            with `DSHLoss` on class labels.
        encoder: `images → bits`, int32 `(batch, B)`, `1` where `u > 0`.
        bits: `B`.
        margin, alpha: the loss's parameters.
        backbone: the feature extractor.

    Args:
        train_model: a model whose output layer is named `"relaxed_codes"`.
        margin: the margin `m > 0`; None for `2B`.
        alpha: the regulariser weight `α >= 0`.
    """

    def __init__(
        self, train_model: keras.Model, margin: float | None = None, alpha: float = 0.01
    ):
        super().__init__(train_model, RELAXED_CODES, threshold=0.0)
        self.margin = _check_margin(margin, self.bits)
        self.alpha = check_non_negative("alpha", alpha)

    @classmethod
    def from_train_model(cls, train_model: keras.Model) -> DSH:
        """Rebuilds the encoder around a (reloaded) train model.

        The margin and `α` are read back from the compiled `DSHLoss` when the
        model was saved compiled, and default to `2B` and 0.01 otherwise.

        Example:

        >>> build_dsh(backbones.dsh_cnn(), bits=12).train_model.save("dsh.keras")
        >>> dsh = DSH.from_train_model(keras.saving.load_model("dsh.keras"))
        >>> dsh.encode(images / 255).shape     # uint8 images `(n, 32, 32, 3)`
        (64, 12)
        """
        loss = getattr(train_model, "loss", None)
        if not isinstance(loss, DSHLoss):
            loss = None
        return cls(
            train_model,
            margin=getattr(loss, "margin", None),
            alpha=getattr(loss, "alpha", 0.01),
        )

    def loss(self) -> DSHLoss:
        """DSH's loss with this network's parameters."""
        return DSHLoss(self.bits, margin=self.margin, alpha=self.alpha)

    def compile(self, optimizer="adam", **kwargs) -> keras.Model:
        """Compiles `train_model` with `DSHLoss`.

        Args:
            optimizer: any Keras optimizer or its name. DSH's own recipe is
                SGD, learning rate 1e-3, momentum 0.9, weight decay 4e-3.
            **kwargs: passed to `keras.Model.compile` (`loss` overrides
                `DSHLoss`).

        Returns:
            The compiled `train_model`.
        """
        kwargs.setdefault("loss", self.loss())
        self.train_model.compile(optimizer=optimizer, **kwargs)
        return self.train_model


def build_dsh(
    backbone: keras.layers.Layer,
    bits: int,
    margin: float | None = None,
    alpha: float = 0.01,
    *,
    input_shape: tuple[int, ...] | None = None,
    preprocessing: keras.layers.Layer | None = None,
    optimizer="adam",
    name: str = "dsh",
) -> DSH:
    """Puts DSH's hashing layer on a backbone.

    The train graph is `backbone → Dense(B)` (linear, named
    `"relaxed_codes"`), trained with `DSHLoss` over the pairs of each batch
    (batches of 200 in DSH); the encoder thresholds `u` at 0.

    Example:

    >>> dsh = build_dsh(backbones.dsh_cnn(), bits=48)
    >>> history = dsh.train_model.fit(images / 255, labels, epochs=1, verbose=0)
    >>> bits = dsh.encode(images / 255)    # uint8 images `(n, 32, 32, 3)`
    >>> bits.shape, evaluation.hamming_scores(bits[:2], bits).shape
    ((64, 48), (2, 64))

    Args:
        backbone: a Keras model or layer mapping inputs to feature vectors
            `(batch, d)`.
        bits: the code length `B >= 1`.
        margin: the margin `m > 0`; None for DSH's `2B`.
        alpha: the regulariser weight `α >= 0`.
        input_shape: the input shape without batch dimension; required when
            the backbone does not define one.
        preprocessing: an optional layer applied to the inputs first.
        optimizer: the optimizer `train_model` is compiled with; `None`
            leaves it uncompiled.
        name: the train model's name.

    Returns:
        A `DSH` holding the train model and its encoder.
    """
    bits = check_int("bits", bits, minimum=1)
    margin = _check_margin(margin, bits)
    alpha = check_non_negative("alpha", alpha)
    inputs, features = attach_backbone(backbone, input_shape, preprocessing)
    # float32 codes under mixed precision: the loss squares them.
    relaxed = keras.layers.Dense(bits, dtype="float32", name=RELAXED_CODES)(features)
    dsh = DSH(ImageModel(inputs, relaxed, name=name), margin=margin, alpha=alpha)
    if optimizer is not None:
        dsh.compile(optimizer)
    return dsh
