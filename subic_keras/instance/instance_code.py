"""Instance codes: SuBiC trained to find a picture itself, without labels.

The paper's third task is instance retrieval (Sec. 4, Table 4): a 64-bit
SuBiC (`M = 8, K = 256`) trained for instances rather than classes, and
searched with the same `M` additions per item (here 256 bits by default,
64 blocks of 16: `build_instance_subic`). Here the instances are the
pictures themselves: each picture of a batch is seen as two copies altered
by `subic_keras.instance.alterations`, and the code must give a copy the score of
its pair above every other picture of the batch
(`losses.InstanceContrastiveLoss`, the other pictures as negatives, as in
self-supervised copy detection), while SuBiC's entropy terms (Eq. 8) keep
its blocks one-hot and its codes spread.

The graph is `backbone → FC0 (M·K, linear) → BlockSoftmax`; a picture's
code is the `argmax` of each block. A query is FC0's real-valued outputs
`l`, as the paper's query is its encoder's (Eq. 10), searched by every
index of the package as a class code is: an item's score `sum_m l_m[c_m]`
is the log-likelihood of its code under the query's block probabilities
`z* = softmax(l_m)` (up to a constant of the query), so a copy must be
likely in every block. Ranked by `sum_m z*_m[c_m]` instead, a code that
matches most blocks and is impossible in one can outrank the original:
on CIFAR-10 copies altered by the whole family the log-likelihood finds
the original first for 0.726 of the queries among 10,000 pictures, the
sum of probabilities for 0.693 (`benchmarks/near_duplicates.py`).

In use (`benchmarks/near_duplicates.py` does this on CIFAR-10):

    code = build_instance_subic(backbones.dsh_cnn(),
                                preprocessing=standardization(pictures))
    train_instance(code, pictures)
    index = sk.SubicIndex(code.num_blocks, code.block_size)
    index.add(code.encode(pictures))
    scores, found = index.search(code.query(copies), k=1)

`pretrained()` loads the instance code that ships with the package (the
command line's `instance`), `train_on_folder` fine-tunes one on a folder's
pictures, and `subic_keras.instance.copies` says which results are copies.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from subic_keras._io import atomic_path, load_keras_file
from subic_keras._validation import (
    check_block_shape,
    check_int,
    check_non_negative,
    check_pictures,
)
from subic_keras.data.pixels import ImageModel
from subic_keras.instance import alterations
from subic_keras.models.building import attach_backbone
from subic_keras.models.layers import BlockSoftmax
from subic_keras.models.losses import InstanceContrastiveLoss
from subic_keras.models.prediction import predict
from subic_keras.models.subic import BLOCK_PROBS, FC0, check_model_inputs
from subic_keras.pretrained import path as pretrained_path

SCHEDULES = ("cosine", "constant")
# The name of an instance code's Keras model.
NAME = "instance_subic"
# The query kind of an instance code: FC0's outputs, the blocks'
# log-probabilities up to a constant per block (module doc).
QUERY = "logits"


@keras.saving.register_keras_serializable(package="subic_keras")
class InstanceModel(ImageModel):
    """An instance code's Keras model, pictures to block probabilities, with
    what counts as a copy saved beside its weights.

    Attributes:
        copy_margin: the least copy margin `s(q, x) - sum_m max_k l_m[k]`
            (`<= 0`; 0: the item's code is the query's own argmax) at which
            a result is marked a copy of the query (`subic_keras.instance.copies`);
            `None` until chosen on validation (`copies.calibrate`). A model
            saved with the earlier rule on `z*` (`copy_threshold`, a ratio)
            loads without one.
        copy_blocks: the least number of equal blocks at which two stored
            codes are listed as copies of each other (`ImageIndex.duplicates`);
            `None` until chosen.
    """

    copy_margin: float | None = None
    copy_blocks: int | None = None

    def get_config(self):
        config = super().get_config()
        config["copy_margin"] = self.copy_margin
        config["copy_blocks"] = self.copy_blocks
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config.pop("copy_threshold", None)  # the rule on `z*` (see above)
        margin = config.pop("copy_margin", None)
        blocks = config.pop("copy_blocks", None)
        if margin is not None and not (
            isinstance(margin, (int, float))
            and not isinstance(margin, bool)
            and -math.inf < margin <= 0
        ):
            raise ValueError(f"copy_margin must be <= 0, received {margin!r}")
        if blocks is not None and not (isinstance(blocks, int) and blocks >= 1):
            raise ValueError(f"copy_blocks must be a count >= 1, received {blocks!r}")
        model = super().from_config(config, custom_objects=custom_objects)
        model.copy_margin = margin
        model.copy_blocks = blocks
        return model


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
    _query_model: keras.Model | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )
    # What the folder commands ask of a model (`retrieval.index_folder`,
    # `subic search`, `subic serve`), as of a class model's `Subic`: an
    # instance code has one query, FC0's outputs, and no classes.
    default_query = QUERY
    num_classes = None
    class_names = None
    show_progress = False

    @property
    def bits(self) -> int:
        return self.num_blocks * (self.block_size.bit_length() - 1)

    @property
    def train_model(self) -> keras.Model:
        """The model (the name the folder commands read a `Subic`'s by)."""
        return self.model

    @property
    def copy_margin(self) -> float | None:
        """`InstanceModel.copy_margin` (`None` for a model without one)."""
        return getattr(self.model, "copy_margin", None)

    @property
    def copy_blocks(self) -> int | None:
        """`InstanceModel.copy_blocks` (`None` for a model without one)."""
        return getattr(self.model, "copy_blocks", None)

    def query(
        self, pictures, batch_size: int = 512, kind: str | None = None
    ) -> np.ndarray:
        """The queries of `pictures`: FC0's outputs `l`, float32 `(n, M·K)`.

        An item's score `sum_m l_m[c_m]` is its code's log-likelihood under
        the query's block probabilities `z* = softmax(l_m)`, up to a
        constant of the query: ranked by it, a copy must be likely in every
        block, not only in most (module doc).

        Args:
            pictures: uint8 pictures, or floats in `[0, 1]`.
            batch_size: prediction batch size.
            kind: `None` or `"logits"`, the one query of an instance code.
        """
        _check_kind(kind)
        return self._predict(self.query_model(), pictures, batch_size, "queries")

    def own_pictures(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 pictures `(n, H, W, C)` decoded for another model (a class
        code's, in an index that keeps both), resized (bilinear, antialiased)
        to this code's input and given its channels: what it encodes and
        queries of them, alike at indexing and at search."""
        shape = tuple(self.train_model.input_shape[1:])
        pixels = np.asarray(pixels)
        if pixels.dtype != np.uint8:  # model inputs in [0, 1]
            pixels = np.clip(np.round(pixels * 255.0), 0, 255).astype(np.uint8)
        if pixels.shape[1:] == shape:
            return pixels
        images = tf.convert_to_tensor(pixels, tf.float32)
        if images.shape[-1] != shape[-1]:
            images = (
                tf.image.grayscale_to_rgb(images)
                if shape[-1] == 3
                else tf.image.rgb_to_grayscale(images)
            )
        images = tf.image.resize(images, shape[:2], antialias=True)
        return np.clip(np.round(images.numpy()), 0, 255).astype(np.uint8)

    def block_probabilities(self, pictures, batch_size: int = 512) -> np.ndarray:
        """`z*`: the block probabilities of `pictures`, float32 `(n, M·K)`."""
        return self._predict(self.model, pictures, batch_size, "codes")

    def encode(self, pictures, batch_size: int = 512) -> np.ndarray:
        """The codes of `pictures`: each block's first largest, int32 `(n, M)`."""
        probs = self.block_probabilities(pictures, batch_size)
        blocks = probs.reshape(len(probs), self.num_blocks, self.block_size)
        return blocks.argmax(-1).astype(np.int32)

    def query_model(self, kind: str | None = None) -> keras.Model:
        """`pictures → (l,)`, FC0's outputs: what a search service answers a
        picture with (a class model's `query_model` adds class
        probabilities)."""
        _check_kind(kind)
        if self._query_model is None:
            self._query_model = ImageModel(
                self.model.inputs, [self.model.get_layer(FC0).output], name=QUERY
            )
        return self._query_model

    def _predict(self, model, pictures, batch_size: int, what: str) -> np.ndarray:
        pictures = check_model_inputs(self.model, pictures)
        if not len(pictures):
            return np.zeros((0, self.num_blocks * self.block_size), np.float32)
        out = predict(model, pictures, batch_size, what, self.show_progress)
        return np.asarray(out, np.float32)

    def save(
        self,
        path: str | os.PathLike,
        include_optimizer: bool = True,
        replace: bool = False,
    ) -> None:
        """Saves the model as a `.keras` file (atomically); without the
        optimizer's state, a third of the size, for use only (`replace`:
        `_io.atomic_path`'s, a link at `path` replaced itself)."""
        model = self.model if include_optimizer else _uncompiled(self.model)
        with atomic_path(path, suffix=".keras", replace=replace) as tmp:
            model.save(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstanceSubic:
        """An instance code saved by `save`.

        Raises:
            ValueError: for a file that is not an instance code's model.
        """
        code = cls.from_model(load_keras_file(path, compile=False))
        if code is None:
            raise ValueError(f"not an instance code's model: {os.fspath(path)!r}")
        return code

    @classmethod
    def from_model(cls, model: keras.Model) -> InstanceSubic | None:
        """The instance code of a Keras model, or `None` for a model that is
        not one (as `build_instance_subic` makes it)."""
        if model.name != NAME or len(model.outputs) != 1:
            return None
        layer = next((x for x in model.layers if isinstance(x, BlockSoftmax)), None)
        if layer is None or layer.name != BLOCK_PROBS:
            return None
        if not isinstance(model, InstanceModel):  # saved before it existed
            model = _uncompiled(model)
        return cls(model, layer.num_blocks, layer.block_size)


def _check_kind(kind: str | None) -> None:
    if kind not in (None, QUERY):
        raise ValueError(
            f"an instance code's one query is FC0's outputs ({QUERY!r}), "
            f"received kind={kind!r}"
        )


def _uncompiled(model: keras.Model) -> InstanceModel:
    """An uncompiled `InstanceModel` on `model`'s layers, its copy rules kept."""
    bare = InstanceModel(model.inputs, model.outputs, name=NAME)
    bare.copy_margin = getattr(model, "copy_margin", None)
    bare.copy_blocks = getattr(model, "copy_blocks", None)
    return bare


def pretrained() -> InstanceSubic:
    """The instance code that ships with the package (`subic_keras.pretrained`:
    256 bits, 32 × 32 pictures, trained on CIFAR-10 without labels), which
    the command line calls `instance`.

    Example:

    >>> code = pretrained()
    >>> code.bits, code.encode(np.zeros((1, 32, 32, 3), np.uint8)).shape
    (256, (1, 64))
    """
    return InstanceSubic.load(pretrained_path())


def build_instance_subic(
    backbone: keras.layers.Layer,
    num_blocks: int = 64,
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
    (256, (64, 64), (64, 1024))

    Args:
        backbone: a Keras model or layer from pictures to feature vectors.
        num_blocks, block_size: `M` and `K`; by default 256 bits as 64
            blocks of 16. The paper's instance codes have 64 bits (Sec. 4,
            `M = 8, K = 256`); trained alike, 8 blocks of 256 settle on few
            values per block, and each doubling of the blocks of 16 finds
            the original of a copy first among 60,000 pictures more often:
            trained 20 epochs, 32 blocks 10 points more often than 16; 60
            epochs, 64 blocks 7 points more often than 32
            (`benchmarks/near_duplicates.py`), each for twice the native
            scan's time.
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
    model = InstanceModel(inputs, probs, name=NAME)
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

    # The alterations branch by `tf.cond` alone: AutoGraph's rewrite is not
    # needed, and would write a source file for each function it converts.
    @tf.autograph.experimental.do_not_convert
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
        tf.autograph.experimental.do_not_convert(
            lambda first, second: (
                tf.concat([first, second], 0),
                tf.zeros([2 * batch_size]),
            )
        )
    )
    return data.prefetch(tf.data.AUTOTUNE)


def train_instance(
    instance: InstanceSubic,
    pictures: np.ndarray,
    *,
    epochs: int = 60,
    batch_size: int = 256,
    steps_per_epoch: int | None = None,
    seed: int = 0,
    families: Sequence[str] = alterations.FAMILIES,
    schedule: str = "cosine",
    callbacks=(),
    verbose: int | str = "auto",
    initial_epoch: int = 0,
) -> keras.callbacks.History:
    """Trains `instance.model` on `pictures` with `model.fit`, no labels.

    With `schedule="cosine"` the optimizer's learning rate falls from its
    compiled value to zero over the epochs, `lr_e = lr_0 (1 + cos(pi e /
    epochs)) / 2` (SGDR's single cycle, as self-supervised copy detectors
    train), so that a short run ends settled rather than mid-step.

    Args:
        instance: from `build_instance_subic` (compiled).
        pictures: uint8 `(n, H, W[, C])` training pictures.
        epochs: passes over the pictures.
        batch_size: pictures a batch (`2 ·` that many copies).
        steps_per_epoch: batches an epoch; default one pass over `pictures`.
        seed: the seed of the order and the alterations.
        families: the alteration families trained on.
        schedule: `"cosine"` (above) or `"constant"`.
        callbacks, verbose, initial_epoch: `fit`'s (`initial_epoch`: the
            epochs done, of a run resumed; its rates go on where they were).

    Returns:
        `fit`'s `History`.
    """
    epochs = check_int("epochs", epochs, minimum=1)
    initial_epoch = check_int("initial_epoch", initial_epoch, minimum=0)
    if steps_per_epoch is None:
        steps_per_epoch = max(1, len(pictures) // batch_size)
    steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, minimum=1)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, received {schedule!r}")
    keras.utils.set_random_seed(seed)
    data = copy_batches(pictures, batch_size, seed=seed, families=families)
    callbacks = list(callbacks)
    if schedule == "cosine":
        initial = float(
            keras.ops.convert_to_numpy(instance.model.optimizer.learning_rate)
        )
        callbacks.append(
            keras.callbacks.LearningRateScheduler(
                lambda epoch: initial * (1 + math.cos(math.pi * epoch / epochs)) / 2
            )
        )
    return instance.model.fit(
        data,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        shuffle=False,  # `copy_batches` draws a new order every epoch
        callbacks=callbacks,
        verbose=verbose,
        initial_epoch=initial_epoch,
    )
