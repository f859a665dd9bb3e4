"""Find the picture itself: an instance code against the look and perceptual hashes.

Trains an instance code (`subic_keras.instance.instance_code`; by default 256 bits,
M = 64, K = 16, as the one that ships; the paper's instance codes have 64,
Sec. 4) on CIFAR-10's training pictures without labels, each against its
own copies altered by `subic_keras.instance.alterations`, then searches for the
originals of 1,000 altered test pictures:

- databases: CIFAR-10's 10,000 test pictures, and the same with its 50,000
  training pictures added (60,000);
- queries: copies altered by the whole family, by each of its families
  alone, and by the earlier benchmark's four alterations
  (`near_duplicates.alter`: crop, JPEG, brightness, flip);
- the instance code's query, FC0's outputs (`InstanceSubic.query`), and
  the earlier one, its block probabilities `z*`, ranked by the same scan;
- what the code's network knows before its bits are taken: FC0's
  real-valued outputs of query and database, centred per block and
  compared by cosine (`network outputs`, 4 KB a picture: not a code, a
  ceiling for codes of this network);
- an ImageNet network's features, frozen (`--extractor`, by default the
  data directory's MobileNet v1 embedding extractor where it is: 1,024
  floats a picture of 224 × 224, `LiteRTFeatureExtractor`), centred on
  the training pictures' mean and compared by cosine;
- peers, on the same queries and databases: the look (`baselines.looks`,
  108 bytes a picture, compared with 38 views of each query over the whole
  database) and ImageHash's `phash` and `dhash` (hash sizes 8 and 16,
  ranked by Hamming distance; `pip install imagehash`).

Reported: recall@1 and recall@10, the codes' distinct count, training time.
The trained model is cached under `--cache-dir`.

Example:

    python -m benchmarks.near_duplicates --epochs 10

Without `--epochs` and `--num-blocks`, the code that ships is trained
(60 epochs, 64 blocks of 16; about an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import time

import keras
import numpy as np

from benchmarks import common
from subic_keras import pretrained
from subic_keras.baselines import looks
from subic_keras.data import datasets
from subic_keras.instance import alterations, copies, near_duplicates
from subic_keras.instance import instance_code as instance
from subic_keras.models import backbones, losses
from subic_keras.models.litert_features import LiteRTFeatureExtractor
from subic_keras.models.weights_digest import weights_digest
from subic_keras.search import SubicIndex
from subic_keras.training import standardization

DATABASES = {"10k": 10_000, "60k": 60_000}
EXTRACTOR = "mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"
CALIBRATION_PICTURES = 21_000
LOOKED_AT = ("whole family", "earlier four")


def code_arguments(
    description: str, epochs: int, num_blocks: int
) -> argparse.ArgumentParser:
    """The arguments of an instance-code benchmark: the data, the code and
    its training (`trained`), the queries, the cache."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_data_dir(parser, "CIFAR-10's cifar-10-batches-bin/")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--num-blocks", type=int, default=num_blocks)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--train-pictures", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--width",
        type=int,
        default=1,
        help="the DSH CNN's channel multiplier (backbones.dsh_cnn; default 1)",
    )
    parser.add_argument(
        "--start-from",
        default=None,
        help="an instance code's .keras file (or `instance`, the one that ships) "
        "to go on training, from --learning-rate down a new cosine: a warm "
        "restart (default: a new code)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=1e-3,
        help="Adam's rate at the first epoch (default: %(default)s)",
    )
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default="benchmarks/cache/near_duplicates")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = code_arguments(__doc__, epochs=60, num_blocks=64)
    parser.add_argument(
        "--ship",
        action="store_true",
        help="write the trained, calibrated model where the package ships it "
        "(subic_keras/pretrained/instance.keras)",
    )
    parser.add_argument(
        "--extractor",
        default=None,
        help=f"a LiteRT image feature extractor compared as a peer (default: "
        f"{EXTRACTOR} of --data-dir, where it is)",
    )
    parser.add_argument(
        "--output",
        default="benchmarks/results/near_duplicates.json",
        help="where the JSON goes (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.extractor is not None and not os.path.isfile(args.extractor):
        # Found now, not after an hour of training.
        parser.error(f"--extractor must be a LiteRT file, received {args.extractor!r}")
    return args


def trained(
    args, pictures: np.ndarray, families: tuple[str, ...] = alterations.FAMILIES
) -> tuple[instance.InstanceSubic, float | None]:
    """The instance code of these settings, trained on copies altered by
    `families`: from the cache, or trained now (its training seconds)."""
    settings = {
        "epochs": args.epochs,
        "train_pictures": len(pictures),
        "batch_size": args.batch_size,
        "seed": args.seed,
        "families": families,
        "num_blocks": args.num_blocks,
        "block_size": args.block_size,
        "schedule": "cosine",
    }
    if args.width != 1:  # (absent from the keys of the width-1 codes)
        settings["width"] = args.width
    start = _start_path(getattr(args, "start_from", None))
    if start is not None:
        settings["start_from"] = weights_digest(start)
    rate = getattr(args, "learning_rate", 1e-3)
    if rate != 1e-3:  # (absent from the keys of the codes trained at 1e-3)
        settings["learning_rate"] = rate
    path = os.path.join(
        args.cache_dir, common.settings_key("instance", settings) + ".keras"
    )
    if os.path.isfile(path):
        return cached(path)
    if start is None:
        code = instance.build_instance_subic(
            backbones.dsh_cnn(width=args.width),
            args.num_blocks,
            args.block_size,
            preprocessing=standardization(pictures),
            optimizer=keras.optimizers.Adam(rate),
        )
    else:
        code = instance.InstanceSubic.load(start)
        code.model.compile(
            optimizer=keras.optimizers.Adam(rate),
            loss=losses.InstanceContrastiveLoss(code.num_blocks, code.block_size),
        )
    return code, train_and_cache(code, pictures, path, args, families)


def cached(path: str) -> tuple[instance.InstanceSubic, float | None]:
    """A cached instance code and its training seconds (None if unrecorded)."""
    record = path[: -len(".keras")] + ".json"
    seconds = None
    if os.path.isfile(record):
        seconds = common.read_json(record)["train_seconds"]
    return instance.InstanceSubic.load(path), seconds


def train_and_cache(
    code, pictures, path: str, args, families=alterations.FAMILIES
) -> float:
    """Trains `code` as `args` say, saves it at `path` with its training
    seconds beside it (`cached` reads both), and returns those seconds."""
    began = time.time()
    instance.train_instance(
        code,
        pictures,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        families=families,
        verbose=2,
    )
    seconds = time.time() - began
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    code.save(path)
    record = path[: -len(".keras")] + ".json"
    common.write_json(record, {"train_seconds": round(seconds, 1)})
    return seconds


def _start_path(start_from: str | None) -> str | None:
    if start_from == "instance":
        return pretrained.path()
    return start_from


def database_indexes(code, codes: np.ndarray) -> dict[str, SubicIndex]:
    """An index of the first `size` of `codes` for each of `DATABASES`."""
    indexes = {}
    for name, size in DATABASES.items():
        indexes[name] = SubicIndex(code.num_blocks, code.block_size)
        indexes[name].add(codes[:size])
    return indexes


def query_sets(pictures: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The altered copies of `pictures`, by how they were altered."""
    sets = {
        "whole family": alterations.alter_batch(pictures, seed),
        "earlier four": near_duplicates.alter(pictures, seed=seed)[0],
    }
    for name in alterations.FAMILIES:
        sets[name] = alterations.alter_batch(
            pictures, seed, families=[name], mixture=(1, 1)
        )
    return sets


def hashes(pictures: np.ndarray, kind: str, size: int) -> np.ndarray:
    """ImageHash's `kind` hash of each picture, as a boolean row."""
    import imagehash
    from PIL import Image

    function = {"phash": imagehash.phash, "dhash": imagehash.dhash}[kind]
    return np.stack(
        [function(Image.fromarray(p), hash_size=size).hash.ravel() for p in pictures]
    )


def hamming_ranked(database: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The `k` nearest rows of `database` to each query by Hamming distance
    (ties in database order)."""
    db = database.astype(np.int16)

    def alike(rows: slice) -> np.ndarray:  # minus the Hamming distance
        q = queries[rows].astype(np.int16)
        return -(q @ (1 - db).T + (1 - q) @ db.T)

    return _ranked(alike, len(queries), k, 100)


def _ranked(alike, count: int, k: int, batch: int) -> np.ndarray:
    """The `k` columns of `alike(rows)` highest in each row (ties in column
    order), for `count` queries taken `batch` rows at a time."""
    out = []
    for start in range(0, count, batch):
        scores = alike(slice(start, start + batch))
        out.append(np.argsort(-scores, axis=1, kind="stable")[:, :k])
    return np.concatenate(out)


def cosine_ranked(items: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The `k` rows of `items` nearest each query by cosine (rows of unit
    length), 100 queries at a time."""
    return _ranked(lambda rows: queries[rows] @ items.T, len(queries), k, 100)


def centred_outputs(outputs: np.ndarray, block_size: int) -> np.ndarray:
    """FC0's outputs centred per block, of unit length: a block's outputs
    are log-probabilities up to a constant of the block, which centring
    removes."""
    blocks = outputs.reshape(len(outputs), -1, block_size)
    return _unit((blocks - blocks.mean(-1, keepdims=True)).reshape(len(outputs), -1))


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def extractor_path(args) -> str | None:
    """The feature extractor compared as a peer, if any."""
    if args.extractor is not None:
        return args.extractor
    if args.data_dir is None:
        return None
    path = os.path.join(args.data_dir, EXTRACTOR)
    return path if os.path.isfile(path) else None


def looks_ranked(query_looks, item_looks, k: int) -> np.ndarray:
    """The `k` items most alike each query by look, 50 queries at a time."""
    return _ranked(
        lambda rows: looks.similarity(query_looks[rows], item_looks),
        len(query_looks),
        k,
        50,
    )


def copy_marks(code, indexes, queries, chosen, x_train, seed) -> dict:
    """How the calibrated copy rule marks the 10 best results of the
    whole-family queries: the share of marks that are the original
    (precision), of originals marked (recall), and, for copies of training
    pictures that the 10k database does not hold, the share of queries
    given a mark (all wrong). Each wrong mark is listed, as the test
    picture copied and the marked picture of the database (test pictures
    first, then training pictures from 10,000), to be looked at: CIFAR-10
    holds some photographs more than once."""
    found = {}
    queried = code.query(queries)
    for db_name, index in indexes.items():
        scores, ids = index.search(queried, 10)
        marked = copies.copy_margins(queried, scores, code.block_size) >= (
            code.copy_margin - 1e-6
        )
        right = marked & (ids == chosen[:, None])
        rows, columns = np.nonzero(marked & ~right)
        found[db_name] = {
            "precision": round(float(right.sum() / max(1, marked.sum())), 4),
            "recall": round(float(right.any(1).mean()), 4),
            "wrong_marks": [
                [int(chosen[row]), int(ids[row, column])]
                for row, column in zip(rows, columns)
            ],
        }
    outside = alterations.alter_batch(x_train[: len(queries)], seed + 3)
    queried = code.query(outside)
    scores, _ = indexes["10k"].search(queried, 1)
    margins = copies.copy_margins(queried, scores, code.block_size)[:, 0]
    found["10k"]["queries_outside_marked"] = round(
        float((margins >= code.copy_margin - 1e-6).mean()), 4
    )
    common.log(f"copy marks: {found}")
    return found


def main(argv=None) -> dict:
    args = parse_args(argv)
    (x_train, _), (x_test, _) = datasets.load_cifar10(args.data_dir)
    code, seconds = trained(args, x_train[: args.train_pictures])
    # What counts as a copy, chosen on copies of training pictures: a
    # database of 20,000, queries of 1,000 of them and of 1,000 others.
    calibration = copies.calibrate(
        code, x_train[-CALIBRATION_PICTURES:], seed=args.seed + 2
    )
    common.log(f"calibrated: {calibration}")
    if args.ship:
        code.save(pretrained.path(), include_optimizer=False)
        size = os.path.getsize(pretrained.path())
        common.log(f"wrote {pretrained.path()} ({size} bytes)")
    database = np.concatenate([x_test, x_train])
    rng = np.random.default_rng(args.seed)
    chosen = np.sort(rng.choice(len(x_test), args.queries, replace=False))
    sets = query_sets(x_test[chosen], args.seed + 1)
    common.log("encoding the databases")
    codes = code.encode(database)
    indexes = database_indexes(code, codes)
    peers = (
        {
            f"{kind} {size}": hashes(database, kind, size)
            for kind in ("phash", "dhash")
            for size in (8, 16)
        }
        if _has_imagehash()
        else {}
    )
    item_looks = looks.look(database)
    item_outputs = centred_outputs(code.query(database), code.block_size)
    path, feature_cache = extractor_path(args), os.path.join(args.cache_dir, "features")
    extractor = None if path is None else LiteRTFeatureExtractor(path)
    by_features = (
        "MobileNet features" if path and path.endswith(EXTRACTOR) else "features"
    )
    if extractor is not None:
        item_features = extractor.extract(database, cache_dir=feature_cache)
        centre = item_features[len(x_test) :].mean(0)  # the training pictures'
        item_features = _unit(item_features - centre)
    marks = None
    if code.copy_margin is not None:
        marks = copy_marks(
            code, indexes, sets["whole family"], chosen, x_train, args.seed
        )
    results: dict = {}
    for query_name, queries in sets.items():
        row: dict = {}
        queried = code.query(queries)
        # The earlier query, the block probabilities, ranked by the same scan.
        z_star = code.block_probabilities(queries)
        # The look over a whole database costs minutes: the two mixtures.
        query_looks = looks.query_look(queries) if query_name in LOOKED_AT else None
        query_hashes = {peer: hashes(queries, *_kind_size(peer)) for peer in peers}
        outputs = centred_outputs(queried, code.block_size)
        if extractor is not None:
            query_features = extractor.extract(
                queries, cache_dir=feature_cache, progress=False
            )
            query_features = _unit(query_features - centre)
        for db_name, size in DATABASES.items():
            _, ids = indexes[db_name].search(queried, 10)
            row[f"instance code {db_name}"] = near_duplicates.recall_at(ids, chosen)
            _, ids = indexes[db_name].search(z_star, 10)
            row[f"instance code z* {db_name}"] = near_duplicates.recall_at(ids, chosen)
            ranked = cosine_ranked(item_outputs[:size], outputs, 10)
            row[f"network outputs {db_name}"] = near_duplicates.recall_at(
                ranked, chosen
            )
            if extractor is not None:
                ranked = cosine_ranked(item_features[:size], query_features, 10)
                row[f"{by_features} {db_name}"] = near_duplicates.recall_at(
                    ranked, chosen
                )
            if query_looks is not None:
                ranked = looks_ranked(query_looks, item_looks[:size], 10)
                row[f"look {db_name}"] = near_duplicates.recall_at(ranked, chosen)
            for peer, table in peers.items():
                ranked = hamming_ranked(table[:size], query_hashes[peer], 10)
                row[f"{peer} {db_name}"] = near_duplicates.recall_at(ranked, chosen)
        results[query_name] = row
        common.log(
            f"{query_name}: "
            + "; ".join(
                f"{method} {value['recall@1']:.3f}" for method, value in row.items()
            )
        )
    output = {
        **common.run_metadata("near_duplicates", "tensorflow", "keras", "imagehash"),
        "settings": {
            "epochs": args.epochs,
            "train_pictures": min(args.train_pictures, len(x_train)),
            "batch_size": args.batch_size,
            "queries": args.queries,
            "num_blocks": code.num_blocks,
            "block_size": code.block_size,
            "bits": code.bits,
            "schedule": "cosine",
            "width": args.width,
        },
        "calibration": calibration,
        "copy_marks": marks,
        "train_seconds": None if seconds is None else round(seconds, 1),
        "distinct_codes": {
            name: len(np.unique(codes[:size], axis=0))
            for name, size in DATABASES.items()
        },
        "results": results,
    }
    common.write_json(args.output, output)
    common.log(f"wrote {args.output}")
    return output


def _has_imagehash() -> bool:
    try:
        import imagehash  # noqa: F401
    except ImportError:
        common.log("imagehash is not installed: its peers are left out")
        return False
    return True


def _kind_size(peer: str) -> tuple[str, int]:
    kind, size = peer.split()
    return kind, int(size)


if __name__ == "__main__":
    main()
