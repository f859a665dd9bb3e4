"""The `subic` command line: quickstart, train, index build, search, evaluate."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from subic_keras._validation import check_int
from subic_keras.datasets import DATASETS
from subic_keras.models import QUERY_KINDS
from subic_keras.training import BACKBONES, TrainConfig

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
    parser.add_argument(
        "--backbone",
        choices=BACKBONES,
        default=defaults.backbone,
        help="auto: an MLP for 8x8 digits, the DSH CNN otherwise (default: "
        "%(default)s)",
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
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of weights, data order and augmentation (default: %(default)s)",
    )
    parser.add_argument(
        "--output-dir",
        default=defaults.output_dir,
        help="where best.keras, summary.json and logs go (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-dir",
        default=defaults.cache_dir,
        help="cache of pre-trained backbones (default: $SUBIC_CACHE_DIR or "
        "~/.cache/subic-keras)",
    )


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
        pretrain_epochs=args.pretrain_epochs,
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
        cache_dir=args.cache_dir,
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
        pretrain = summary.get("pretrain")
        if pretrain:
            how = "cached" if pretrain["cached"] else f"{pretrain['train_seconds']} s"
            print(
                f"pre-training: validation accuracy "
                f"{pretrain['best_validation_accuracy']:.4f} at epoch "
                f"{pretrain['best_epoch']} ({how})"
            )
        maps = summary["validation_map"]
        print(
            f"best epoch {summary['best_epoch']}: validation mAP "
            + ", ".join(f"{maps[kind]:.4f} ({kind} query)" for kind in maps)
            + f"; query {summary['query']!r} saved with the model"
        )
        print(
            f"test accuracy {test['accuracy_soft']:.4f} (soft codes), "
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
    from subic_keras import evaluation, retrieval
    from subic_keras.datasets import load_images
    from subic_keras.training import train

    start = time.time()
    config = _config_from_args(args)
    print(
        f"Training SuBiC ({config.num_blocks} blocks of {config.block_size}: "
        f"{config.num_blocks * int(math.log2(config.block_size))} bits) on "
        f"{config.dataset}: {config.pretrain_epochs} epochs of pre-training, then "
        f"{config.epochs} SuBiC epochs..."
    )
    summary = train(config, verbose=0)
    _report_training(summary)
    if summary["checkpoint"] is None:
        return 1
    subic = _load_subic(summary["checkpoint"])
    (x_db, y_db), (x_query, y_query) = load_images(
        config.dataset, config.data_dir, config.max_train_images
    )
    # Database: the training images; queries: the unseen test images.
    index = retrieval.build_index(subic, x_db)
    index_path = os.path.join(config.output_dir, "database.subic")
    index.save(index_path)
    queries = subic.query(x_query)
    scores, ids = retrieval.full_scores(index, queries)
    results = evaluation.evaluate_retrieval(scores, y_query, y_db[ids], ks=(10, 100))
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


def _load_subic(path: str):
    import keras

    from subic_keras.models import Subic

    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    return Subic.from_train_model(keras.saving.load_model(path))


def _split_images(args):
    from subic_keras.datasets import load_images

    train_part, test_part = load_images(args.dataset, args.data_dir)
    return train_part if args.split == "train" else test_part


def _write_json(path: str | None, result: dict) -> None:
    from subic_keras._io import atomic_path

    print(json.dumps(result))
    if path:
        with atomic_path(path) as tmp, open(tmp, "w") as handle:
            json.dump(result, handle, indent=2)


def run_index_build(args) -> int:
    from subic_keras import protocols, retrieval

    subic = _load_subic(args.model)
    images, labels = _split_images(args)
    ids = np.arange(len(images))
    if args.protocol is not None:
        _, ids = protocols.protocol_split(args.protocol, labels, seed=args.seed)
    index = retrieval.build_index(subic, images[ids], ids=ids)
    index.save(args.output)
    print(
        f"indexed {len(index)} {args.dataset} {args.split} images "
        f"({index.bytes_per_item} bytes each) into {args.output}"
    )
    return 0


def _read_query_images(paths: list[str], shape) -> tuple[list[str], np.ndarray]:
    """Query images from `.npy` arrays (uint8 `(n, H, W[, C])`) or image files."""
    import tensorflow as tf

    names, batches = [], []
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"query image file not found: {path}")
        if path.endswith(".npy"):
            array = np.load(path, allow_pickle=False)
            array = array[None] if array.ndim == len(shape) - 1 else array
            names += [f"{path}[{i}]" for i in range(len(array))]
            batches.append(array)
            continue
        image = tf.io.decode_image(
            tf.io.read_file(path), channels=shape[-1], expand_animations=False
        )
        image = tf.image.resize(image, shape[:2], antialias=True)
        batches.append(np.clip(np.round(image.numpy()), 0, 255).astype(np.uint8)[None])
        names.append(path)
    images = np.concatenate(batches)
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[1:] != tuple(shape):
        raise ValueError(
            f"query images must have shape {tuple(shape)}, received {images.shape[1:]}"
        )
    return names, images


def run_search(args) -> int:
    from subic_keras.search import SubicIndex

    check_int("-k", args.k, minimum=1)
    subic = _load_subic(args.model)
    index = SubicIndex.load(args.index)
    if (index.num_blocks, index.block_size) != (subic.num_blocks, subic.block_size):
        raise ValueError(
            f"index {args.index} holds codes of {index.num_blocks} blocks of "
            f"{index.block_size}, but the model makes {subic.num_blocks} blocks of "
            f"{subic.block_size}"
        )
    shape = subic.train_model.inputs[0].shape[1:]
    names, images = _read_query_images(args.images, shape)
    queries = subic.query(images, kind=args.query)
    # Beyond the index's size there is nothing to print: searching for more
    # would only allocate padding (bounded memory whatever -k says).
    scores, ids = index.search(queries, max(1, min(args.k, len(index))))
    for name, row_scores, row_ids in zip(names, scores, ids):
        found = row_ids >= 0
        print(
            json.dumps(
                {
                    "query": name,
                    "ids": row_ids[found].tolist(),
                    "scores": [round(float(v), 6) for v in row_scores[found]],
                }
            )
        )
    return 0


def run_evaluate(args) -> int:
    from subic_keras import retrieval
    from subic_keras.search import SubicIndex

    subic = _load_subic(args.model)
    images, labels = _split_images(args)
    options = {}
    if args.protocol == "random":
        if args.num_queries is not None:
            options["num_queries"] = args.num_queries
        else:
            options["queries_per_class"] = args.queries_per_class or 100
    index = SubicIndex.load(args.index) if args.index else None
    start = time.time()
    result = retrieval.evaluate(
        subic,
        images,
        labels,
        args.protocol,
        seed=args.seed,
        index=index,
        ties=args.ties,
        query=args.query,
        **options,
    )
    result.update(
        {
            "model": args.model,
            "dataset": args.dataset,
            "split": args.split,
            "seed": args.seed,
            "wall_seconds": round(time.time() - start, 1),
        }
    )
    print(
        f"{args.dataset} {args.split}, protocol {args.protocol!r}: mAP "
        f"{result['map']:.4f} ({args.ties} ties; {result['map_expected']:.4f} "
        f"expected over tie orders), precision@10 {result['precision@10']:.4f} "
        f"({result['num_queries']} queries, {result['num_database']} database, "
        f"{result['bits']} bits)"
    )
    _write_json(args.output, result)
    return 0


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=DATASETS, default="cifar10")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--split", choices=("test", "train"), default="test")
    parser.add_argument("--seed", type=int, default=0)


def run_export(args) -> int:
    """Exports a trained model for TF Serving and, optionally, LiteRT."""
    from subic_keras.datasets import load_images
    from subic_keras.export import export_litert, export_saved_model, load_subic

    if args.int8 and args.representative_data is None:
        raise ValueError(
            "--int8 needs --representative-data (calibration images), received none"
        )
    count = check_int("--num-representative", args.num_representative, minimum=1)
    litert = {}
    if args.litert:
        litert["float32"] = os.path.join(args.output_dir, f"{args.model_name}.tflite")
    if args.int8:
        litert["int8"] = os.path.join(args.output_dir, f"{args.model_name}_int8.tflite")
    # Refuse before writing anything, so that no export is left half done.
    targets = list(litert.values())
    if args.version is not None:
        targets.append(
            os.path.join(args.output_dir, args.model_name, str(args.version))
        )
    for path in targets:
        if os.path.exists(path) and not args.overwrite:
            raise ValueError(f"{path} already exists; pass --overwrite to replace it")
    subic = load_subic(args.model)
    path = export_saved_model(
        subic,
        args.output_dir,
        model_name=args.model_name,
        version=args.version,
        overwrite=args.overwrite,
    )
    print(f"SavedModel for TF Serving: {path}")
    for quantization, litert_path in litert.items():
        images = None
        if quantization == "int8":
            (images, _), _ = load_images(
                args.representative_data, args.data_dir, limit=count
            )
            images = images[:count]
        export_litert(subic, litert_path, quantization, representative_images=images)
        size = os.path.getsize(litert_path)
        print(f"LiteRT encoder ({quantization}): {litert_path} ({size} bytes)")
    return 0


def _add_export_parser(commands) -> None:
    export = commands.add_parser(
        "export",
        help="export a trained model for TF Serving (SavedModel) and LiteRT",
        description="Writes OUTPUT_DIR/MODEL_NAME/VERSION/ (a SavedModel with the "
        "signatures serving_default, encode_images and classify) and, with "
        "--litert / --int8, OUTPUT_DIR/MODEL_NAME.tflite / MODEL_NAME_int8.tflite.",
    )
    export.add_argument("model", help="the trained model, a .keras file")
    export.add_argument("--output-dir", required=True, help="TF Serving's base dir")
    export.add_argument("--model-name", default="subic")
    export.add_argument(
        "--version",
        type=int,
        default=None,
        help="version directory (default: one more than the largest existing)",
    )
    export.add_argument(
        "--overwrite", action="store_true", help="replace existing exports"
    )
    export.add_argument(
        "--litert", action="store_true", help="also write a float32 LiteRT encoder"
    )
    export.add_argument(
        "--int8",
        action="store_true",
        help="also write a full-integer (int8) LiteRT encoder",
    )
    export.add_argument(
        "--representative-data",
        choices=DATASETS,
        default=None,
        help="training images that calibrate the int8 quantisation",
    )
    export.add_argument(
        "--data-dir", default=None, help="the representative dataset's directory"
    )
    export.add_argument(
        "--num-representative",
        type=int,
        default=200,
        help="number of calibration images (default: 200)",
    )
    export.set_defaults(run=run_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="subic", description="SuBiC: supervised structured binary codes"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    quick = commands.add_parser(
        "quickstart",
        help="train on the bundled digits, index, search and print the mAP",
    )
    _add_train_arguments(quick, QUICKSTART)
    quick.set_defaults(run=run_quickstart)
    train = commands.add_parser("train", help="train a SuBiC model")
    _add_train_arguments(train, TrainConfig())
    train.set_defaults(run=run_train)

    index = commands.add_parser("index", help="build a search index")
    index_commands = index.add_subparsers(dest="index_command", required=True)
    build = index_commands.add_parser(
        "build", help="encode a dataset split with a model into a SubicIndex file"
    )
    build.add_argument("model", help="a SuBiC .keras model")
    _add_data_arguments(build)
    build.add_argument(
        "--protocol",
        choices=("paper", "dsh"),
        default=None,
        help="index only this protocol's database part (ids: positions in the split)",
    )
    build.add_argument("--output", required=True, help="the index file to write")
    build.set_defaults(run=run_index_build)

    search = commands.add_parser("search", help="search an index with query images")
    search.add_argument("model", help="a SuBiC .keras model")
    search.add_argument("index", help="a SubicIndex file")
    search.add_argument("images", nargs="+", help=".npy uint8 arrays or image files")
    search.add_argument(
        "-k",
        type=int,
        default=10,
        help="results per query, at least 1; at most the index's size are "
        "printed (default: 10)",
    )
    _add_query_argument(search)
    search.set_defaults(run=run_search)

    evaluate = commands.add_parser(
        "evaluate", help="retrieval mAP and precision@k of a model on a protocol"
    )
    evaluate.add_argument("model", help="a SuBiC .keras model")
    _add_data_arguments(evaluate)
    evaluate.add_argument(
        "--protocol", choices=("paper", "dsh", "random"), default="paper"
    )
    evaluate.add_argument("--queries-per-class", type=int, default=None)
    evaluate.add_argument("--num-queries", type=int, default=None)
    evaluate.add_argument(
        "--index", default=None, help="a prebuilt database index (ids: positions)"
    )
    evaluate.add_argument(
        "--ties",
        choices=("pessimistic", "expected", "optimistic", "index"),
        default="pessimistic",
    )
    _add_query_argument(evaluate)
    evaluate.add_argument("--output", default=None, help="also write the JSON here")
    evaluate.set_defaults(run=run_evaluate)
    _add_export_parser(commands)
    return parser


def _add_query_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--query",
        choices=QUERY_KINDS,
        default=None,
        help="the query of asymmetric search: fc0, the paper's z, or "
        "class_posterior, FC1's kernel times the query's class posterior "
        "(default: the query chosen on validation and saved with the model)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.exit(2, f"subic {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
