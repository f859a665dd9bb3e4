"""What each `subic` command does; loaded (with TensorFlow) only to run one.

Each `run_*` function takes the parsed arguments of `subic_keras.cli.parser`
and returns the exit status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings

import numpy as np

from subic_keras._io import atomic_path
from subic_keras.cli.console import debug_requested, plural, printable, quiet_imports
from subic_keras.cli.loading import index_name, load_model, open_index, open_pictures

# Each command's `run_*` function is found here by name (`subic_keras.cli`).
from subic_keras.cli.search_commands import run_duplicates as run_duplicates
from subic_keras.cli.search_commands import run_search as run_search
from subic_keras.cli.search_commands import run_serve as run_serve
from subic_keras.cli.search_commands import (
    run_train_instance as run_train_instance,
)
from subic_keras.cli.train_options import config_from_args
from subic_keras.data import datasets, protocols, streams
from subic_keras.data.datasets import load_images
from subic_keras.data.paths import check_folder
from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.instance import folder_rules
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.models.applications import WeightsUnavailableError, keras_cache
from subic_keras.pretrained import INSTANCE
from subic_keras.search import uri as search_uri
from subic_keras.serving import retrieval
from subic_keras.serving.export import (
    export_litert,
    export_saved_model,
    load_encoder,
)
from subic_keras.trainers.recipe import LearnedLittleWarning
from subic_keras.training import train


def _report_training(summary: dict) -> None:
    if summary.get("warning"):
        print(f"warning: {summary['warning']}", file=sys.stderr)
    if summary["stopped_on_nan"]:
        kept = summary["checkpoint"] or "no checkpoint (no epoch finished cleanly)"
        print(
            f"Training stopped: the loss became NaN in epoch {summary['epochs_run']}. "
            f"Kept the last good model: {kept}",
            file=sys.stderr,
        )
    if summary["checkpoint"] is None:
        return
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
    test = summary.get("test")
    if test:
        print(
            f"test accuracy {test['accuracy_soft']:.4f} (soft codes), "
            f"{test['accuracy_binary']:.4f} ({summary['bits']}-bit binary codes)"
        )
    print(f"model: {summary['checkpoint']}")


def _announce(config) -> None:
    """States the plan, warm-up included, before the first epoch."""
    recipe = config.recipe()
    print(
        f"Training SuBiC ({config.num_blocks} blocks of {config.block_size}: "
        f"{config.bits} bits) on {_training_source(config)}: "
        f"{plural(config.pretrain_epochs, 'epoch')} of pre-training, then "
        f"{plural(config.epochs, 'SuBiC epoch')} with gamma = "
        f"{config.gamma:g} and mu = {config.mu:g} ramped in from 0 over the first "
        f"{recipe.warmup_epochs:.3g} epochs (--warmup-epochs); the best epoch is kept."
    )
    created = "" if os.path.isdir(config.output_dir) else " (a new folder)"
    print(f"Writing the model and its logs to {config.output_dir}{created}.")


def _training_source(config) -> str:
    if config.images is None:
        return config.dataset
    size = config.image_size
    return f"the pictures of {config.images} (resized to {size}x{size})"


def _report_skipped(skipped: list) -> None:
    """The files the folder check passed over, before training starts."""
    _list_skipped(skipped)
    if skipped:
        count = plural(len(skipped), "file")
        print(f"skipped {count} (listed with the reason on stderr)", flush=True)


def run_train(args) -> int:
    config = config_from_args(args)
    _announce(config)
    with warnings.catch_warnings():  # said once, at the end (`_report_training`)
        warnings.simplefilter("ignore", LearnedLittleWarning)
        try:
            summary = train(
                config, on_skipped=_report_skipped, overwrite=args.overwrite
            )
        except WeightsUnavailableError as error:
            raise OSError(
                f"--weights imagenet: the ImageNet weights of {error.name} are not "
                f"in Keras's cache ({keras_cache()}) and could not be downloaded "
                f"({error.reason}); copy them there from a machine with network "
                "access, or give a weights file (--weights FILE), or --weights none"
            ) from None
    _report_training(summary)
    return 1 if summary["stopped_on_nan"] else 0


def run_quickstart(args) -> int:
    """Trains on the bundled digits, indexes, searches, prints retrieval mAP."""
    start = time.time()
    config = config_from_args(args)
    _announce(config)
    with warnings.catch_warnings():  # said once, at the end (`_report_training`)
        warnings.simplefilter("ignore", LearnedLittleWarning)
        summary = train(
            config, verbose=0, on_skipped=_report_skipped, overwrite=args.overwrite
        )
    _report_training(summary)
    if summary["checkpoint"] is None:
        return 1
    subic = load_model(summary["checkpoint"])
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


def _follow_model(args, subic) -> dict:
    """The data options not given, from what the model was trained on.

    `subic train` records its dataset and data directory, or its folder
    (`SubicTrainModel.data_source`); with no data option given, a command
    uses them (a model without the record: CIFAR-10's test split). Returns
    the record (empty when options were given or none is recorded).
    """
    given = [
        name
        for name in ("dataset", "data_dir", "images", "folder")
        if getattr(args, name, None) is not None
    ]
    source = (
        {} if given else dict(getattr(subic.train_model, "data_source", None) or {})
    )
    if not source.get("images"):
        args.dataset = args.dataset or source.get("dataset") or "cifar10"
        if args.data_dir is None:
            args.data_dir = source.get("data_dir")
        args.split = args.split or "test"
    return source


def _dataset_protocol(args, source: str, smallest: int) -> str:
    """`--protocol`, or the paper's where every class has more than its 100
    queries, else random queries (a fifth of the smallest class per class)."""
    if args.protocol is None:
        return "paper" if smallest > 100 else "random"
    if args.protocol == "paper" and smallest <= 100:
        raise ValueError(
            f"the paper protocol takes 100 queries per class, and {source} holds "
            f"{smallest} pictures in its smallest class; use --protocol random "
            "(with --queries-per-class N)"
        )
    return args.protocol


def _split_images(args):
    train_part, test_part = load_images(args.dataset, args.data_dir)
    return train_part if args.split == "train" else test_part


def _write_json(path: str | None, result: dict) -> None:
    print(json.dumps(result))
    if path:
        with atomic_path(path) as tmp, open(tmp, "w") as handle:
            json.dump(result, handle, indent=2)


def run_index_build(args) -> int:
    if args.folder is not None:
        return _index_folder(args)
    subic = load_model(args.model, instance=True)
    source = _follow_model(args, subic)
    if source.get("images"):
        args.folder = source["images"]
        return _index_folder(args, subic)
    images, labels = _split_images(args)
    ids = np.arange(len(images))
    if args.protocol is not None:
        _, ids = protocols.protocol_split(args.protocol, labels, seed=args.seed or 0)
    added, total = search_uri.add_codes(
        args.output,
        subic.encode(images[ids], batch_size=args.batch_size),
        ids,
        num_blocks=subic.num_blocks,
        block_size=subic.block_size,
        collection=args.collection,
        model=retrieval.model_record(subic, args.model),
    )
    print(
        f"indexed {plural(len(added), f'{args.dataset} {args.split} image')} into "
        f"{index_name(args, args.output)} ({plural(total, 'item')})"
    )
    return 0


def _index_folder(args, subic=None) -> int:
    if search_uri.is_manifest(args.output):
        return _index_folder_on_ray(args)
    subic = subic or load_model(args.model, instance=True)
    instance, name = None, args.instance_model or INSTANCE
    if name != "none" and not isinstance(subic, InstanceSubic):
        instance = load_model(name, instance=True)
        if not isinstance(instance, InstanceSubic):
            raise ValueError(
                f"--instance-model must be an instance code, received the class "
                f"model {name}"
            )
    into = None
    if search_uri.is_database(args.output):  # added to as it goes
        into = retrieval.folder_collection(
            args.output, args.collection, subic, args.folder, args.model,
            instance, name,
        )  # fmt: skip
    index, report = retrieval.index_folder(
        subic,
        args.folder,
        index=into,
        batch_size=args.batch_size,
        progress=True,
        model_path=args.model,
        instance=instance,
        instance_path=name,
    )
    _refuse_empty(index, report, args.folder)
    rules = retrieval.choose_copy_rules(
        index, subic, instance, batch_size=args.batch_size
    )
    index.persist(args.output)
    _report_folder(report, index, index_name(args, args.output))
    _report_rules(rules)
    return 0


def _refuse_empty(index, report: retrieval.FolderReport, folder) -> None:
    """An index of no picture is refused, saying why, before it is saved."""
    if len(index):
        return
    found = "it holds no file"
    if report.skipped:
        first = report.skipped[0]
        found = (
            f"none of its {plural(len(report.skipped), 'file')} decoded "
            f"({printable(first.path)}: {printable(first.reason)})"
        )
    raise ValueError(f"no picture to index in {printable(os.fspath(folder))}: {found}")


def _report_rules(rules: dict | None) -> None:
    """The copy rules chosen on the folder, in one line (none for class
    codes alone: they mark exact copies only)."""
    if rules is not None:
        print(folder_rules.rules_line(rules))


def _index_folder_on_ray(args) -> int:
    import logging

    from subic_keras.search.ray_cluster import ray_module
    from subic_keras.serving.ray_folders import index_folder_on_ray

    # The command's output is its own, not Ray Data's progress and notices.
    ray_module(args.ray_address)
    import ray.data  # its logging is configured on import, then quietened

    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    shards = args.shards or len([node for node in ray.nodes() if node["Alive"]])
    instance = args.instance_model or INSTANCE
    files, report = index_folder_on_ray(
        args.model, args.folder, args.output, shards, batch_size=args.batch_size,
        instance_model=None if instance == "none" else instance,
        encoders=args.encoders,
    )  # fmt: skip
    _list_skipped(report.skipped)
    known = (
        f", {report.already_indexed} already in finished shards"
        if report.already_indexed
        else ""
    )
    print(
        f"indexed {plural(report.added, 'picture')} of "
        f"{printable(os.path.realpath(args.folder))}{known}; skipped "
        f"{plural(len(report.skipped), 'file')}; {plural(len(files), 'shard')} "
        f"listed in {args.output}"
    )
    _report_rules(report.copy_rules)
    return 0


def _list_skipped(skipped: list) -> None:
    """Each file that was passed over, and why, on standard error."""
    for entry in skipped:
        if not isinstance(entry, dict):
            entry = dataclasses.asdict(entry)
        path, reason = printable(entry["path"]), printable(entry["reason"])
        print(f"skipped {path}: {reason}", file=sys.stderr)


def _report_folder(report: retrieval.FolderReport, index, output: str) -> None:
    _list_skipped(report.skipped)
    known = (
        f", {report.already_indexed} already indexed" if report.already_indexed else ""
    )
    skipped = plural(len(report.skipped), "file")
    if report.skipped:
        skipped += " (listed with the reason on stderr)"
    print(
        f"indexed {plural(report.added, 'picture')} of {printable(index.root)}{known}; "
        f"skipped {skipped}; {plural(len(index), 'picture')} in {output}"
    )


def run_index_add(args) -> int:
    index = open_pictures(args, args.index)
    folder = index.root if args.folder is None else args.folder
    check_folder(folder)
    subic = load_model(args.model, instance=True)
    instance = retrieval.instance_encoder(index)
    index, report = retrieval.index_folder(
        subic,
        folder,
        index=index,
        batch_size=args.batch_size,
        progress=True,
        model_path=args.model,
        instance=instance,
    )
    rules = None
    if folder_rules.rules_stale(index.copy_record, len(index)):
        rules = retrieval.choose_copy_rules(
            index, subic, instance, batch_size=args.batch_size
        )
    index.persist(args.index)
    _report_folder(report, index, index_name(args, args.index))
    _report_rules(rules)
    return 0


def run_index_remove(args) -> int:
    index = open_pictures(args, args.index)
    paths = list(args.paths)
    unknown = [path for path in paths if path not in index]
    if unknown:
        raise ValueError(
            f"{len(unknown)} paths are not in the index, none removed: "
            f"{', '.join(unknown[:5])}"
        )
    if args.missing:
        paths += _missing_files(index, args.force)
    removed = index.remove(paths)
    index.persist(args.index)
    print(
        f"removed {plural(removed, 'picture')}; {len(index):,} left in "
        f"{index_name(args, args.index)}"
    )
    return 0


def _missing_files(index, force: bool) -> list[str]:
    """The paths whose files are gone; refused (unless `force`) when the
    folder itself is gone or every picture would go: more likely a moved or
    unmounted folder than pictures deleted one by one."""
    if not os.path.isdir(index.root):
        if not force:
            raise FileNotFoundError(
                2,
                f"the indexed folder is gone, so --missing would remove all "
                f"{len(index)} pictures; none removed (--force removes them)",
                index.root,
            )
        return index.get_paths()
    missing = [
        path
        for path in index.get_paths()
        if not os.path.isfile(os.path.join(index.root, path))
    ]
    if missing and len(missing) == len(index) and not force:
        raise ValueError(
            f"every one of the {len(index)} pictures is missing from "
            f"{printable(index.root)}; none removed (--force removes them)"
        )
    return missing


def run_evaluate(args) -> int:
    subic = load_model(args.model)
    if args.images is None:
        args.images = _follow_model(args, subic).get("images")
    if args.images is not None:
        height, width, channels = retrieval.input_shape(subic)
        # Streamed: the pictures are decoded a batch at a time, twice.
        folder = datasets.image_folder(
            args.images, (height, width), channels=channels, shuffle=False
        )
        _list_skipped(folder.skipped)
        images = folder.training
        labels = streams.summarize(images).labels
        source = f"pictures of {args.images} ({len(folder.class_names)} classes)"
        protocol = args.protocol or "random"
        smallest = int(np.bincount(labels).min())
        per_class = args.queries_per_class or max(1, min(100, smallest // 5))
    else:
        images, labels = _split_images(args)
        source = f"{args.dataset} {args.split}"
        smallest = int(np.bincount(labels).min())
        protocol = _dataset_protocol(args, source, smallest)
        per_class = args.queries_per_class or (
            100 if smallest > 100 else max(1, smallest // 5)
        )
    options: dict = {}
    if protocol == "unseen":
        options["classes"] = _held_out_classes(subic, args.model)
        options["queries_per_class"] = args.queries_per_class or 100
        source += f", classes {options['classes']} (held out of training)"
    if protocol == "random":
        if args.num_queries is not None:
            options["num_queries"] = args.num_queries
        else:
            options["queries_per_class"] = per_class
    ks: tuple[int, ...] = (10, 100)
    if args.images is not None and protocol == "random":
        # A folder may hold fewer pictures than the k of precision@k.
        queries = options.get("num_queries", per_class * len(np.unique(labels)))
        database = max(1, len(labels) - queries)
        ks = tuple(k for k in ks if k <= database) or (database,)
    index = None
    if args.index:
        index, where = open_index(args, args.index)
        retrieval.check_model_fits(index, subic, where, args.model)
    start = time.time()
    result = retrieval.evaluate(
        subic,
        images,
        labels,
        protocol,
        seed=args.seed,
        index=index,
        ties=args.ties,
        query=args.query,
        ks=ks,
        **options,
    )
    result.update(
        {
            "model": args.model,
            "dataset": args.dataset,
            "images": args.images,
            "split": args.split,
            "seed": args.seed,
            "wall_seconds": round(time.time() - start, 1),
        }
    )
    split = ", ".join(
        f"{k.replace('_', ' ')} {v}" for k, v in options.items() if k != "classes"
    )
    print(
        f"{source}, protocol {protocol!r}"
        + (f" ({split}, seed {args.seed})" if split else "")
        + f": mAP {result['map']:.4f} ({args.ties} ties; "
        f"{result['map_expected']:.4f} expected over tie orders), "
        f"precision@{ks[0]} {result[f'precision@{ks[0]}']:.4f} "
        f"({result['num_queries']} queries, "
        f"{result['num_database']} database, {result['bits']} bits)"
    )
    _write_json(args.output, result)
    return 0


def _held_out_classes(subic, model: str) -> list[int]:
    """The classes `model` was trained without (`subic train
    --exclude-classes`), recorded in it."""
    held = (subic.train_model.data_source or {}).get("held_out_classes")
    if not held:
        raise ValueError(
            f"--protocol unseen retrieves among the classes the model was trained "
            f"without, and {model} was trained on every class; train one with "
            "`subic train --exclude-classes IDS`"
        )
    return [int(c) for c in held.split(",")]


def run_export(args) -> int:
    """Exports a trained model for TF Serving and, optionally, LiteRT."""
    count = args.num_representative
    litert = {}
    if args.litert:
        litert["float32"] = os.path.join(args.output_dir, f"{args.model_name}.tflite")
    if args.int8:
        litert["int8"] = os.path.join(args.output_dir, f"{args.model_name}_int8.tflite")
    # An existing version was refused before anything was written (`checks`),
    # so that no export is left half done. A new version (no --version)
    # replaces the LiteRT files: they always hold the latest encoders.
    subic = load_encoder(args.model)
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
        # The converter prints its settings natively on stderr; the user
        # asked for a file, not for them (`--verbose` shows them).
        with quiet_imports(not debug_requested(args.verbose)):
            export_litert(
                subic, litert_path, quantization, representative_images=images
            )
        size = os.path.getsize(litert_path)
        print(f"LiteRT encoder ({quantization}): {litert_path} ({size} bytes)")
    return 0
