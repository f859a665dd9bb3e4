"""The `subic` command line: `subic quickstart`, `subic train`."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from subic_keras._validation import check_int
from subic_keras.training import BACKBONES, DATASETS, TrainConfig


def _blocks_from_args(args) -> tuple[int, int]:
    """`(M, K)` from `--bits`/`--block-size` or `--num-blocks`/`--block-size`."""
    block_size = check_int("--block-size", args.block_size, minimum=2)
    if block_size & (block_size - 1):
        raise ValueError(f"--block-size must be a power of two, received {block_size}")
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


def _add_train_arguments(parser: argparse.ArgumentParser, defaults: TrainConfig):
    parser.add_argument("--dataset", choices=DATASETS, default=defaults.dataset)
    parser.add_argument(
        "--data-dir",
        default=defaults.data_dir,
        help="directory in the dataset's standard layout (default: "
        "tensorflow-datasets)",
    )
    parser.add_argument(
        "--bits", type=int, default=None, help="code length; sets M = bits / log2 K"
    )
    parser.add_argument("--num-blocks", "-M", type=int, default=defaults.num_blocks)
    parser.add_argument("--block-size", "-K", type=int, default=defaults.block_size)
    parser.add_argument("--gamma", type=float, default=defaults.gamma)
    parser.add_argument("--mu", type=float, default=defaults.mu)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=defaults.warmup_epochs,
        help="epochs over which gamma and mu ramp up from 0",
    )
    parser.add_argument(
        "--validation-size",
        type=float,
        default=defaults.validation_size,
        help="fraction (<1) or number of training images held out",
    )
    parser.add_argument("--backbone", choices=BACKBONES, default=defaults.backbone)
    parser.add_argument("--augment", action="store_true", default=defaults.augment)
    parser.add_argument("--max-train-images", type=int, default=None)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--output-dir", default=defaults.output_dir)


def _config_from_args(args) -> TrainConfig:
    num_blocks, block_size = _blocks_from_args(args)
    validation = args.validation_size
    return TrainConfig(
        dataset=args.dataset,
        data_dir=args.data_dir,
        num_blocks=num_blocks,
        block_size=block_size,
        gamma=args.gamma,
        mu=args.mu,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_epochs=args.warmup_epochs,
        validation_size=int(validation) if validation >= 1 else validation,
        backbone=args.backbone,
        augment=args.augment,
        max_train_images=args.max_train_images,
        seed=args.seed,
        output_dir=args.output_dir,
    )


def _report_training(summary: dict) -> None:
    if summary["stopped_on_nan"]:
        kept = summary["checkpoint"] or "no checkpoint (no epoch finished cleanly)"
        print(
            f"Training stopped: the loss became NaN in epoch {summary['epochs_run']}. "
            f"Kept the last good model: {kept}",
            file=sys.stderr,
        )
    if summary.get("test"):
        test = summary["test"]
        print(
            f"best epoch {summary['best_epoch']}: test accuracy "
            f"{test['accuracy_soft']:.4f} (soft codes), "
            f"{test['accuracy_binary']:.4f} ({summary['bits']}-bit binary codes)"
        )
        print(f"model: {summary['checkpoint']}")


def run_train(args) -> int:
    from subic_keras.training import train

    summary = train(_config_from_args(args))
    _report_training(summary)
    return 1 if summary["stopped_on_nan"] else 0


def run_quickstart(args) -> int:
    """Trains on the bundled digits, indexes, searches, prints retrieval mAP."""
    import keras

    from subic_keras import evaluation
    from subic_keras.models import Subic
    from subic_keras.search import SubicIndex
    from subic_keras.training import load_images, train

    start = time.time()
    config = _config_from_args(args)
    print(
        f"Training SuBiC ({config.num_blocks} blocks of {config.block_size}: "
        f"{config.num_blocks * int(math.log2(config.block_size))} bits) on "
        f"{config.dataset} for {config.epochs} epochs..."
    )
    summary = train(config, verbose=0)
    _report_training(summary)
    if summary["checkpoint"] is None:
        return 1
    subic = Subic.from_train_model(keras.saving.load_model(summary["checkpoint"]))
    (x_db, y_db), (x_query, y_query) = load_images(
        config.dataset, config.data_dir, config.max_train_images
    )
    # Database: the training images; queries: the unseen test images.
    database = subic.encode(x_db.astype("float32") / 255.0)
    queries = subic.query(x_query.astype("float32") / 255.0)
    index = SubicIndex(config.num_blocks, config.block_size)
    index.add(database)
    index_path = os.path.join(config.output_dir, "database.subic")
    index.save(index_path)
    scores, ids = index.search(queries, k=len(index))
    full = np.full((len(queries), len(index)), -np.inf, np.float32)
    np.put_along_axis(full, ids, scores, axis=1)
    results = evaluation.evaluate_retrieval(full, y_query, y_db, ks=(10, 100))
    result = {
        "dataset": config.dataset,
        "bits": summary["bits"],
        "num_queries": len(queries),
        "num_database": len(index),
        "map": results["map"],
        "precision_at_10": results["precision@10"],
        "test": summary.get("test"),
        "wall_seconds": round(time.time() - start, 1),
    }
    print(
        f"Indexed {len(index)} training images ({index.bytes_per_item} bytes each) "
        f"into {index_path}; searched {len(queries)} test queries."
    )
    print(
        f"retrieval mAP: {result['map']:.4f}   precision@10: "
        f"{result['precision_at_10']:.4f}   ({result['wall_seconds']} s)"
    )
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="subic", description="SuBiC: supervised structured binary codes"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    quick = commands.add_parser(
        "quickstart",
        help="train on the bundled digits, index, search and print the mAP",
    )
    _add_train_arguments(quick, TrainConfig(epochs=40, output_dir="subic_quickstart"))
    quick.set_defaults(run=run_quickstart)
    train = commands.add_parser("train", help="train a SuBiC model")
    _add_train_arguments(train, TrainConfig())
    train.set_defaults(run=run_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.exit(2, f"subic {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
