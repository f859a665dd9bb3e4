"""Codes that transfer: CIFAR-10 retrieval among classes held out of training.

Sablayrolles, Douze, Usunier and Jégou ("How should we evaluate supervised
hashing?", ICASSP 2017): on the standard protocol, where queries and
database share the training classes, a classifier's one-hot prediction
reaches the best supervised-hashing mAP. So each model here is trained by
`subic train`'s library function (`training.train`) without the classes of
an unseen-class split (`protocols.held_out_classes`: 3 of the 10), and
evaluated on the `"unseen"` protocol (100 queries per held-out class, the
rest of those classes' test pictures as database); a model trained on every
class with the same budget gives the standard ("paper") protocol beside it.
Rows, at each code length:

- `subic_z`: SuBiC's codes searched with the paper's query `z` (Eq. 10);
- `subic_class_posterior`: the same codes, the class-posterior query;
- `one_hot_classifier`: the model's class prediction as a one-block code,
  its posterior as query (`baselines.OneHotClassifier`, 3 bits);
- `dsh`: DSH (Liu et al., CVPR 2016) trained by `training.train_baseline`
  on the same classes, data, pre-trained backbone and budget as SuBiC, at
  its code length, searched by Hamming distance;
- `pq`, `opq`: product quantizers (4 sub-spaces of `bits / 4` bits) of the
  same model's backbone features (`Subic.features`), fitted on its training
  pictures, searched asymmetrically.

mAP over the full ranking, pessimistic ties, as everywhere in the package,
and beside it the exact mean over tie orders (`map_expected`): a one-hot
code ties every item of a predicted class, which the pessimistic count
ranks last.
Models are kept under `--cache-dir` (a rerun reuses them).

    python -m benchmarks.unseen_classes --data-dir DIR --splits 0 \\
        --bits 24,48 --pretrain-epochs 10 --epochs 3

Writes `benchmarks/results/unseen_classes.json` with the command and CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from benchmarks import common
from subic_keras._validation import check_power_of_two
from subic_keras.baselines import (
    DSH,
    OneHotClassifier,
    OptimizedProductQuantizer,
    ProductQuantizer,
)
from subic_keras.config import TrainConfig
from subic_keras.data import datasets, protocols
from subic_keras.evaluation import scoring
from subic_keras.serving.export import load_subic
from subic_keras.training import train, train_baseline

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "unseen_classes.json")
CACHE = os.path.join(HERE, "cache", "unseen_classes")
# Training pictures the quantizers are fitted on (their k-means).
QUANTIZER_FIT = 20_000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_data_dir(parser, "CIFAR-10's binary batches")
    parser.add_argument("--splits", default="0,1,2", help="unseen-class splits")
    parser.add_argument("--bits", default="24,48", help="code lengths")
    parser.add_argument(
        "--block-size",
        type=int,
        default=TrainConfig.block_size,
        help="SuBiC's K (default: subic train's, %(default)s)",
    )
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument(
        "--max-train-images",
        type=int,
        default=None,
        help="train on at most this many pictures (a smoke run; default: all)",
    )
    parser.add_argument("--cache-dir", default=CACHE)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    try:
        check_power_of_two("--block-size", args.block_size)
    except ValueError as error:
        parser.error(str(error))
    args.splits = [int(s) for s in args.splits.split(",")]
    args.bits = [int(b) for b in args.bits.split(",")]
    return args


def trained(args, bits: int, excluded: tuple[int, ...]) -> tuple[str, dict]:
    """The model `training.train` makes without `excluded` (cached)."""
    budget = _budget(args)
    name = _name(bits, excluded, budget, args.block_size)
    config = TrainConfig(
        dataset="cifar10",
        data_dir=args.data_dir,
        num_blocks=bits // int(np.log2(args.block_size)),
        block_size=args.block_size,
        exclude_classes=excluded,
        output_dir=os.path.join(args.cache_dir, name),
        cache_dir=os.path.join(args.cache_dir, "pretrained"),
        **budget,
    )
    summary_path = os.path.join(config.output_dir, "summary.json")
    if os.path.isfile(summary_path):
        with open(summary_path) as handle:
            summary = json.load(handle)
        if summary["config"] == json.loads(json.dumps(dataclasses.asdict(config))):
            return os.path.join(config.output_dir, "best.keras"), summary
    common.log(f"training {name}")
    summary = train(config, verbose=2, overwrite=True)
    return os.path.join(config.output_dir, "best.keras"), summary


def _budget(args) -> dict:
    """The training budget the arguments set (the defaults where unset)."""
    keys = ("pretrain_epochs", "epochs", "max_train_images")
    return {key: getattr(args, key) for key in keys if getattr(args, key) is not None}


def _effective(args, key: str) -> int:
    value = getattr(args, key)
    return getattr(TrainConfig, key) if value is None else value


def _name(bits: int, excluded, budget: dict, block_size: int) -> str:
    """A cached run's folder name (K absent where it is 64, as in the first
    runs)."""
    name = f"b{bits}-" + ("all" if not excluded else "x" + "".join(map(str, excluded)))
    if block_size != 64:
        name += f"-k{block_size}"
    return name + "".join(f"-{k[0]}{v}" for k, v in sorted(budget.items()))


def trained_dsh(args, summary: dict) -> tuple[str, dict]:
    """DSH trained as the SuBiC model `trained` summarised (cached): its
    code length, classes, data and budget, in the folder of the K = 64
    model of those (DSH has no K)."""
    config = TrainConfig(**summary["config"])
    folder = os.path.join(
        args.cache_dir, _name(config.bits, config.exclude_classes, _budget(args), 64)
    )
    path = os.path.join(folder, "dsh.keras")
    record_path = os.path.join(folder, "dsh.json")
    if os.path.isfile(path) and os.path.isfile(record_path):
        with open(record_path) as handle:
            return path, json.load(handle)
    common.log(f"training DSH in {os.path.basename(folder)}")
    network, record = train_baseline(config, "dsh", verbose=2)
    os.makedirs(folder, exist_ok=True)
    network.train_model.save(path)
    common.write_json(record_path, record)
    return path, record


def scored(
    model_path: str, dsh_path: str, bits: int, data, protocol: str, held
) -> dict:
    """mAP of every row for one model (and its DSH) on one protocol."""
    (x_train, y_train), (x_test, y_test) = data
    subic = load_subic(model_path)
    options = {"classes": list(held)} if held else {}
    rows = {}
    for row, kind in (("subic_z", "fc0"), ("subic_class_posterior", "class_posterior")):
        rows[row] = scoring.evaluate(
            subic.with_query(kind), x_test, y_test, protocol, **options
        )
    posterior = subic.query_model()

    def predict(images):
        return posterior.predict(images, batch_size=256, verbose=0)[1]

    rows["one_hot_classifier"] = scoring.evaluate(
        OneHotClassifier(predict), x_test, y_test, protocol, **options
    )
    dsh = DSH.from_train_model(keras.saving.load_model(dsh_path))
    rows["dsh"] = scoring.evaluate(dsh, x_test, y_test, protocol, **options)
    seen = ~np.isin(y_train, held) if held else np.ones(len(y_train), bool)
    fit = subic.features(x_train[seen][:QUANTIZER_FIT])
    features = subic.features(x_test)
    for row, kind in (("pq", ProductQuantizer), ("opq", OptimizedProductQuantizer)):
        quantizer = kind(num_subspaces=4, bits_per_subspace=bits // 4).fit(fit, seed=0)
        rows[row] = scoring.evaluate(quantizer, features, y_test, protocol, **options)
    return {
        row: {
            key: result[key] for key in ("map", "map_expected", "precision@10", "bits")
        }
        for row, result in rows.items()
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    data = datasets.load_cifar10(args.data_dir)
    runs = []
    for bits in args.bits:
        path, summary = trained(args, bits, ())
        dsh_path, dsh = trained_dsh(args, summary)
        runs.append(
            {
                "protocol": "paper",
                "bits": bits,
                "split": None,
                "held_out": [],
                "model": os.path.relpath(path, HERE),
                "validation_map": summary.get("validation_map"),
                "dsh_validation_map": dsh["best_validation_map"],
                "rows": scored(path, dsh_path, bits, data, "paper", ()),
            }
        )
        for split in args.splits:
            held = protocols.held_out_classes(10, split)
            path, summary = trained(args, bits, held)
            dsh_path, dsh = trained_dsh(args, summary)
            runs.append(
                {
                    "protocol": "unseen",
                    "bits": bits,
                    "split": split,
                    "held_out": list(held),
                    "model": os.path.relpath(path, HERE),
                    "validation_map": summary.get("validation_map"),
                    "dsh_validation_map": dsh["best_validation_map"],
                    "rows": scored(path, dsh_path, bits, data, "unseen", held),
                }
            )
            common.log(f"{bits} bits, split {split}: {runs[-1]['rows']}")
    report = {
        **common.run_metadata("unseen_classes", "numpy", "tensorflow", "keras"),
        "settings": {
            "splits": args.splits,
            "bits": args.bits,
            "block_size": args.block_size,
            # The values trained with: `TrainConfig`'s defaults where unset
            # (files written before recorded `None` for those).
            "pretrain_epochs": _effective(args, "pretrain_epochs"),
            "epochs": _effective(args, "epochs"),
            "max_train_images": args.max_train_images,
            "budget": "subic train's defaults"
            if args.pretrain_epochs is None
            and args.epochs is None
            and args.max_train_images is None
            else "reduced (see pretrain_epochs, epochs, max_train_images)",
        },
        "runs": runs,
        "mean_map": _means(runs, "map"),
        "mean_map_expected": _means(runs, "map_expected"),
        "elapsed_seconds": round(time.perf_counter() - start, 1),
    }
    common.write_json(args.output, report)
    for key, rows in report["mean_map"].items():
        cells = ", ".join(f"{row} {value:.4f}" for row, value in rows.items())
        print(f"{key} bits: {cells}")
    print(f"wrote {args.output}")
    return report


def _means(runs: list[dict], metric: str) -> dict:
    """`metric` of each row averaged over splits, by protocol and bits."""
    groups: dict = {}
    for run in runs:
        key = f"{run['protocol']} {run['bits']}"
        for row, result in run["rows"].items():
            groups.setdefault(key, {}).setdefault(row, []).append(result[metric])
    return {
        key: {row: float(np.mean(values)) for row, values in rows.items()}
        for key, rows in groups.items()
    }


if __name__ == "__main__":
    main()
