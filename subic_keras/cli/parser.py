"""The `subic` command line's arguments, with no TensorFlow import.

`build_parser` describes every command and option; `--help` and argument
errors need nothing heavier than this module, so they are instant.
"""

from __future__ import annotations

import argparse
import math
import os

from subic_keras._validation import check_int
from subic_keras.config import BACKBONES, DATASETS, QUERY_KINDS, TrainConfig

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
        seed=args.seed,
        output_dir=args.output_dir,
        cache_dir=args.cache_dir,
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
        "(default: the query chosen on validation and saved with the model)",
    )


def _add_model_and_index(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the SuBiC .keras model that built the index")
    parser.add_argument("index", help="an index file built from a folder")


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
        "signatures serving_default, encode_images and classify) and, with "
        "--litert / --int8, OUTPUT_DIR/MODEL_NAME.tflite / MODEL_NAME_int8.tflite. "
        "Exporting again writes the next version and replaces the LiteRT files "
        "with its encoders; an existing version is replaced only with --overwrite.",
    )
    export.add_argument("model", help="the trained model, a .keras file")
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


def build_parser() -> argparse.ArgumentParser:
    """The `subic` parser; each command's `run` names its function in
    `subic_keras.cli.commands`."""
    parser = argparse.ArgumentParser(
        prog="subic", description="SuBiC: supervised structured binary codes"
    )
    common = argparse.ArgumentParser(add_help=False)
    _add_common_arguments(common)
    commands = parser.add_subparsers(dest="command", required=True)
    quick = commands.add_parser(
        "quickstart",
        parents=[common],
        help="train on the bundled digits, index, search and print the mAP",
    )
    _add_train_arguments(quick, QUICKSTART)
    quick.set_defaults(run="run_quickstart", command_name="quickstart")
    train = commands.add_parser("train", parents=[common], help="train a SuBiC model")
    _add_train_arguments(train, TrainConfig())
    train.set_defaults(run="run_train", command_name="train")

    index = commands.add_parser("index", help="build, extend or prune a search index")
    index_commands = index.add_subparsers(dest="index_command", required=True)
    build = index_commands.add_parser(
        "build",
        parents=[common],
        help="encode a folder of pictures, or a dataset split, into an index file",
        description="With FOLDER: encodes every picture under it (recursively; "
        "JPEG, PNG, BMP, GIF, WebP of any size), keeping each one's path "
        "relative to FOLDER; files that are not pictures are skipped and "
        "listed. Without: encodes a dataset split, ids the positions in it.",
    )
    build.add_argument("model", help="a SuBiC .keras model")
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
    build.set_defaults(run="run_index_build", command_name="index build")

    add = index_commands.add_parser(
        "add",
        parents=[common],
        help="add a folder's new pictures to its index file",
        description="Encodes the pictures under FOLDER that the index does not "
        "hold yet (by path) and rewrites the index file atomically.",
    )
    _add_model_and_index(add)
    add.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="the indexed folder (default: the folder recorded in the index)",
    )
    _add_batch_argument(add)
    add.set_defaults(run="run_index_add", command_name="index add")

    remove = index_commands.add_parser(
        "remove",
        parents=[common],
        help="remove pictures from a folder's index file by path",
    )
    remove.add_argument("index", help="an index file built from a folder")
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

    search = commands.add_parser(
        "search", parents=[common], help="search an index with query images"
    )
    search.add_argument("model", help="a SuBiC .keras model")
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
    search.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per match (query, rank, score, id, path) "
        "instead of a table (default: off)",
    )
    _add_collection_argument(search)
    _add_scanner_argument(search)
    search.set_defaults(run="run_search", command_name="search")

    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve search over HTTP: a REST API and a web page",
        description="Answers POST /search with the pictures of an index built "
        "from a folder, serves them at GET /items/ID, and a web page at /.",
    )
    _add_model_and_index(serve)
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
    serve.set_defaults(run="run_serve", command_name="serve")

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
        choices=("paper", "dsh", "random"),
        default=None,
        help="paper: 100 queries per class, the rest the database (Sec. 4.1); "
        "dsh: every image queries the whole split; random: --queries-per-class "
        "or --num-queries random queries (default: paper; random with --images)",
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
    _add_export_parser(commands, common)
    return parser
