"""What each `subic` command does; loaded (with TensorFlow) only to run one.

Each `run_*` function takes the parsed arguments of `subic_keras.cli.parser`
and returns the exit status.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import warnings

import numpy as np

from subic_keras import datasets, evaluation, protocols, retrieval, streams
from subic_keras import images as image_files
from subic_keras._io import atomic_path, check_file
from subic_keras.applications import WeightsUnavailableError, keras_cache
from subic_keras.cli.console import debug_requested, plural, printable, quiet_imports
from subic_keras.cli.train_options import config_from_args
from subic_keras.datasets import load_images
from subic_keras.export import export_litert, export_saved_model, load_subic
from subic_keras.paths import check_folder, open_file
from subic_keras.recipe import LearnedLittleWarning
from subic_keras.search import filters
from subic_keras.search import uri as search_uri
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.looks import LOOK_SIZE, VIEWS, query_look
from subic_keras.sockets import listen
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
    bits = config.num_blocks * int(math.log2(config.block_size))
    print(
        f"Training SuBiC ({config.num_blocks} blocks of {config.block_size}: "
        f"{bits} bits) on {_training_source(config)}: "
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


def _index_name(args, uri: str) -> str:
    """How messages name the index at `uri`."""
    if search_uri.is_database(uri):
        return f"collection {args.collection!r} at {uri}"
    return f"index {uri}"


def _open_index(args, uri: str):
    """The index at `uri`, and how messages name it."""
    _join_ray(args, uri)
    index = search_uri.open(
        uri, collection=args.collection, scanner=getattr(args, "scanner", "auto")
    )
    return index, _index_name(args, uri)


def _join_ray(args, uri) -> None:
    """Ray joined (or started) as `--ray-address` says, for a manifest."""
    if search_uri.is_manifest(uri):
        from subic_keras.search.ray_index import ray_module

        ray_module(getattr(args, "ray_address", None))


def run_index_build(args) -> int:
    if args.folder is not None:
        return _index_folder(args)
    subic = _load_subic(args.model)
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
        f"{_index_name(args, args.output)} ({plural(total, 'item')})"
    )
    return 0


def _index_folder(args, subic=None) -> int:
    if search_uri.is_manifest(args.output):
        return _index_folder_on_ray(args)
    subic = subic or _load_subic(args.model)
    index, report = retrieval.index_folder(
        subic,
        args.folder,
        batch_size=args.batch_size,
        progress=True,
        model_path=args.model,
    )
    index.save(args.output)
    _report_folder(report, index, args.output)
    return 0


def _index_folder_on_ray(args) -> int:
    import logging

    from subic_keras.ray_folders import index_folder_on_ray
    from subic_keras.search.ray_index import ray_module

    # The command's output is its own, not Ray Data's progress and notices.
    ray_module(args.ray_address)
    import ray.data  # its logging is configured on import, then quietened

    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    shards = args.shards or len([node for node in ray.nodes() if node["Alive"]])
    files, report = index_folder_on_ray(
        args.model, args.folder, args.output, shards, batch_size=args.batch_size
    )
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
    index = ImageIndex.load(args.index)
    folder = index.root if args.folder is None else args.folder
    check_folder(folder)
    subic = _load_subic(args.model)
    index, report = retrieval.index_folder(
        subic,
        folder,
        index=index,
        batch_size=args.batch_size,
        progress=True,
        model_path=args.model,
    )
    index.save(args.index)
    _report_folder(report, index, args.index)
    return 0


def run_index_remove(args) -> int:
    index = ImageIndex.load(args.index)
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
    index.save(args.index)
    print(f"removed {plural(removed, 'picture')}; {len(index):,} left in {args.index}")
    return 0


def _missing_files(index: ImageIndex, force: bool) -> list[str]:
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


def _npy_bytes(handle) -> tuple[int, int]:
    """The bytes a `.npy` file's header claims for its array, and the bytes
    that follow the header; `handle` is left at the start."""
    from numpy.lib import format as npy

    version = npy.read_magic(handle)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read(handle)
    held = os.fstat(handle.fileno()).st_size - handle.tell()
    handle.seek(0)
    return math.prod(shape) * dtype.itemsize, held


def _read_npy(path: str, shape) -> np.ndarray:
    """Images `(n, *shape)` from a `.npy` file (one image may lack the `n`).

    The header's claim is checked before NumPy allocates it: no more than
    the file holds, nor than a file may take (`images.FILE_DECODE_BYTES`).
    """
    limit = image_files.FILE_DECODE_BYTES
    with open_file(path) as handle:
        try:
            claimed, held = _npy_bytes(handle)
            if claimed <= min(held, limit):
                array = np.load(handle, allow_pickle=False)
        except (ValueError, EOFError) as error:
            raise ValueError(f"not a NumPy .npy array ({error}) ({path})") from None
    if claimed > limit:
        raise ValueError(
            f"query array too large: {claimed / 1e6:.0f} MB, more than the "
            f"{limit / 1e6:.0f} MB a file is read with ({path})"
        )
    if claimed > held:
        raise ValueError(
            f"truncated .npy array: its header claims {claimed:,} bytes, the file "
            f"holds {held:,} ({path})"
        )
    shape = tuple(shape)
    if shape[-1] == 1 and array.shape[-2:] == shape[:2]:
        array = array[..., None]  # grey images without a channel axis
    if array.shape == shape:
        array = array[None]  # one image
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
    if array.dtype.kind == "f":
        finite = np.isfinite(array)
        if not finite.all() or (array.size and (array.min() < 0 or array.max() > 1)):
            low, high = (
                (array[finite].min(), array[finite].max()) if finite.any() else (0, 0)
            )
            raise ValueError(
                "float query images must hold pixels in [0, 1] (or save uint8 "
                f"pixels in [0, 255]), received values in [{low:g}, {high:g}]"
                + ("" if finite.all() else " and NaN or infinity")
                + f" ({path})"
            )
        return array.astype(np.float32)
    return array


def _read_image(path: str, shape) -> np.ndarray:
    """One encoded image file, decoded to the model's `(H, W, C)`."""
    try:
        return image_files.read_image(path, shape)[None]
    except image_files.ImageDecodeError as error:
        raise ValueError(f"{error}: a query is a picture or a .npy array") from None


def _read_query_images(
    paths: list[str], shape
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Query images from `.npy` arrays (uint8 `(n, H, W[, C])`) or image
    files, and the fingerprints and looks of their pixels (0 and a look of
    zeros, which orders nothing, for float arrays)."""
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
    fingerprints = np.array(
        [
            image_files.fingerprint(image) if batch.dtype == np.uint8 else 0
            for batch in batches
            for image in batch
        ],
        dtype=np.uint64,
    )
    looks = np.concatenate(
        [
            query_look(batch)
            if batch.dtype == np.uint8
            else np.zeros((len(batch), VIEWS, LOOK_SIZE), np.int8)
            for batch in batches
        ]
    )
    if len({batch.dtype for batch in batches}) > 1:
        batches = [retrieval.as_model_inputs(batch) for batch in batches]
    return names, np.concatenate(batches), fingerprints, looks


def run_search(args) -> int:
    paths = args.images
    condition = _where(args)  # a bad filter is said before anything loads
    subic = _load_subic(args.model)
    index, where = _open_index(args, args.index)
    retrieval.check_model_fits(index, subic, where, args.model)
    names, images, fingerprints, looks = _read_query_images(
        paths, retrieval.input_shape(subic)
    )
    queries = subic.query(images, kind=args.query)
    # At most len(index) columns come back, whatever -k says; a Milvus
    # collection may leave some empty (id -1).
    answers = index.answer(
        queries, args.k, where=condition, fingerprints=fingerprints, looks=looks
    )
    for name, matches in zip(names, answers):
        _print_matches(name, [{"query": name, **match} for match in matches], args.json)
    if condition is not None and len(index) and not any(answers):
        # Said on standard error: `--json` keeps standard output parseable.
        given = " and ".join(
            option
            for option, value in (("--where", args.where), ("--under", args.under))
            if value is not None
        )
        print(
            f"subic search: no item of {printable(os.fspath(args.index))} passes "
            f"{given}: no match",
            file=sys.stderr,
        )
        return 1
    return 0


def _where(args) -> filters.Filter | None:
    """`--where EXPR` and `--under FOLDER`, both if both are given."""
    where = filters.parse(args.where) if args.where is not None else None
    if args.under is not None:
        under = filters.Under(args.under)
        where = under if where is None else where & under
    return where


def _print_matches(name: str, matches: list[dict], as_json: bool) -> None:
    if as_json:
        for match in matches:
            print(json.dumps(match))
        return
    print(printable(name))
    for match in matches:
        path = match["path"]
        where = printable(path) if path is not None else f"id {match['id']}"
        note = "  (the query itself)" if match["exact"] else ""
        print(f"  {match['rank']:>4}  {match['score']:>10.4f}  {where}{note}")


def run_serve(args) -> int:
    from subic_keras import http_app, server

    # Listened on by the command line's checks (a busy port is said before
    # TensorFlow loads); called otherwise, here.
    sock = getattr(args, "socket", None) or listen(args.host, args.port)
    _join_ray(args, args.index)
    service = server.SearchService(
        args.model,
        args.index,
        query=args.query,
        max_upload_bytes=int(args.max_upload_mb * 1e6),
        scanner=args.scanner,
        folder=args.folder,
        decode_bytes=int(args.max_decode_mb * 1e6),
    )
    http_app.run(service, sock=sock)
    return 0


def run_evaluate(args) -> int:
    subic = _load_subic(args.model)
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
    options = {}
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
        index, where = _open_index(args, args.index)
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
    split = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in options.items())
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
        # The converter prints its settings natively on stderr; the user
        # asked for a file, not for them (`--verbose` shows them).
        with quiet_imports(not debug_requested(args.verbose)):
            export_litert(
                subic, litert_path, quantization, representative_images=images
            )
        size = os.path.getsize(litert_path)
        print(f"LiteRT encoder ({quantization}): {litert_path} ({size} bytes)")
    return 0
