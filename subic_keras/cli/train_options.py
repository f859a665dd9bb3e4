"""`subic train`'s options: the arguments of `Recipe` and `TrainConfig`, and
the config they give (`config_from_args`), with no TensorFlow import.
"""

from __future__ import annotations

import argparse
import math
import os

from subic_keras._validation import check_int, check_power_of_two
from subic_keras.config import BACKBONES, DATASETS, TrainConfig

# `subic quickstart`: 16-bit codes on the bundled 8×8 digits, in seconds.
QUICKSTART = TrainConfig(
    num_blocks=4,
    block_size=16,
    pretrain_epochs=20,
    epochs=20,
    batch_size=32,
    output_dir="subic_quickstart",
    cache_dir=os.path.join("subic_quickstart", "cache"),
)


def _blocks_from_args(args) -> tuple[int, int]:
    """`(M, K)` from `--bits`/`--block-size` or `--num-blocks`/`--block-size`."""
    block_size = check_power_of_two("--block-size", args.block_size)
    if args.bits is None:
        return check_int("--num-blocks", args.num_blocks, minimum=1), block_size
    bits = check_int("--bits", args.bits, minimum=1)
    per_block = int(math.log2(block_size))
    if bits % per_block:
        raise ValueError(
            f"--bits must be a multiple of log2(--block-size) = {per_block}, "
            f"received {bits}"
        )
    return bits // per_block, block_size


def add_train_arguments(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """The options of `subic train` (and `quickstart`), each defaulting to
    `defaults`."""
    _add_data_options(parser, defaults)
    _add_code_options(parser, defaults)
    _add_schedule_options(parser, defaults)
    _add_network_options(parser, defaults)
    _add_output_options(parser, defaults)


def _add_data_options(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """The data: a dataset, or a folder of pictures."""
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default=defaults.dataset,
        help="dataset to train on (default: %(default)s)",
    )
    parser.add_argument(
        "--data-dir",
        default=defaults.data_dir,
        help="directory in the dataset's standard layout (default: "
        "tensorflow-datasets)",
    )
    parser.add_argument(
        "--images",
        metavar="DIR",
        default=None,
        help="train on your own pictures instead of --dataset: a folder with "
        "one subfolder per class (default: none)",
    )
    parser.add_argument(
        "--validation-images",
        metavar="DIR",
        default=None,
        help="with --images: a folder of the same classes to validate on "
        "(default: --validation-size of --images held out)",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=defaults.image_size,
        help="with --images: the side, in pixels, pictures are resized to "
        "(default: %(default)s)",
    )


def _add_code_options(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """The code: its length, blocks and entropy weights (Eq. 8)."""
    parser.add_argument(
        "--bits",
        type=int,
        default=None,
        help="code length; sets M = bits / log2 K (default: M from --num-blocks)",
    )
    parser.add_argument(
        "--num-blocks",
        "-M",
        type=int,
        default=defaults.num_blocks,
        help="number of blocks M (default: %(default)s)",
    )
    parser.add_argument(
        "--block-size",
        "-K",
        type=int,
        default=defaults.block_size,
        help="block size K, a power of two (default: %(default)s)",
    )
    parser.add_argument(
        "--gamma",
        type=float,
        default=defaults.gamma,
        help="weight of the mean block entropy (default: %(default)s)",
    )
    parser.add_argument(
        "--mu",
        type=float,
        default=defaults.mu,
        help="weight of the batch block entropy (default: %(default)s)",
    )


def _add_schedule_options(
    parser: argparse.ArgumentParser, defaults: TrainConfig
) -> None:
    """The schedule: epochs, batches, learning rate, validation."""
    parser.add_argument(
        "--pretrain-epochs",
        type=int,
        default=defaults.pretrain_epochs,
        help="epochs of stage 1, the backbone trained as a classifier; cached "
        "and resumable; 0 skips it (default: %(default)s)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=defaults.epochs,
        help="epochs of stage 2, SuBiC (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        help="images per batch in both stages (default: %(default)s)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=defaults.learning_rate,
        help="Adam's learning rate, x0.1 after 75%% of each stage (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=defaults.warmup_epochs,
        help="SuBiC epochs over which gamma and mu ramp up from 0, at most "
        "--epochs (default: a third of --epochs)",
    )
    parser.add_argument(
        "--validation-size",
        type=float,
        default=defaults.validation_size,
        help="fraction (<1) or number of training images held out for model "
        "selection (default: %(default)s)",
    )


def _add_network_options(
    parser: argparse.ArgumentParser, defaults: TrainConfig
) -> None:
    """The network, its weights and what it trains on."""
    parser.add_argument(
        "--backbone",
        choices=BACKBONES,
        default=defaults.backbone,
        help="auto: an MLP for 8x8 digits, the DSH CNN otherwise; or a "
        "keras.applications network, its preprocessing inside the model "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--weights",
        default=defaults.weights,
        help="a keras.applications backbone's weights: imagenet (Keras's "
        "download), none, or a weights file (default: %(default)s)",
    )
    parser.add_argument(
        "--frozen-epochs",
        type=int,
        default=defaults.frozen_epochs,
        help="pre-training epochs that train the softmax layer on a frozen "
        "backbone before fine-tuning it at a tenth of the rate (default: a "
        "fifth of --pretrain-epochs for a keras.applications backbone with "
        "weights, 0 otherwise)",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="train in mixed_float16 (GPUs); the saved model computes in "
        "float32 (default: off)",
    )
    parser.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=defaults.augment,
        help="random flips and shifts (default: on for images of 16x16 pixels or more)",
    )
    parser.add_argument(
        "--max-train-images",
        type=int,
        default=None,
        help="use the first N training images only; the test images are "
        "always all of them (default: all)",
    )
    parser.add_argument(
        "--exclude-classes",
        type=_class_ids,
        default=(),
        metavar="IDS",
        help="class ids of --dataset left out of training, comma-separated "
        "(e.g. 2,4,6: unseen-class split 0 of CIFAR-10), which `subic evaluate "
        "--protocol unseen` retrieves among (default: none)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of weights, data order and augmentation (default: %(default)s)",
    )


def _add_output_options(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """Where the run goes."""
    parser.add_argument(
        "--output-dir",
        default=defaults.output_dir,
        help="where best.keras, summary.json and logs go (default: %(default)s)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the model, summary.json and logs an --output-dir already "
        "holds (a link there: the link itself, never what it leads to); "
        "without it, such a folder is refused before training, so that no "
        "index outlives the model that wrote it unnoticed (default: off)",
    )
    parser.add_argument(
        "--cache-dir",
        default=defaults.cache_dir,
        help="cache of pre-trained backbones (default: $SUBIC_CACHE_DIR or "
        "~/.cache/subic-keras)",
    )


def config_from_args(args) -> TrainConfig:
    num_blocks, block_size = _blocks_from_args(args)
    validation = args.validation_size
    return TrainConfig(
        dataset=args.dataset,
        data_dir=args.data_dir,
        images=args.images,
        validation_images=args.validation_images,
        image_size=args.image_size,
        num_blocks=num_blocks,
        block_size=block_size,
        gamma=args.gamma,
        mu=args.mu,
        pretrain_epochs=args.pretrain_epochs,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_epochs=args.warmup_epochs,
        validation_size=int(validation) if validation >= 1 else validation,
        backbone=args.backbone,
        weights=None if args.weights == "none" else args.weights,
        augment=args.augment,
        frozen_epochs=args.frozen_epochs,
        mixed_precision=args.mixed_precision,
        max_train_images=args.max_train_images,
        exclude_classes=args.exclude_classes,
        seed=args.seed,
        output_dir=args.output_dir,
        cache_dir=args.cache_dir,
    )


def _class_ids(text: str) -> tuple[int, ...]:
    """`--exclude-classes`: comma-separated class ids."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected class ids separated by commas, received {text!r}"
        ) from None
