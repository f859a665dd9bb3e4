"""Instance codes: SuBiC trained to find a picture itself, without labels.

The paper's third task is instance retrieval (Sec. 4, Table 4): a 64-bit
SuBiC (`M = 8, K = 256`) trained for instances rather than classes, and
searched with the same `M` additions per item. Here the instances are the
pictures themselves: each picture of a batch is seen as two copies altered
by `subic_keras.alterations`, and the code must give a copy the score of
its pair above every other picture of the batch
(`losses.InstanceContrastiveLoss`, the other pictures as negatives, as in
self-supervised copy detection), while SuBiC's entropy terms (Eq. 8) keep
its blocks one-hot and its codes spread.

The graph is `backbone → FC0 (M·K, linear) → BlockSoftmax`; a picture's
code is the `argmax` of each block, and a query is its block probabilities
`z*` (Eq. 10), searched by every index of the package as a class code is.

In use (`benchmarks/near_duplicates.py` does this on CIFAR-10):

    code = build_instance_subic(backbones.dsh_cnn(),
                                preprocessing=standardization(pictures))
    train_instance(code, pictures, epochs=20)
    index = sk.SubicIndex(code.num_blocks, code.block_size)
    index.add(code.encode(pictures))
    scores, found = index.search(code.query(copies), k=1)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from subic_keras import alterations
from subic_keras._io import atomic_path, load_keras_file
from subic_keras._validation import (
    check_block_shape,
    check_int,
    check_non_negative,
    check_pictures,
)
from subic_keras.building import attach_backbone
from subic_keras.layers import BlockSoftmax
from subic_keras.losses import InstanceContrastiveLoss
from subic_keras.pixels import ImageModel

FC0 = "fc0"
BLOCK_PROBS = "block_probs"


@dataclasses.dataclass
class InstanceSubic:
    """An instance code: the model from pictures to block probabilities.

    Attributes:
        model: the Keras model, uint8 or float pictures to `(n, M·K)` block
            probabilities (an `ImageModel`); what is trained and saved.
        num_blocks, block_size: `M` and `K`.
    """

    model: keras.Model
    num_blocks: int
    block_size: int

    @property
    def bits(self) -> int:
        return self.num_blocks * (self.block_size.bit_length() - 1)

    def query(self, pictures, batch_size: int = 512) -> np.ndarray:
        """`z*`: the block probabilities of `pictures`, float32 `(n, M·K)`."""
        return np.asarray(
            self.model.predict(pictures, batch_size=batch_size, verbose=0), np.float32
        )

    def encode(self, pictures, batch_size: int = 512) -> np.ndarray:
        """The codes of `pictures`: each block's first largest, int32 `(n, M)`."""
        probs = self.query(pictures, batch_size)
        blocks = probs.reshape(len(probs), self.num_blocks, self.block_size)
        return blocks.argmax(-1).astype(np.int32)

    def save(self, path: str | os.PathLike) -> None:
        """Saves the model as a `.keras` file (atomically)."""
        with atomic_path(path, suffix=".keras") as tmp:
            self.model.save(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstanceSubic:
        """An instance code saved by `save`.

        Raises:
            ValueError: for a file that is not an instance code's model.
        """
        model = load_keras_file(path, compile=False)
        layer = next((x for x in model.layers if isinstance(x, BlockSoftmax)), None)
        if layer is None or model.name != "instance_subic":
            raise ValueError(f"not an instance code's model: {os.fspath(path)!r}")
        return cls(model, layer.num_blocks, layer.block_size)


def build_instance_subic(
    backbone: keras.layers.Layer,
    num_blocks: int = 16,
    block_size: int = 16,
    *,
    temperature: float = 0.1,
    gamma: float = 0.1,
    mu: float = 1.0,
    input_shape: tuple[int, ...] | None = None,
    preprocessing: keras.layers.Layer | None = None,
    optimizer="adam",
) -> InstanceSubic:
    """Puts an instance code on a backbone, compiled with its loss.

    Example:

    >>> code = build_instance_subic(backbones.dsh_cnn())
    >>> code.bits, code.encode(images).shape, code.query(images).shape
    (64, (64, 16), (64, 256))

    Args:
        backbone: a Keras model or layer from pictures to feature vectors.
        num_blocks, block_size: `M` and `K`; by default 64 bits, the
            size of the paper's instance codes (Sec. 4, there `M = 8,
            K = 256`), as 16 blocks of 16: trained alike, they take far
            more distinct codes than 8 blocks of 256, whose blocks settle
            on few values, and the native scan is fastest at `K = 16`.
        temperature, gamma, mu: `losses.InstanceContrastiveLoss`'s.
        input_shape: the pictures' shape, where the backbone has none.
        preprocessing: a layer between the `[0, 1]` pictures and the
            backbone (`training.standardization(pictures)`: the channel
            statistics the backbone needs to tell pictures apart at all).
        optimizer: what `model` is compiled with; `None` leaves it as is.

    Returns:
        An `InstanceSubic`.
    """
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    check_non_negative("temperature", temperature)
    inputs, features = attach_backbone(backbone, input_shape, preprocessing)
    logits = keras.layers.Dense(num_blocks * block_size, name=FC0)(features)
    probs = BlockSoftmax(num_blocks, block_size, dtype="float32", name=BLOCK_PROBS)(
        logits
    )
    model = ImageModel(inputs, probs, name="instance_subic")
    if optimizer is not None:
        model.compile(
            optimizer=optimizer,
            loss=InstanceContrastiveLoss(
                num_blocks, block_size, temperature=temperature, gamma=gamma, mu=mu
            ),
        )
    return InstanceSubic(model, num_blocks, block_size)


def copy_batches(
    pictures: np.ndarray,
    batch_size: int,
    seed: int = 0,
    families: Sequence[str] = alterations.FAMILIES,
    repeat: bool = True,
) -> tf.data.Dataset:
    """Batches of `2 · batch_size` altered copies for `InstanceContrastiveLoss`.

    Each batch holds `batch_size` pictures drawn without replacement (a new
    order every epoch), first as one copy each, then as another: copies
    `i` and `batch_size + i` are of the same picture. Targets are zeros.

    Args:
        pictures: uint8 `(n, H, W[, C])`, `n >= batch_size >= 2`.
        batch_size: pictures a batch, `B`.
        seed: the seed of the order and of every alteration.
        families: the alteration families drawn from (`alterations`).
        repeat: cycle over the pictures for ever (`fit` with
            `steps_per_epoch`), or once.
    """
    pictures = check_pictures("pictures", pictures)
    batch_size = check_int("batch_size", batch_size, minimum=2)
    if len(pictures) < batch_size:
        raise ValueError(
            f"batch_size must be at most the number of pictures ({len(pictures)}), "
            f"received {batch_size}"
        )
    families = alterations.check_families(families)
    if pictures.ndim == 3:
        pictures = pictures[..., None]
    data = tf.data.Dataset.from_tensor_slices(
        (pictures, tf.range(len(pictures), dtype=tf.int64))
    )
    data = data.shuffle(len(pictures), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        data = data.repeat()
    # Each copy's seed: the run's seed, the picture, which copy and when
    # (a picture drawn again in a later epoch gets other copies).
    counter = tf.data.Dataset.counter()

    def copies(element, step):
        image, index = element
        image = tf.cast(image, tf.float32) / 255.0
        first = alterations.alter(image, tf.stack([seed + 2 * step, index]), families)
        second = alterations.alter(
            image, tf.stack([seed + 2 * step + 1, index]), families
        )
        return first, second

    data = tf.data.Dataset.zip((data, counter)).map(
        copies, num_parallel_calls=tf.data.AUTOTUNE
    )
    data = data.batch(batch_size, drop_remainder=True).map(
        lambda first, second: (
            tf.concat([first, second], 0),
            tf.zeros([2 * batch_size]),
        )
    )
    return data.prefetch(tf.data.AUTOTUNE)


def train_instance(
    instance: InstanceSubic,
    pictures: np.ndarray,
    *,
    epochs: int = 30,
    batch_size: int = 256,
    steps_per_epoch: int | None = None,
    seed: int = 0,
    families: Sequence[str] = alterations.FAMILIES,
    callbacks=(),
    verbose: int | str = "auto",
) -> keras.callbacks.History:
    """Trains `instance.model` on `pictures` with `model.fit`, no labels.

    Args:
        instance: from `build_instance_subic` (compiled).
        pictures: uint8 `(n, H, W[, C])` training pictures.
        epochs: passes over the pictures.
        batch_size: pictures a batch (`2 ·` that many copies).
        steps_per_epoch: batches an epoch; default one pass over `pictures`.
        seed: the seed of the order and the alterations.
        families: the alteration families trained on.
        callbacks, verbose: `fit`'s.

    Returns:
        `fit`'s `History`.
    """
    epochs = check_int("epochs", epochs, minimum=1)
    if steps_per_epoch is None:
        steps_per_epoch = max(1, len(pictures) // batch_size)
    steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, minimum=1)
    keras.utils.set_random_seed(seed)
    data = copy_batches(pictures, batch_size, seed=seed, families=families)
    return instance.model.fit(
        data,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        shuffle=False,  # `copy_batches` draws a new order every epoch
        callbacks=list(callbacks),
        verbose=verbose,
    )
