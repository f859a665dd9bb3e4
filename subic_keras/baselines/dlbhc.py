"""Deep Learning of Binary Hash Codes (DLBHC; Lin, Yang, Hsiao, Chen, 2015).

A latent layer of `B` sigmoid units is inserted between a backbone and its
classifier, `backbone → Dense(B, sigmoid) → Dense(C, softmax)`, and the
network is trained with the ordinary cross-entropy. The code of an image is
its latent activation thresholded at one half, `h = [sigmoid(·) > 0.5]`,
searched by Hamming distance.
"""

from __future__ import annotations

import keras

from subic_keras._validation import check_int
from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.data.pixels import ImageModel
from subic_keras.models.building import attach_backbone

LATENT = "latent"
LOGITS = "logits"
CLASS_PROBS = "class_probs"


class DLBHC(HashingNetwork):
    """A DLBHC network: its classifier (the train model) and its encoder.

    Attributes:
        train_model: `images → class probabilities`, trained with sparse
            categorical cross-entropy.
        encoder: `images → bits`, int32 `(batch, B)`, `1` where the latent
            sigmoid exceeds 0.5.
        bits: `B`.
        num_classes: `C`.
        backbone: the feature extractor.

    Args:
        train_model: a model with a `"latent"` layer and a `"logits"` layer,
            as built by `build_dlbhc`.
    """

    def __init__(self, train_model: keras.Model):
        super().__init__(train_model, LATENT, threshold=0.5, head=(LOGITS, CLASS_PROBS))
        try:
            self.num_classes = int(train_model.get_layer(LOGITS).units)
        except ValueError as error:
            raise ValueError(
                f"train_model must have a layer named {LOGITS!r}, received "
                f"layers {[layer.name for layer in train_model.layers]}"
            ) from error

    @classmethod
    def from_train_model(cls, train_model: keras.Model) -> DLBHC:
        """Rebuilds the encoder around a (reloaded) train model."""
        return cls(train_model)

    def compile(self, optimizer="adam", **kwargs) -> keras.Model:
        """Compiles `train_model` with cross-entropy and accuracy.

        Args:
            optimizer: any Keras optimizer or its name.
            **kwargs: passed to `keras.Model.compile` (`loss` and `metrics`
                override the defaults).

        Returns:
            The compiled `train_model`.
        """
        kwargs.setdefault("loss", keras.losses.SparseCategoricalCrossentropy())
        kwargs.setdefault(
            "metrics", [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        )
        self.train_model.compile(optimizer=optimizer, **kwargs)
        return self.train_model


def build_dlbhc(
    backbone: keras.layers.Layer,
    bits: int,
    num_classes: int,
    *,
    input_shape: tuple[int, ...] | None = None,
    preprocessing: keras.layers.Layer | None = None,
    optimizer="adam",
    name: str = "dlbhc",
) -> DLBHC:
    """Puts DLBHC's latent hashing layer and a classifier on a backbone.

    `backbone → Dense(B, sigmoid) ("latent") → Dense(C) ("logits") →
    softmax ("class_probs")`; codes are `latent > 0.5`.

    Example:

    >>> dlbhc = build_dlbhc(backbones.dsh_cnn(), bits=48, num_classes=10)
    >>> history = dlbhc.train_model.fit(images / 255, labels, epochs=1, verbose=0)
    >>> bits = dlbhc.encode(images / 255)    # uint8 images `(n, 32, 32, 3)`
    >>> bits.shape, sorted(np.unique(bits).tolist()) in ([0, 1], [0], [1])
    ((64, 48), True)

    Args:
        backbone: a Keras model or layer mapping inputs to feature vectors
            `(batch, d)`.
        bits: the code length `B >= 1`.
        num_classes: `C >= 2`.
        input_shape: the input shape without batch dimension; required when
            the backbone does not define one.
        preprocessing: an optional layer applied to the inputs first.
        optimizer: the optimizer `train_model` is compiled with; `None`
            leaves it uncompiled.
        name: the train model's name.

    Returns:
        A `DLBHC` holding the train model and its encoder.
    """
    bits = check_int("bits", bits, minimum=1)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    inputs, features = attach_backbone(backbone, input_shape, preprocessing)
    latent = keras.layers.Dense(bits, activation="sigmoid", name=LATENT)(features)
    logits = keras.layers.Dense(num_classes, name=LOGITS)(latent)
    # float32 class probabilities under mixed precision, as Keras advises.
    probs = keras.layers.Activation("softmax", dtype="float32", name=CLASS_PROBS)(
        logits
    )
    dlbhc = DLBHC(ImageModel(inputs, probs, name=name))
    if optimizer is not None:
        dlbhc.compile(optimizer)
    return dlbhc
