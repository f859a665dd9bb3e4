"""The settings of SuBiC's training, with no TensorFlow import.

`Recipe` holds the budgets and weights of the two-stage recipe
(`subic_keras.trainers.recipe`), `TrainConfig` everything `subic train` needs. They
live apart from the code that trains so that the command line can show its
options and defaults, and check them, without loading TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import os

from subic_keras._validation import check_block_shape, check_int, check_non_negative

# The datasets `subic train` and `datasets.load_images` read by name.
DATASETS = ("digits", "cifar10", "fashion_mnist")
# Each dataset's class names, in label order (the official releases' lists),
# saved with a model trained on it.
CLASS_NAMES = {
    "digits": [str(digit) for digit in range(10)],
    "cifar10": "airplane automobile bird cat deer dog frog horse ship truck".split(),
    "fashion_mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
}
# The backbones of `TrainConfig.backbone`.
# `keras.applications` networks that `subic train --backbone` offers, by
# the names the command line takes: ones that train on a CPU as on a GPU.
APPLICATIONS = {
    "mobilenet_v3_small": "MobileNetV3Small",
    "mobilenet_v3_large": "MobileNetV3Large",
    "efficientnet_b0": "EfficientNetB0",
    "efficientnetv2_b0": "EfficientNetV2B0",
    "resnet50": "ResNet50",
}
BACKBONES = ("auto", "dsh_cnn", "mlp", *APPLICATIONS)
# The queries of asymmetric search: FC0's output `z` (Sec. 3.3) or FC1's
# kernel times the class posterior.
QUERY_KINDS = ("fc0", "class_posterior")


# What `train` writes in its output folder: the model, the summary, logs.
TRAIN_OUTPUTS = ("best.keras", "summary.json", "logs")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The budgets and weights of SuBiC's two-stage recipe (the docstring of
    `subic_keras.trainers.recipe` says how each default was chosen).

    Attributes:
        pretrain_epochs: epochs of classifier pre-training; 0 skips it.
        epochs: epochs of the SuBiC stage, >= 1.
        gamma, mu: the entropy weights `γ`, `μ` of Eq. 8.
        warmup_fraction: the fraction of the SuBiC epochs over which `γ` and
            `μ` ramp up from 0.
        learning_rate: Adam's rate in both stages, ×0.1 after 75% of a
            stage's steps.
        batch_size: images per batch in both stages.
        augment: random flips and shifts of image inputs in both stages.
        frozen_epochs: for a pre-trained backbone (ImageNet weights), the
            first pre-training epochs train the softmax layer only, on the
            frozen backbone; the rest fine-tune the whole network at a tenth
            of `learning_rate`, its batch normalisation kept in inference
            mode (the transfer-learning practice of Keras's guide). 0 trains
            the whole network from the first epoch.
    """

    pretrain_epochs: int = 100
    epochs: int = 5
    gamma: float = 0.3
    mu: float = 0.3
    warmup_fraction: float = 1 / 3
    learning_rate: float = 1e-3
    batch_size: int = 200
    augment: bool = True
    frozen_epochs: int = 0

    def __post_init__(self):
        check_int("pretrain_epochs", self.pretrain_epochs, minimum=0)
        check_int("frozen_epochs", self.frozen_epochs, minimum=0)
        if self.frozen_epochs > self.pretrain_epochs:
            raise ValueError(
                f"frozen_epochs must be at most pretrain_epochs "
                f"({self.pretrain_epochs}), received {self.frozen_epochs}"
            )
        check_int("epochs", self.epochs, minimum=1)
        check_non_negative("gamma", self.gamma)
        check_non_negative("mu", self.mu)
        check_int("batch_size", self.batch_size, minimum=1)
        if not 0 <= self.warmup_fraction <= 1:
            raise ValueError(
                f"warmup_fraction must be in [0, 1], received {self.warmup_fraction!r}"
            )
        if not self.learning_rate > 0:
            raise ValueError(
                f"learning_rate must be > 0, received {self.learning_rate!r}"
            )

    @property
    def warmup_epochs(self) -> float:
        return self.warmup_fraction * self.epochs


# `subic train`'s defaults are the recipe's.
_RECIPE = Recipe()


def default_cache_dir() -> str:
    """Where `subic train` caches pre-trained backbones: `$SUBIC_CACHE_DIR`, or
    `~/.cache/subic-keras`."""
    return os.environ.get("SUBIC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "subic-keras"
    )


@dataclasses.dataclass
class TrainConfig:
    """Everything `train` needs; the CLI's flags map one to one onto it.

    The defaults are the recipe of `subic_keras.trainers.recipe` (its docstring says
    how each was chosen): 48-bit codes of 12 blocks of 16, the backbone
    pre-trained as a classifier for 100 epochs, then 5 SuBiC epochs with
    `γ = μ = 0.3` ramped in over the first third, selection by validation
    retrieval mAP and the query chosen on validation.

    Attributes:
        dataset: `"digits"` (bundled, offline), `"cifar10"` or
            `"fashion_mnist"`.
        data_dir: a directory in the dataset's standard layout; `None` uses
            tensorflow-datasets (network needed once) for CIFAR-10 and
            Fashion-MNIST.
        images: a folder of your own pictures, one subfolder per class
            (`subic_keras.data.folders.image_folder`), trained on instead of
            `dataset`; the validation split is held out of it.
        validation_images: a labelled folder of the same classes to validate
            on instead of a split of `images`.
        image_size: the side in pixels that `images` are resized to.
        num_blocks, block_size: `M` and `K`; codes have `M·log2 K` bits.
        gamma, mu: weights of the mean and batch block entropies (Eq. 8).
        pretrain_epochs: epochs of classifier pre-training (0: none).
        epochs: epochs of the SuBiC stage.
        batch_size, learning_rate: Adam's schedule in both stages; the
            learning rate drops ×0.1 after 75% of a stage's steps.
        warmup_epochs: SuBiC epochs over which γ and μ ramp up from 0, at
            most `epochs`; `None` is a third of `epochs`.
        validation_size: fraction or count of training images held out for
            model selection (never the test set); the split is the same for
            every seed, so that seeds are compared on the same images.
        backbone: `"dsh_cnn"`, `"mlp"`, `"auto"` (MLP for 8×8 digits, the
            DSH CNN otherwise), or a `keras.applications` network of
            `APPLICATIONS` (its own preprocessing inside the model).
        weights: the weights of a `keras.applications` backbone:
            `"imagenet"` (Keras's download, cached in `~/.keras/models`), a
            weights file, or `None` (random).
        augment: random flips and shifts during training; `None` turns them
            on for images of at least 16×16 pixels.
        frozen_epochs: pre-training epochs with the backbone frozen before
            it is fine-tuned (`Recipe.frozen_epochs`); `None`: a fifth of
            `pretrain_epochs` for a `keras.applications` backbone with
            weights, 0 otherwise.
        mixed_precision: train in `mixed_float16` (for GPUs with float16
            units: about twice the speed); the saved model computes in
            float32 (`models.float32_copy`).
        max_train_images: train on the first `n` training images only
            (quick runs); the test split is always whole.
        exclude_classes: class ids of `dataset` left out of training and
            validation (`protocols.held_out_classes`): the model learns the
            other classes (numbered in order) and records these, which
            `subic evaluate --protocol unseen` retrieves among.
        seed: seed of the initial weights, the data order and augmentation.
        output_dir: where `best.keras`, `summary.json` and TensorBoard logs go.
        cache_dir: where pre-trained backbones are cached, keyed by
            everything they depend on; `None` is `default_cache_dir()`.
    """

    dataset: str = "digits"
    data_dir: str | None = None
    images: str | None = None
    validation_images: str | None = None
    image_size: int = 32
    num_blocks: int = 12
    block_size: int = 16
    gamma: float = _RECIPE.gamma
    mu: float = _RECIPE.mu
    pretrain_epochs: int = _RECIPE.pretrain_epochs
    epochs: int = _RECIPE.epochs
    batch_size: int = _RECIPE.batch_size
    learning_rate: float = _RECIPE.learning_rate
    warmup_epochs: float | None = None
    validation_size: float = 0.1
    backbone: str = "auto"
    weights: str | None = "imagenet"
    augment: bool | None = None
    frozen_epochs: int | None = None
    mixed_precision: bool = False
    max_train_images: int | None = None
    exclude_classes: tuple[int, ...] = ()
    seed: int = 0
    output_dir: str = "subic_run"
    cache_dir: str | None = None

    def __post_init__(self):
        if self.dataset not in DATASETS:
            raise ValueError(
                f"dataset must be one of {DATASETS}, received {self.dataset!r}"
            )
        if self.backbone not in BACKBONES:
            raise ValueError(
                f"backbone must be one of {BACKBONES}, received {self.backbone!r}"
            )
        check_block_shape(self.num_blocks, self.block_size)
        check_int("image_size", self.image_size, minimum=8)
        if self.validation_images is not None and self.images is None:
            raise ValueError(
                "validation_images needs images (a folder to train on), received none"
            )
        check_int("epochs", self.epochs, minimum=1)
        if self.warmup_epochs is not None:
            check_non_negative("warmup_epochs", self.warmup_epochs)
            if self.warmup_epochs > self.epochs:
                raise ValueError(
                    f"warmup_epochs must be at most epochs ({self.epochs}), "
                    f"received {self.warmup_epochs}"
                )
        if self.max_train_images is not None:
            check_int("max_train_images", self.max_train_images, minimum=2)
        excluded = tuple(self.exclude_classes)
        for value in excluded:
            check_int("exclude_classes", value, minimum=0)
        if len(set(excluded)) != len(excluded):
            raise ValueError(
                f"exclude_classes must name each class once, received {excluded}"
            )
        if excluded and self.images is not None:
            raise ValueError(
                "exclude_classes applies to dataset (a folder's classes are its "
                f"subfolders: leave one out of it), received {excluded}"
            )
        self.exclude_classes = tuple(sorted(excluded))
        self.recipe()  # validates the budgets and weights

    @property
    def bits(self) -> int:
        """The code's length, `M·log2 K` bits."""
        return self.num_blocks * int(math.log2(self.block_size))

    def recipe(self, augment: bool = True) -> Recipe:
        """The `Recipe` of this configuration (`augment` when `self.augment`
        is `None`)."""
        warmup = self.epochs / 3 if self.warmup_epochs is None else self.warmup_epochs
        frozen = self.frozen_epochs
        if frozen is None:
            pretrained = self.backbone in APPLICATIONS and self.weights is not None
            fifth = self.pretrain_epochs // 5 or min(1, self.pretrain_epochs)
            frozen = fifth if pretrained else 0
        return Recipe(
            frozen_epochs=frozen,
            pretrain_epochs=self.pretrain_epochs,
            epochs=self.epochs,
            gamma=self.gamma,
            mu=self.mu,
            warmup_fraction=warmup / self.epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            augment=augment if self.augment is None else self.augment,
        )
