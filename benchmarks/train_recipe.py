"""`subic train` with its defaults on CIFAR-10, then `subic evaluate`, per seed.

Runs the commands a user types, in subprocesses, with a cold pre-training
cache (the run's own `SUBIC_CACHE_DIR`), and records for each seed the full
training time, the machine's load while it ran, and the paper protocol's
strict mAP (pessimistic ties) with the query saved with the model and with
each query kind:

    subic train --dataset cifar10 --data-dir DIR --bits 48 --seed S \\
        --output-dir RUN
    subic evaluate RUN/best.keras --dataset cifar10 --data-dir DIR \\
        --protocol paper --output RUN/eval.json

A seed whose run directory already holds `summary.json` and its evaluations
is reported from them (delete the directory to re-run it). With
`--cache-dir`, the runs share a pre-training cache: a backbone pre-trained
for one block size serves another (pre-training does not depend on it),
the run trains SuBiC's stage only, and its record says so
(`pretrain_cached`); its training time counts the pre-training's seconds
as they were when it ran.

    python -m benchmarks.train_recipe --data-dir DIR --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import command, machine, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "train_recipe.json")
PAPER_MAP_48 = 0.6863  # the paper's Table 2, SuBiC at 48 bits


def subic(*args: str, env: dict) -> None:
    command = [sys.executable, "-m", "subic_keras.cli", *args]
    print("$ subic " + " ".join(args), flush=True)
    subprocess.run(command, check=True, env=env)


def evaluate_paper(run_dir: str, data_dir: str, output: str, env: dict, *extra):
    """`subic evaluate RUN/best.keras` on CIFAR-10's test split, paper protocol."""
    subic(
        "evaluate",
        os.path.join(run_dir, "best.keras"),
        "--dataset",
        "cifar10",
        "--data-dir",
        data_dir,
        "--protocol",
        "paper",
        "--output",
        output,
        *extra,
        env=env,
    )


def run_seed(seed: int, args) -> dict:
    blocks = f"-k{args.block_size}" if args.block_size else ""
    if args.pretrain_epochs:
        blocks += f"-p{args.pretrain_epochs}"
    run_dir = os.path.join(args.runs_dir, f"cifar10-{args.bits}b{blocks}-s{seed}")
    summary_path = os.path.join(run_dir, "summary.json")
    cache = args.cache_dir or os.path.join(run_dir, "cache")
    env = dict(os.environ, SUBIC_CACHE_DIR=cache)
    record = {"seed": seed, "run_dir": run_dir}
    if not os.path.isfile(summary_path):
        load = os.getloadavg()[0]
        start = time.time()
        subic(
            "train",
            "--dataset",
            "cifar10",
            "--data-dir",
            args.data_dir,
            "--bits",
            str(args.bits),
            "--seed",
            str(seed),
            "--output-dir",
            run_dir,
            *(["--block-size", str(args.block_size)] if args.block_size else []),
            *(
                ["--pretrain-epochs", str(args.pretrain_epochs)]
                if args.pretrain_epochs
                else []
            ),
            env=env,
        )
        record["train_wall_seconds"] = round(time.time() - start, 1)
        record["load_average_1min"] = {"start": load, "end": os.getloadavg()[0]}
        with open(os.path.join(run_dir, "run.json"), "w") as handle:
            json.dump(record, handle, indent=2)
    with open(os.path.join(run_dir, "run.json")) as handle:
        record.update(json.load(handle))
    with open(summary_path) as handle:
        summary = json.load(handle)
    record["summary"] = {
        key: summary[key]
        for key in (
            "best_epoch",
            "query",
            "validation_map",
            "train_seconds",
            "subic_train_seconds",
            "test",
        )
    }
    record["pretrain_seconds"] = summary["pretrain"]["train_seconds"]
    record["pretrain_cached"] = bool(summary["pretrain"].get("cached"))
    record["training_seconds"] = record["train_wall_seconds"] + (
        record["pretrain_seconds"] if record["pretrain_cached"] else 0.0
    )
    record["test_map"] = {}
    for query in ("saved", "fc0", "class_posterior"):
        path = os.path.join(run_dir, f"eval-{query}.json")
        if not os.path.isfile(path):
            extra = [] if query == "saved" else ["--query", query]
            evaluate_paper(run_dir, args.data_dir, path, env, *extra)
        with open(path) as handle:
            result = json.load(handle)
        record["test_map"][query] = {
            "map": result["map"],
            "map_expected": result["map_expected"],
            "query": result["query"],
        }
    return record


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10's directory")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--bits", type=int, default=48)
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="`subic train --block-size` (default: subic train's own)",
    )
    parser.add_argument(
        "--pretrain-epochs",
        type=int,
        default=None,
        help="`subic train --pretrain-epochs` (default: subic train's own)",
    )
    parser.add_argument(
        "--runs-dir", default=os.path.join(HERE, "cache", "train_recipe")
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="a pre-training cache the runs share (default: each run's own, "
        "empty, so that its training time is measured whole)",
    )
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [run_seed(seed, args) for seed in seeds]
    maps = [run["test_map"]["saved"]["map"] for run in runs]
    result = {
        "command": command("train_recipe"),
        "bits": args.bits,
        "block_size": args.block_size,
        "pretrain_epochs": args.pretrain_epochs,
        "runs": runs,
        "mean_test_map": float(np.mean(maps)),
        "std_test_map": float(np.std(maps)),
        "paper_map": PAPER_MAP_48 if args.bits == 48 else None,
        # Pre-training included, cached or not (`training_seconds`).
        "max_train_wall_seconds": max(run["training_seconds"] for run in runs),
        "map_definition": "paper protocol (1,000 queries, 9,000 database), "
        "non-interpolated mAP over the full ranking, pessimistic ties",
        "machine": machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"{args.bits} bits, seeds {seeds}: test mAP {result['mean_test_map']:.4f} "
        f"± {result['std_test_map']:.4f} (query saved with each model); longest "
        f"training {result['max_train_wall_seconds']:.0f} s on "
        f"{result['machine']['cpu']}"
    )
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
