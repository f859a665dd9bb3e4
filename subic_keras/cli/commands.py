"""What each `subic` command does; loaded (with TensorFlow) only to run one.

Each `run_*` function takes the parsed arguments of `subic_keras.cli.parser`
and returns the exit status.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf

from subic_keras import evaluation, protocols, retrieval
from subic_keras._io import atomic_path, check_file
from subic_keras._validation import check_int
from subic_keras.cli.parser import config_from_args
from subic_keras.datasets import load_images
from subic_keras.export import export_litert, export_saved_model, load_subic
from subic_keras.search import SubicIndex
from subic_keras.training import train


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


def _announce(config) -> None:
    """States the plan, warm-up included, before the first epoch."""
    recipe = config.recipe()
    bits = config.num_blocks * int(math.log2(config.block_size))
    print(
        f"Training SuBiC ({config.num_blocks} blocks of {config.block_size}: "
        f"{bits} bits) on {config.dataset}: {config.pretrain_epochs} epochs of "
        f"pre-training, then {config.epochs} SuBiC epochs with gamma = "
        f"{config.gamma:g} and mu = {config.mu:g} ramped in from 0 over the first "
        f"{recipe.warmup_epochs:.3g} epochs (--warmup-epochs); the best epoch is kept."
    )


def run_train(args) -> int:
    config = config_from_args(args)
    _announce(config)
    summary = train(config)
    _report_training(summary)
    return 1 if summary["stopped_on_nan"] else 0


def run_quickstart(args) -> int:
    """Trains on the bundled digits, indexes, searches, prints retrieval mAP."""
    start = time.time()
    config = config_from_args(args)
    _announce(config)
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
    subic = load_subic(path)
    subic.show_progress = True
    return subic


def _split_images(args):
    train_part, test_part = load_images(args.dataset, args.data_dir)
    return train_part if args.split == "train" else test_part


def _write_json(path: str | None, result: dict) -> None:
    print(json.dumps(result))
    if path:
        with atomic_path(path) as tmp, open(tmp, "w") as handle:
            json.dump(result, handle, indent=2)


def _milvus(args, num_blocks=None, block_size=None):
    from subic_keras.search.milvus import MilvusIndex

    return MilvusIndex(args.milvus, args.collection, num_blocks, block_size)


def run_index_build(args) -> int:
    if (args.output is None) == (args.milvus is None):
        raise ValueError("give one of --output FILE and --milvus URI")
    subic = _load_subic(args.model)
    images, labels = _split_images(args)
    ids = np.arange(len(images))
    if args.protocol is not None:
        _, ids = protocols.protocol_split(args.protocol, labels, seed=args.seed)
    if args.milvus is not None:
        with _milvus(args, subic.num_blocks, subic.block_size) as collection:
            collection.add(subic.encode(images[ids]), ids=ids)
            print(
                f"added {len(ids)} {args.dataset} {args.split} images to "
                f"collection {args.collection!r} at {args.milvus} "
                f"({len(collection)} items)"
            )
        return 0
    index = retrieval.build_index(subic, images[ids], ids=ids)
    index.save(args.output)
    print(
        f"indexed {len(index)} {args.dataset} {args.split} images "
        f"({index.bytes_per_item} bytes each) into {args.output}"
    )
    return 0


def _read_npy(path: str, shape) -> np.ndarray:
    """Images `(n, *shape)` from a `.npy` file (one image may lack the `n`)."""
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as error:
        raise ValueError(f"not a NumPy .npy array ({error}) ({path})") from None
    if array.ndim == len(shape) - 1:
        array = array[None]  # one image
    if array.ndim == len(shape) and len(shape) == 3:
        array = array[..., None]  # grey images without a channel axis
    if array.dtype != np.uint8 and array.dtype.kind != "f":
        raise ValueError(
            f"query images must be uint8 pixels or floats in [0, 1], received "
            f"dtype {array.dtype} ({path})"
        )
    if array.shape[1:] != tuple(shape):
        raise ValueError(
            f"query images must have shape (n, {', '.join(map(str, shape))}), "
            f"received {array.shape} ({path})"
        )
    return array.astype(np.float32) if array.dtype.kind == "f" else array


def _read_image(path: str, shape) -> np.ndarray:
    """One encoded image file, decoded to `C` channels and resized to `H×W`."""
    try:
        image = tf.io.decode_image(
            tf.io.read_file(path), channels=shape[-1], expand_animations=False
        )
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        raise ValueError(
            f"not an image file TensorFlow can decode (PNG, JPEG, GIF, BMP or "
            f"WebP) or a .npy array ({path})"
        ) from None
    if tuple(image.shape[:2]) != tuple(shape[:2]):
        image = tf.image.resize(image, shape[:2], antialias=True)
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return image.numpy()[None]


def _read_query_images(paths: list[str], shape) -> tuple[list[str], np.ndarray]:
    """Query images from `.npy` arrays (uint8 `(n, H, W[, C])`) or image files."""
    shape = tuple(shape)
    names, batches = [], []
    for path in paths:
        check_file(path, "query image file")
        if path.endswith(".npy"):
            array = _read_npy(path, shape)
            names += [f"{path}[{i}]" for i in range(len(array))]
        else:
            array = _read_image(path, shape)
            names.append(path)
        batches.append(array)
    if len({batch.dtype for batch in batches}) > 1:
        batches = [retrieval.as_model_inputs(batch) for batch in batches]
    return names, np.concatenate(batches)


def run_search(args) -> int:
    check_int("-k", args.k, minimum=1)
    subic = _load_subic(args.model)
    paths = args.images
    if args.milvus is not None:
        index = _milvus(args)  # no index file: its place holds a query
        where = f"collection {args.collection!r} at {args.milvus}"
        paths = [args.index, *paths]
    else:
        if not paths:
            raise ValueError("give at least one query image after the index file")
        index = SubicIndex.load(args.index)
        where = f"index {args.index}"
    if (index.num_blocks, index.block_size) != (subic.num_blocks, subic.block_size):
        raise ValueError(
            f"{where} holds codes of {index.num_blocks} blocks of "
            f"{index.block_size}, but the model makes {subic.num_blocks} blocks of "
            f"{subic.block_size}"
        )
    shape = subic.train_model.inputs[0].shape[1:]
    names, images = _read_query_images(paths, shape)
    queries = subic.query(images, kind=args.query)
    # At most len(index) columns come back, whatever -k says; a Milvus
    # collection may leave some empty (id -1).
    scores, ids = index.search(queries, args.k)
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
    subic = _load_subic(args.model)
    images, labels = _split_images(args)
    options = {}
    if args.protocol == "random":
        if args.num_queries is not None:
            options["num_queries"] = args.num_queries
        else:
            options["queries_per_class"] = args.queries_per_class or 100
    if args.index and args.milvus:
        raise ValueError("give at most one of --index FILE and --milvus URI")
    index = SubicIndex.load(args.index) if args.index else None
    if args.milvus is not None:
        index = _milvus(args)
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


def run_export(args) -> int:
    """Exports a trained model for TF Serving and, optionally, LiteRT."""
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
    # Refuse before writing anything, so that no export is left half done. A
    # new version (no --version) replaces the LiteRT files: they always hold
    # the encoders of the latest export.
    if args.version is not None:
        target = os.path.join(args.output_dir, args.model_name, str(args.version))
        if os.path.exists(target) and not args.overwrite:
            raise FileExistsError(
                17, "version exists; pass --overwrite to replace it", target
            )
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
