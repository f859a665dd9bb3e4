"""Milvus Lite against SubicIndex: insert throughput and search speed.

For databases of 100,000 and 1,000,000 uniform random 48-bit codes (M = 8
blocks of K = 64) and ReLU-Gaussian queries, in one run: items inserted per
second (`MilvusIndex.add` into a fresh Milvus Lite file, `SubicIndex.add`),
queries per second for single queries (median latency) and for one batch
(`--batch`, default 20; k = 100), and the agreement of
Milvus's top 100 with SubicIndex's exact one (recall@100; ties aside). The
JSON goes to `benchmarks/results/milvus_speed.json` with the command and the
machine.

    python -m benchmarks.milvus_speed
    python -m benchmarks.milvus_speed --sizes 20000 --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from subic_keras.search import SubicIndex
from subic_keras.search.milvus import MilvusIndex

NUM_BLOCKS, BLOCK_SIZE = 8, 64
K_NEIGHBOURS = 100
RESULTS = os.path.join("benchmarks", "results", "milvus_speed.json")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        default="100000,1000000",
        help="database sizes, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=20,
        help="queries in the timed batch (default: %(default)s; Milvus Lite "
        "takes seconds per query over 1,000,000 items)",
    )
    parser.add_argument(
        "--singles",
        type=int,
        default=5,
        help="single queries timed, their median latency reported "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer timed queries, for smoke tests"
    )
    parser.add_argument("--output", default=RESULTS, help="JSON results path")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be integers, received {args.sizes!r}")
    if min(args.sizes) < K_NEIGHBOURS:
        parser.error(f"--sizes must be >= {K_NEIGHBOURS}")
    if args.batch < 1 or args.singles < 1:
        parser.error("--batch and --singles must be >= 1")
    if args.quick:
        args.batch, args.singles = min(args.batch, 5), min(args.singles, 2)
    return args


def rate(count: int, seconds: float) -> float:
    return count / max(seconds, 1e-9)


def timed(function, *arguments):
    start = time.perf_counter()
    result = function(*arguments)
    return result, time.perf_counter() - start


def search_rates(index, queries: np.ndarray, singles: int) -> dict:
    """Queries per second: the median of single queries, and one batch."""
    latencies = [
        timed(index.search, q[None], K_NEIGHBOURS)[1] for q in queries[:singles]
    ]
    (_, ids), seconds = timed(index.search, queries, K_NEIGHBOURS)
    return {
        "qps_batch_1": 1 / float(np.median(latencies)),
        "qps_batch": rate(len(queries), seconds),
        "ids": ids,
    }


def run_size(n: int, args, rng, directory: str) -> dict:
    codes = rng.integers(0, BLOCK_SIZE, (n, NUM_BLOCKS), dtype=np.uint8)
    width = NUM_BLOCKS * BLOCK_SIZE
    queries = np.maximum(rng.standard_normal((args.batch, width)), 0)
    queries = queries.astype(np.float32)
    singles = args.singles

    common.log(f"{n} items: SubicIndex")
    local = SubicIndex(NUM_BLOCKS, BLOCK_SIZE)
    _, local_add = timed(local.add, codes)
    local_search = search_rates(local, queries, singles)

    common.log(f"{n} items: Milvus Lite")
    remote = MilvusIndex(
        os.path.join(directory, f"codes{n}.db"), "codes", NUM_BLOCKS, BLOCK_SIZE
    )
    _, remote_add = timed(remote.add, codes)
    remote.search(queries[:1], K_NEIGHBOURS)  # the first search loads the index
    remote_search = search_rates(remote, queries, singles)
    remote.close()
    hits = [
        len(np.intersect1d(a, b))
        for a, b in zip(remote_search.pop("ids"), local_search.pop("ids"))
    ]
    return {
        "num_items": n,
        "subic_index": {
            "insert_items_per_second": rate(n, local_add),
            **local_search,
        },
        "milvus_lite": {
            "insert_items_per_second": rate(n, remote_add),
            **remote_search,
        },
        "milvus_recall_at_100_vs_subic_index": float(np.mean(hits)) / K_NEIGHBOURS,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        rows = [run_size(n, args, rng, directory) for n in args.sizes]
    report = {
        "command": " ".join(["python -m benchmarks.milvus_speed", *sys.argv[1:]]),
        "versions": common.versions("numpy", "faiss", "pymilvus", "milvus_lite"),
        "machine": common.machine(),
        "settings": {
            "num_blocks": NUM_BLOCKS,
            "block_size": BLOCK_SIZE,
            "k": K_NEIGHBOURS,
            "queries": "ReLU of standard normal; batch 1: median of single queries",
            "batch": args.batch,
            "singles": args.singles,
            "quick": args.quick,
            "seed": args.seed,
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": rows,
    }
    for row in rows:
        local, remote = row["subic_index"], row["milvus_lite"]
        inserts = remote["insert_items_per_second"]
        local_inserts = local["insert_items_per_second"]
        print(
            f"{row['num_items']:>9} items: insert {inserts:,.0f} items/s "
            f"(SubicIndex {local_inserts:,.0f}); "
            f"search {remote['qps_batch_1']:.1f} / {remote['qps_batch']:.1f} q/s "
            f"at batch 1 / {args.batch} (SubicIndex {local['qps_batch_1']:.1f} / "
            f"{local['qps_batch']:.1f}); recall@100 vs SubicIndex "
            f"{row['milvus_recall_at_100_vs_subic_index']:.4f}"
        )
    common.write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
