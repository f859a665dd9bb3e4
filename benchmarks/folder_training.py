"""`subic train --images DIR` against `--dataset cifar10`: the same strict mAP?

CIFAR-10's 50,000 training pictures are written as PNG files in class
folders (once, into `--workdir`), then for each seed the same budget is
trained both ways with the commands a user types, and both models are
scored on CIFAR-10's test split with the paper protocol (strict mAP:
pessimistic ties):

    subic train --images DIR/cifar10-png-50000 --pretrain-epochs P --epochs E \\
        --seed S --output-dir RUN-folder
    subic train --dataset cifar10 --data-dir DATA --pretrain-epochs P \\
        --epochs E --seed S --output-dir RUN-arrays
    subic evaluate RUN-*/best.keras --dataset cifar10 --data-dir DATA \\
        --protocol paper --output RUN-*/eval.json

Both hold out 10% for validation; the folder's split is drawn over its own
file order, so the two validation sets differ (as two users' would).

    python -m benchmarks.folder_training --data-dir DATA --seeds 0,1
        [--output JSON]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from benchmarks.common import add_data_dir, log, run_metadata, write_json
from benchmarks.stream_training import write_folders
from benchmarks.train_recipe import evaluate_paper, subic

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "folder_training.json")


def run(kind: str, seed: int, args, folder: str) -> dict:
    run_dir = os.path.join(args.workdir, f"run-{kind}-s{seed}")
    env = dict(os.environ, SUBIC_CACHE_DIR=os.path.join(run_dir, "cache"))
    source = (
        ["--images", folder]
        if kind == "folder"
        else ["--dataset", "cifar10", "--data-dir", args.data_dir]
    )
    budget = ["--pretrain-epochs", str(args.pretrain_epochs)]
    budget += ["--epochs", str(args.epochs), "--seed", str(seed)]
    if not os.path.isfile(os.path.join(run_dir, "summary.json")):
        subic("train", *source, *budget, "--output-dir", run_dir, env=env)
    evaluation = os.path.join(run_dir, "eval.json")
    if not os.path.isfile(evaluation):
        evaluate_paper(run_dir, args.data_dir, evaluation, env)
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    with open(evaluation) as handle:
        result = json.load(handle)
    return {
        "seed": seed,
        "test_map": result["map"],
        "query": result["query"],
        "validation_map": summary["validation_map"],
        "train_seconds": summary["train_seconds"],
        "num_train": summary["num_train"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(parser, "CIFAR-10")
    parser.add_argument("--workdir", required=True, help="PNG folders and runs")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--pretrain-epochs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output", default=RESULTS, help="the JSON written")
    args = parser.parse_args()
    folder = write_folders(args.data_dir, args.workdir)[50_000]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    runs: dict[str, list] = {"folder": [], "arrays": []}
    for seed in seeds:
        for kind in runs:
            runs[kind].append(run(kind, seed, args, folder))
            log(f"{kind} seed {seed}: test mAP {runs[kind][-1]['test_map']:.4f}")
    maps = {kind: [r["test_map"] for r in rows] for kind, rows in runs.items()}
    means = {kind: float(np.mean(values)) for kind, values in maps.items()}
    spread = max(np.ptp(values) for values in maps.values())
    difference = means["folder"] - means["arrays"]
    print(
        f"strict test mAP, {len(seeds)} seeds, {args.pretrain_epochs} + "
        f"{args.epochs} epochs: folder {means['folder']:.4f} "
        f"{maps['folder']}, arrays {means['arrays']:.4f} {maps['arrays']}; "
        f"difference {difference:+.4f}, largest seed range {spread:.4f}"
    )
    write_json(
        args.output,
        {
            **run_metadata("folder_training"),
            "budget": {
                "pretrain_epochs": args.pretrain_epochs,
                "epochs": args.epochs,
                "bits": 48,
            },
            "runs": runs,
            "mean_test_map": means,
            "difference": difference,
            "largest_seed_range": float(spread),
            "map_definition": "CIFAR-10 test split, paper protocol (1,000 "
            "queries, 9,000 database), pessimistic ties",
        },
    )


if __name__ == "__main__":
    main()
