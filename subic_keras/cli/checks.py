"""What each command checks before TensorFlow loads: its paths and values.

A user's mistake (a missing or unreadable file, a directory where a file
belongs, a text file given as a model, a count of 0, options that do not
apply together) costs a second, not TensorFlow's start-up: `main` runs
`check(args)` before it imports the commands. NumPy, Pillow and the
standard library only.
"""

from __future__ import annotations

import math
import os

from subic_keras._io import check_file, check_keras_file, check_output_path
from subic_keras._validation import check_int
from subic_keras.config import TRAIN_OUTPUTS
from subic_keras.data.paths import check_folder, open_file
from subic_keras.models.weights_digest import block_shape, weights_digest
from subic_keras.pretrained import INSTANCE
from subic_keras.pretrained import path as pretrained_path
from subic_keras.search import filters, scanners
from subic_keras.search.addresses import check_database_exists, is_local
from subic_keras.search.checks import model_writer
from subic_keras.search.file_format import MAGIC, recorded_metadata
from subic_keras.search.manifests import read_manifest
from subic_keras.search.uri import is_database, is_manifest

# The largest upload or decoding memory a server is told to allow, in MB.
_MAX_MEGABYTES = 100_000.0


def check(args) -> None:
    """Raises the `USER_ERRORS` of `args`' command that need no model loaded."""
    checker = _CHECKS.get(args.run)
    if checker is not None:
        checker(args)


def refuse_given(args, names: tuple[str, ...], why: str) -> None:
    """Refuses the options `names` (argument names) that were given: they do
    not apply beside another one, and would otherwise be ignored."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in names
        if getattr(args, name, None) is not None
    ]
    if given:
        raise ValueError(f"{', '.join(given)} {why}")


def _data_dir(args) -> None:
    if getattr(args, "data_dir", None) is not None:
        path = os.path.expanduser(args.data_dir)
        if not os.path.isdir(path):
            raise FileNotFoundError(2, "data directory not found", path)
        if not os.access(path, os.R_OK | os.X_OK):
            raise PermissionError(13, "data directory: permission denied", path)


def _train(args) -> None:
    from subic_keras.cli.train_options import config_from_args

    config = config_from_args(args)  # checks every value
    _data_dir(args)
    for folder in (config.images, config.validation_images):
        if folder is not None:
            check_folder(folder)
            # Its classes, from the folder's layout alone (nothing decoded).
            from subic_keras.data.images import labelled_files

            labelled_files(folder)
    if os.path.exists(config.output_dir) and not os.path.isdir(config.output_dir):
        raise NotADirectoryError(
            20, "--output-dir is not a directory", config.output_dir
        )
    for name in TRAIN_OUTPUTS:
        path = os.path.join(config.output_dir, name)
        if args.overwrite or not os.path.lexists(path):
            continue
        if os.path.islink(path):
            raise FileExistsError(
                17,
                f"--output-dir holds a symbolic link where {name} goes; outputs "
                "are never written through a link: remove it, or --overwrite "
                "replaces the link itself",
                path,
            )
        if name == "logs" and not os.path.isdir(path):
            raise FileExistsError(
                17,
                "--output-dir holds a file named logs where the log folder goes: "
                "remove it, or --overwrite replaces it",
                path,
            )
        if args.run == "run_train":
            what, after = name, ""
            if name == "best.keras":
                what = "a model"
                after = " (an index built with it will then be refused)"
            raise FileExistsError(
                17,
                f"--output-dir already holds {what}; --overwrite replaces it"
                f"{after}, or choose another --output-dir",
                path,
            )


def _index(uri: str, collection: str) -> None:
    """A `.subic` file, or a Milvus Lite database, must exist; a Milvus
    server answers when opened."""
    if is_database(uri):
        check_database_exists(uri, collection)
    else:
        check_file(uri, "index file")


def _index_build(args) -> None:
    if args.output is None:
        raise ValueError(
            "give --output INDEX: a .subic file, or a Milvus .db path or server URL"
        )
    sharded = is_manifest(args.output)
    if not is_database(args.output):
        check_output_path(args.output)
        _ours_to_replace(args.output, sharded)
    else:
        _collection_holds(args.output, args.collection, args.folder is not None)
    check_int("--batch-size", args.batch_size, minimum=1)
    if sharded and args.folder is None:
        raise ValueError(
            "shards are built from a folder of pictures; give FOLDER, or write a "
            f".subic file, received --output {args.output}"
        )
    ray_options = (args.shards, args.encoders, args.ray_address)
    if not sharded and any(option is not None for option in ray_options):
        raise ValueError(
            "--shards, --encoders and --ray-address build shards: give an "
            "--output ending in .shards.json (a shard manifest), received "
            f"{args.output}"
        )
    if args.shards is not None:
        check_int("--shards", args.shards, minimum=1)
    if args.encoders is not None:
        check_int("--encoders", args.encoders, minimum=1)
    _model(args.model)
    if args.instance_model is not None:
        if args.folder is None:
            raise ValueError(
                "--instance-model keeps instance codes of a folder's pictures; "
                "an index of a dataset split keeps none: give FOLDER"
            )
        if args.instance_model != "none":
            _model(args.instance_model)
    if args.folder is not None:
        refuse_given(
            args,
            ("dataset", "data_dir", "split", "protocol", "seed"),
            f"select a dataset split; a folder of pictures ({args.folder}) takes "
            "none of them",
        )
        check_folder(args.folder)
    _data_dir(args)


def _collection_holds(uri: str, collection: str, pictures: bool) -> None:
    """A collection that exists holds what a build adds: a folder's pictures,
    or codes of a dataset split (said before anything is encoded)."""
    if is_local(uri) and not os.path.exists(uri):
        return  # a new database
    from subic_keras.search.milvus_pictures import MilvusPictures, open_collection

    try:
        opened = open_collection(uri, collection)
    except ValueError:
        return  # none of that name yet (or a fault the build will name)
    holds_pictures = isinstance(opened, MilvusPictures)
    opened.close()
    if holds_pictures and not pictures:
        raise ValueError(
            f"collection {collection!r} at {uri} holds a folder's pictures; index "
            "a dataset split into another collection (--collection NAME)"
        )
    if pictures and not holds_pictures:
        raise ValueError(
            f"collection {collection!r} at {uri} holds codes of a dataset split, "
            "without paths; index a folder into another collection "
            "(--collection NAME)"
        )


def _model(path: str) -> None:
    """`path` is a `.keras` file, or names the shipped instance code."""
    if path == INSTANCE:
        check_file(pretrained_path(), "shipped instance model")
    else:
        check_keras_file(path, members=False)


def _model_wrote(model: str, index: str) -> None:
    """Refuses, before TensorFlow loads, a model whose weights are not those
    of the model the index records (`weights_digest`; indexes that record
    none are checked once the model is loaded, `retrieval.check_model_fits`)."""
    if is_database(index):
        return
    shard = index
    if is_manifest(index):
        try:
            shard = read_manifest(index).shards[0]
        except (OSError, ValueError):
            return  # said when the manifest is opened
    metadata = recorded_metadata(shard) or {}
    path = os.path.abspath(pretrained_path() if model == INSTANCE else model)
    shape = block_shape(path)
    record = metadata.get("model")
    instance = metadata.get("instance_model")
    # An index that keeps instance codes beside class codes is searched by
    # either model (`ImageIndex.by_instance`): the instance code's record
    # is the one to check where the model is of its shape and not the class
    # code's weights.
    if isinstance(instance, dict) and shape == (
        instance.get("num_blocks"),
        instance.get("block_size"),
    ):
        wrote = (record or {}).get("weights_file") if isinstance(record, dict) else None
        if wrote is None or wrote != weights_digest(path):
            record = instance
    record = record if isinstance(record, dict) else {}
    recorded = (record.get("num_blocks"), record.get("block_size"))
    if shape is not None and all(isinstance(v, int) for v in recorded):
        if shape != recorded:
            raise ValueError(
                f"index {index} holds codes of {recorded[0]} blocks of "
                f"{recorded[1]}, but the model makes {shape[0]} blocks of {shape[1]}"
            )
    wrote = record.get("weights_file")
    if not isinstance(wrote, str):
        return
    weights = weights_digest(path)
    if weights is None or weights == wrote:
        return
    raise ValueError(
        f"index {index} was written by {model_writer(record, path)} (weights "
        f"{wrote[:12]}), not by "
        f"{path} (weights {weights[:12]}): their weights differ; build the "
        "index again with this model (`subic index build`)"
    )


def _ours_to_replace(path: str, manifest: bool) -> None:
    """Refuses an existing `--output` that is not an index (or a manifest)
    of ours: a build replaces an index, never a user's other file."""
    if not os.path.isfile(path) or os.path.islink(path):
        return  # new, or refused as a link by `check_output_path`
    try:
        if manifest:
            read_manifest(path)
            return
        with open_file(path) as handle:
            if handle.read(len(MAGIC)) == MAGIC:
                return
    except (OSError, ValueError):
        pass
    kind = "a shard manifest" if manifest else "a SuBiC index file"
    raise FileExistsError(
        17,
        f"--output names a file that is not {kind}; a build replaces only an "
        "index of its own: remove the file, or choose another --output",
        path,
    )


def _index_add(args) -> None:
    check_int("--batch-size", args.batch_size, minimum=1)
    _index(args.index, args.collection)
    _model(args.model)
    _model_wrote(args.model, args.index)
    if args.folder is not None:
        check_folder(args.folder)


def _index_remove(args) -> None:
    _index(args.index, args.collection)
    if not args.paths and not args.missing:
        raise ValueError("give the paths to remove, or --missing")
    if args.force and not args.missing:
        raise ValueError("--force goes with --missing")


def _scanner(args) -> None:
    """`--scanner` names a scanner this machine runs (for some block shape)."""
    try:
        scanners.resolve(args.scanner, 1, 16)
    except ValueError as error:
        raise ValueError(f"--{error}") from None


def _ray_address(args) -> None:
    if args.ray_address is not None and not is_manifest(args.index):
        raise ValueError(
            "--ray-address applies to an index of shards (a .shards.json "
            f"manifest), received {args.index}"
        )


def _search(args) -> None:
    _scanner(args)
    _ray_address(args)
    if args.where is not None:
        filters.parse(args.where)  # its syntax; its fields are checked on the index
    check_int("-k", args.k, minimum=1)
    _model(args.model)
    if not args.images:
        raise ValueError("give at least one query image after the index")
    _index(args.index, args.collection)
    _model_wrote(args.model, args.index)
    # Pillow, for the headers: loaded here, not for `--help`.
    from subic_keras.data.images import ImageDecodeError, check_picture

    for path in args.images:
        check_file(path, "query image file")
        if not path.endswith(".npy"):
            try:
                check_picture(path)
            except ImageDecodeError as error:
                raise ValueError(
                    f"{error}: a query is a picture or a .npy array"
                ) from None


def _train_instance(args) -> None:
    check_folder(args.folder)
    check_int("--epochs", args.epochs, minimum=1)
    check_int("--batch-size", args.batch_size, minimum=2)
    _model(args.start)
    check_output_path(args.output)
    if os.path.lexists(args.output) and not args.overwrite:
        raise FileExistsError(
            17, "--output exists; give --overwrite to replace it", args.output
        )


def _duplicates(args) -> None:
    _ray_address(args)
    _index(args.index, args.collection)
    if is_manifest(args.index):
        read_manifest(args.index)  # said before Ray starts
    if args.copy_blocks is not None:
        check_int("--copy-blocks", args.copy_blocks, minimum=1)


def _megabytes(name: str, value: float, minimum: float) -> None:
    if not (math.isfinite(value) and minimum <= value <= _MAX_MEGABYTES):
        raise ValueError(
            f"{name} must be a number of MB in [{minimum:g}, {_MAX_MEGABYTES:g}], "
            f"received {value}"
        )


def _serve(args) -> None:
    _scanner(args)
    _ray_address(args)
    port = check_int("--port", args.port, minimum=0)
    if port > 65535:
        raise ValueError(f"--port must be <= 65535, received {port}")
    if not args.host.strip():
        raise ValueError(
            "--host must name an address (127.0.0.1: this machine only; 0.0.0.0 or "
            f":: every interface), received {args.host!r}"
        )
    _megabytes("--max-upload-mb", args.max_upload_mb, 0.001)
    _megabytes("--max-decode-mb", args.max_decode_mb, 1)
    _model(args.model)
    _index(args.index, args.collection)
    _model_wrote(args.model, args.index)
    if args.folder is not None:
        check_folder(args.folder)
    # Listening now says a busy port at once; `run_serve` serves on it.
    from subic_keras.serving.sockets import listen

    args.socket = listen(args.host, port)


def _evaluate(args) -> None:
    _scanner(args)
    if args.output is not None:
        check_output_path(args.output)
    for name in ("queries_per_class", "num_queries"):
        value = getattr(args, name)
        if value is not None:
            check_int(f"--{name.replace('_', '-')}", value, minimum=1)
    if args.protocol in ("paper", "dsh"):
        refuse_given(
            args,
            ("queries_per_class", "num_queries"),
            f"cannot go with --protocol {args.protocol}: only the random "
            "protocol takes a number of queries",
        )
    if args.protocol == "unseen":
        refuse_given(
            args,
            ("num_queries", "images"),
            "cannot go with --protocol unseen: it draws --queries-per-class "
            "from the held-out classes of a dataset",
        )
    if args.images is not None:
        refuse_given(
            args,
            ("dataset", "data_dir", "split", "index"),
            "select a dataset split or its codes; --images takes none of them",
        )
        check_folder(args.images)
    check_keras_file(args.model, members=False)
    if args.index is not None:
        _index(args.index, args.collection)
    _data_dir(args)


def _export(args) -> None:
    if args.int8 and args.representative_data is None:
        raise ValueError(
            "--int8 needs --representative-data (calibration images), received none"
        )
    check_int("--num-representative", args.num_representative, minimum=1)
    _model(args.model)
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise NotADirectoryError(20, "--output-dir is not a directory", args.output_dir)
    if args.version is not None:
        target = os.path.join(args.output_dir, args.model_name, str(args.version))
        if os.path.lexists(target) and not args.overwrite:
            raise FileExistsError(
                17, "version exists; pass --overwrite to replace it", target
            )
    _data_dir(args)


_CHECKS = {
    "run_quickstart": _train,
    "run_train": _train,
    "run_index_build": _index_build,
    "run_index_add": _index_add,
    "run_index_remove": _index_remove,
    "run_search": _search,
    "run_serve": _serve,
    "run_evaluate": _evaluate,
    "run_export": _export,
    "run_duplicates": _duplicates,
    "run_train_instance": _train_instance,
}
