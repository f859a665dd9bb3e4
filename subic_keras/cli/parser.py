"""The `subic` command line's arguments, with no TensorFlow import.

`build_parser` describes every command and option; `--help` and argument
errors need nothing heavier than this module, so they are instant.
"""

from __future__ import annotations

import argparse

import subic_keras
from subic_keras.cli.train_options import QUICKSTART, add_train_arguments
from subic_keras.cli.train_options import config_from_args as config_from_args
from subic_keras.config import DATASETS, QUERY_KINDS, TrainConfig

MODEL_HELP = (
    "a SuBiC .keras model, or `instance`: the instance code that ships with "
    "the package, which finds copies of pictures without any training"
)


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="show TensorFlow's log lines and the traceback of an error "
        "(default: off; SUBIC_DEBUG=1 turns it on too)",
    )


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="cifar10",
        help="dataset of the images (default: %(default)s)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="directory of the dataset's official files (default: tensorflow-datasets)",
    )
    parser.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="the dataset's split (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the protocol's query/database split (default: %(default)s)",
    )


def _add_query_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--query",
        choices=QUERY_KINDS,
        default=None,
        help="the query of asymmetric search: fc0, the paper's z, or "
        "class_posterior, FC1's kernel times the query's class posterior "
        "(default: the query chosen on validation and saved with the model; "
        "fc0 on the unseen protocol, whose classes the class posterior does "
        "not know)",
    )


def _add_ray_address(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help=f"the Ray cluster to {what}; 'local' starts one on this machine "
        "(default: RAY_ADDRESS, else the cluster Ray last started here, else "
        "a new one here; one that does not answer is said at once)",
    )


def _add_model_and_index(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", help="the SuBiC .keras model that built the index, or `instance`"
    )
    parser.add_argument(
        "index", help="an index built from a folder: a .subic file or a Milvus one"
    )


def _add_batch_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="pictures decoded and encoded at a time (default: %(default)s)",
    )


# An index is named by one URI (subic_keras.search.uri).
INDEX_URI = (
    "a .subic file, a Milvus Lite database (a path ending in .db) or a Milvus "
    "server such as http://localhost:19530 (Milvus needs the [milvus] extra)"
)


def _add_collection_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collection",
        default="subic",
        help="the collection, where the index is a Milvus one (default: %(default)s)",
    )


def _add_scanner_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scanner",
        default="auto",
        help="what scans a .subic file's codes: auto, native-vbmi, "
        "native-avx512bw, native-avx2, native-neon, native-portable, faiss or "
        "faiss-fastscan, as far as this machine runs them (default: "
        "%(default)s, the fastest)",
    )


def _add_export_parser(commands, common) -> None:
    export = commands.add_parser(
        "export",
        parents=[common],
        help="export a trained model for TF Serving (SavedModel) and LiteRT",
        description="Writes OUTPUT_DIR/MODEL_NAME/VERSION/ (a SavedModel with the "
        "signatures serving_default, encode_images and classify; an instance "
        "code has no classify) and, with "
        "--litert / --int8, OUTPUT_DIR/MODEL_NAME.tflite / MODEL_NAME_int8.tflite. "
        "Exporting again writes the next version and replaces the LiteRT files "
        "with its encoders; an existing version is replaced only with --overwrite.",
    )
    export.add_argument("model", help=MODEL_HELP)
    export.add_argument(
        "--output-dir", required=True, help="TF Serving's base directory (required)"
    )
    export.add_argument(
        "--model-name",
        default="subic",
        help="the model's name under --output-dir (default: %(default)s)",
    )
    export.add_argument(
        "--version",
        type=int,
        default=None,
        help="version directory (default: one more than the largest existing)",
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --version (default: off)",
    )
    export.add_argument(
        "--litert",
        action="store_true",
        help="also write a float32 LiteRT encoder (default: off)",
    )
    export.add_argument(
        "--int8",
        action="store_true",
        help="also write a full-integer (int8) LiteRT encoder (default: off)",
    )
    export.add_argument(
        "--representative-data",
        choices=DATASETS,
        default=None,
        help="training images that calibrate the int8 quantisation (required "
        "with --int8)",
    )
    export.add_argument(
        "--data-dir",
        default=None,
        help="the representative dataset's directory (default: tensorflow-datasets)",
    )
    export.add_argument(
        "--num-representative",
        type=int,
        default=200,
        help="number of calibration images (default: %(default)s)",
    )
    export.set_defaults(run="run_export", command_name="export")


def _add_train_instance_parser(commands, common) -> None:
    """`subic train-instance`: the instance code fine-tuned on a folder."""
    tune = commands.add_parser(
        "train-instance",
        parents=[common],
        help="fine-tune the instance code on a folder of pictures (no labels)",
    )
    tune.add_argument("folder", help="the pictures, in any layout: no classes")
    tune.add_argument(
        "--output", required=True, help="the .keras file to write (required)"
    )
    tune.add_argument(
        "--from",
        dest="start",
        default="instance",
        help="the instance code to start from: a .keras file, or `instance`, "
        "the one that ships (default: %(default)s)",
    )
    tune.add_argument(
        "--epochs", type=int, default=5, help="passes over the folder (default: 5)"
    )
    tune.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="pictures a batch, each seen as two copies (default: %(default)s)",
    )
    tune.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output (default: refuse)",
    )
    tune.set_defaults(run="run_train_instance", command_name="train-instance")


def _add_index_build_parser(index_commands, common) -> None:
    """`subic index build`: a folder or a dataset split encoded into an index."""
    build = index_commands.add_parser(
        "build",
        parents=[common],
        help="encode a folder of pictures, or a dataset split, into an index file",
        description="With FOLDER: encodes every picture under it (recursively; "
        "JPEG, PNG, BMP, GIF, WebP of any size), keeping each one's path "
        "relative to FOLDER; files that are not pictures are skipped and "
        "listed. Without: encodes a dataset split, ids the positions in it.",
    )
    build.add_argument("model", help=MODEL_HELP)
    build.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="a folder of pictures to index (default: none, index --dataset)",
    )
    _add_data_arguments(build)
    # Unset unless given, so that they can be refused beside FOLDER.
    build.set_defaults(dataset=None, split=None, seed=None)
    build.add_argument(
        "--protocol",
        choices=("paper", "dsh"),
        default=None,
        help="index only this protocol's database part, ids the positions in "
        "the split (default: the whole split)",
    )
    build.add_argument(
        "--output",
        metavar="INDEX",
        default=None,
        help=f"where the codes go: {INDEX_URI}. A file is written anew, a Milvus "
        "collection added to (required)",
    )
    _add_batch_argument(build)
    _add_collection_argument(build)
    build.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="with FOLDER and an --output ending in .shards.json (a shard "
        "manifest): encode on Ray into N shard files beside it (default: one "
        "per node of the Ray cluster); an interrupted build resumes where it "
        "stopped",
    )
    build.add_argument(
        "--encoders",
        type=int,
        default=None,
        metavar="E",
        help="with --output X.shards.json: the Ray actors that encode the "
        "pictures, one CPU each (default: the cluster's CPUs but one, at least "
        "one)",
    )
    build.add_argument(
        "--instance-model",
        metavar="MODEL",
        default=None,
        help="with FOLDER and a class model: the instance "
        "code kept of every picture beside the class code, so that a search "
        "lists the query's copies first (default: `instance`, the one that "
        "ships; a .keras file of `subic train-instance`; `none`: none)",
    )
    _add_ray_address(build, "build shards on")
    build.set_defaults(run="run_index_build", command_name="index build")


def _add_index_add_parser(index_commands, common) -> None:
    """`subic index add`: a folder's new pictures added to its index."""
    add = index_commands.add_parser(
        "add",
        parents=[common],
        help="add a folder's new pictures to its index file",
        description="Encodes the pictures under FOLDER that the index does not "
        "hold yet (by path) and rewrites the index file atomically, or adds them "
        "to the Milvus collection.",
    )
    _add_model_and_index(add)
    _add_collection_argument(add)
    add.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="the indexed folder (default: the folder recorded in the index)",
    )
    _add_batch_argument(add)
    add.set_defaults(run="run_index_add", command_name="index add")


def _add_index_remove_parser(index_commands, common) -> None:
    """`subic index remove`: pictures removed from an index by path."""
    remove = index_commands.add_parser(
        "remove",
        parents=[common],
        help="remove pictures from a folder's index file by path",
    )
    remove.add_argument(
        "index", help="an index built from a folder: a .subic file or a Milvus one"
    )
    _add_collection_argument(remove)
    remove.add_argument(
        "paths",
        nargs="*",
        help="paths relative to the indexed folder, as `subic search` prints them",
    )
    remove.add_argument(
        "--missing",
        action="store_true",
        help="also remove every picture whose file is gone; refused when the "
        "folder itself is gone or every picture would go (default: off)",
    )
    remove.add_argument(
        "--force",
        action="store_true",
        help="with --missing, remove them even then (default: off)",
    )
    remove.set_defaults(run="run_index_remove", command_name="index remove")


def _add_search_parser(commands, common) -> None:
    """`subic search`: an index searched with query pictures."""
    search = commands.add_parser(
        "search", parents=[common], help="search an index with query images"
    )
    search.add_argument("model", help=MODEL_HELP)
    search.add_argument("index", help=f"the index: {INDEX_URI}")
    search.add_argument(
        "images",
        nargs="*",
        help=".npy uint8 arrays (n, H, W[, C]) or image files (PNG, JPEG, GIF, "
        "BMP, WebP)",
    )
    search.add_argument(
        "-k",
        type=int,
        default=10,
        help="results per query, at least 1; at most the index's size are "
        "printed (default: %(default)s)",
    )
    _add_query_argument(search)
    _add_ray_address(search, "search a shard manifest's shards on")
    search.add_argument(
        "--where",
        metavar="EXPR",
        help="return only the items this filter keeps, e.g. \"class == 'cat' and "
        'added > 1700000000" (fields: id, path, class, added, attrs.NAME; '
        "==, !=, <, <=, >, >=, in [...], path under '...', and, or, not); the "
        "exact k best of them (default: all)",
    )
    search.add_argument(
        "--under",
        metavar="FOLDER",
        help="return only pictures in this folder of the index (a path "
        "relative to it) or below; with --where, both must hold (default: all)",
    )
    search.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per match (query, rank, score, id, path, "
        "class, added, attributes, exact, copy) instead of a table "
        "(default: off)",
    )
    _add_collection_argument(search)
    _add_scanner_argument(search)
    search.set_defaults(run="run_search", command_name="search")


def _add_duplicates_parser(commands, common) -> None:
    """`subic duplicates`: the groups of copies in an index."""
    duplicates = commands.add_parser(
        "duplicates",
        parents=[common],
        help="list the groups of copies in an index of an instance code",
    )
    duplicates.add_argument(
        "index",
        help="an index of a folder that keeps instance codes: a .subic file, "
        "a manifest of shards (.shards.json, searched on Ray), or a Milvus "
        "collection (a .db path or a server URL, with --collection)",
    )
    _add_collection_argument(duplicates)
    duplicates.add_argument(
        "--copy-blocks",
        type=int,
        default=None,
        help="the least equal blocks of two copies (default: the number the "
        "instance code chose on validation, recorded in the index: 61 of 64 "
        "for the one that ships)",
    )
    duplicates.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object per group ({"paths": [...]}) (default: off)',
    )
    _add_ray_address(duplicates, "search a shard manifest's shards on")
    duplicates.set_defaults(run="run_duplicates", command_name="duplicates")


def _add_serve_parser(commands, common) -> None:
    """`subic serve`: search over HTTP, a REST API and a web page."""
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve search over HTTP: a REST API and a web page",
        description="Answers POST /search with the pictures of an index built "
        "from a folder, serves them at GET /items/ID, and a web page at /.",
    )
    _add_model_and_index(serve)
    _add_collection_argument(serve)
    _add_scanner_argument(serve)
    serve.add_argument(
        "--folder",
        metavar="DIR",
        default=None,
        help="the folder of the pictures, the only one whose files are served; "
        "the index must record it (default: the folder the index records)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 or :: opens it to every network "
        "interface, with a warning (default: %(default)s)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=8000,
        help="TCP port; 0 picks a free one, printed at start (default: %(default)s)",
    )
    serve.add_argument(
        "--max-upload-mb",
        type=float,
        default=20.0,
        help="largest picture a request may upload, in MB (default: %(default)s)",
    )
    serve.add_argument(
        "--max-decode-mb",
        type=float,
        default=128.0,
        help="memory all uploads being decoded at once may take, in MB; a "
        "larger picture is refused with 413 (default: %(default)s)",
    )
    _add_query_argument(serve)
    _add_ray_address(serve, "serve a shard manifest's shards from")
    serve.set_defaults(run="run_serve", command_name="serve")


def _add_evaluate_parser(commands, common) -> None:
    """`subic evaluate`: retrieval mAP and precision@k on a protocol."""
    evaluate = commands.add_parser(
        "evaluate",
        parents=[common],
        help="retrieval mAP and precision@k of a model on a protocol",
    )
    evaluate.add_argument("model", help="a SuBiC .keras model")
    _add_data_arguments(evaluate)
    evaluate.add_argument(
        "--images",
        metavar="DIR",
        default=None,
        help="evaluate on your own labelled pictures instead of --dataset: a "
        "folder with one subfolder per class (default: none)",
    )
    # Unset unless given, so that they can be refused beside --images.
    evaluate.set_defaults(dataset=None, split=None)
    evaluate.add_argument(
        "--protocol",
        choices=("paper", "dsh", "random", "unseen"),
        default=None,
        help="paper: 100 queries per class, the rest the database (Sec. 4.1); "
        "dsh: every image queries the whole split; random: --queries-per-class "
        "or --num-queries random queries; unseen: the paper's among the classes "
        "the model was trained without (train --exclude-classes) only "
        "(default: paper; random with --images)",
    )
    evaluate.add_argument(
        "--queries-per-class",
        type=int,
        default=None,
        help="queries per class of the random protocol (default: 100; with "
        "--images, a fifth of the smallest class, at most 100)",
    )
    evaluate.add_argument(
        "--num-queries",
        type=int,
        default=None,
        help="number of queries of the random protocol, whatever their class "
        "(default: --queries-per-class)",
    )
    evaluate.add_argument(
        "--index",
        default=None,
        help=f"a prebuilt database index, ids the positions in the split: "
        f"{INDEX_URI} (default: encode the database)",
    )
    _add_collection_argument(evaluate)
    _add_scanner_argument(evaluate)
    evaluate.add_argument(
        "--ties",
        choices=("pessimistic", "expected", "optimistic", "index"),
        default="pessimistic",
        help="how items of equal score are ranked for mAP (default: %(default)s)",
    )
    _add_query_argument(evaluate)
    evaluate.add_argument(
        "--output",
        default=None,
        help="also write the JSON result here (default: print it only)",
    )
    evaluate.set_defaults(run="run_evaluate", command_name="evaluate")


def build_parser() -> argparse.ArgumentParser:
    """The `subic` parser; each command's `run` names its function in
    `subic_keras.cli.commands`."""
    parser = argparse.ArgumentParser(
        prog="subic", description="SuBiC: supervised structured binary codes"
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {subic_keras.__version__}"
    )
    # Without a command, `subic` (and `subic index`) print their help.
    parser.set_defaults(run=None, help_of=parser, command_name="subic")
    common = argparse.ArgumentParser(add_help=False)
    _add_common_arguments(common)
    commands = parser.add_subparsers(dest="command")
    quick = commands.add_parser(
        "quickstart",
        parents=[common],
        help="train on the bundled digits, index, search and print the mAP",
    )
    add_train_arguments(quick, QUICKSTART)
    quick.set_defaults(run="run_quickstart", command_name="quickstart")
    train = commands.add_parser("train", parents=[common], help="train a SuBiC model")
    add_train_arguments(train, TrainConfig())
    train.set_defaults(run="run_train", command_name="train")
    _add_train_instance_parser(commands, common)

    index = commands.add_parser("index", help="build, extend or prune a search index")
    index.set_defaults(run=None, help_of=index, command_name="index")
    index_commands = index.add_subparsers(dest="index_command")
    _add_index_build_parser(index_commands, common)
    _add_index_add_parser(index_commands, common)
    _add_index_remove_parser(index_commands, common)
    _add_search_parser(commands, common)
    _add_duplicates_parser(commands, common)
    _add_serve_parser(commands, common)
    _add_evaluate_parser(commands, common)
    _add_export_parser(commands, common)
    return parser
