"""Milvus Lite against SubicIndex: insert throughput and search speed.

For databases of 100,000 and 1,000,000 uniform random 48-bit codes (M = 8
blocks of K = 64) and ReLU-Gaussian queries, in one run: items inserted per
second (`MilvusIndex.add` into a fresh Milvus Lite file, `SubicIndex.add`),
queries per second for single queries (median latency) and for one batch
(`--batch`, default 20; k = 100), and the agreement of
Milvus's top 100 with SubicIndex's exact one (recall@100; ties aside). The
JSON goes to `benchmarks/results/milvus_speed.json` with the command and the
machine.

With `--pictures`, a folder's pictures instead (`MilvusPictures` against
`ImageIndex`): each item a path, a pixel fingerprint, its class code and an
instance code of the shipped code's shape (64 blocks of 16), and each query
(its instance query dense, with negatives, as FC0's logits are) answered
as `subic search` answers it (`answer` with the query's
fingerprint and instance query: both scans, the exact-copy look-up, the
paths). The JSON goes to `benchmarks/results/milvus_pictures_speed.json`.

    python -m benchmarks.milvus_speed
    python -m benchmarks.milvus_speed --sizes 20000 --quick
    python -m benchmarks.milvus_speed --pictures --sizes 10000,30000
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
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.milvus import MilvusIndex
from subic_keras.search.milvus_pictures import MilvusPictures

NUM_BLOCKS, BLOCK_SIZE = 8, 64
INSTANCE = (64, 16)  # the shipped instance code's blocks
K_NEIGHBOURS = 100
RESULTS = os.path.join("benchmarks", "results", "milvus_speed.json")
PICTURES = os.path.join("benchmarks", "results", "milvus_pictures_speed.json")


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
    parser.add_argument(
        "--pictures",
        action="store_true",
        help="a folder's pictures: MilvusPictures against ImageIndex, answers "
        "by both codes (default: codes alone)",
    )
    parser.add_argument(
        "--output", default=None, help="JSON results path (default: by mode)"
    )
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
    if args.output is None:
        args.output = PICTURES if args.pictures else RESULTS
    return args


def rate(count: int, seconds: float) -> float:
    return count / max(seconds, 1e-9)


def timed(function, *arguments):
    start = time.perf_counter()
    result = function(*arguments)
    return result, time.perf_counter() - start


def search_rates(search, queries, singles: int) -> dict:
    """Queries per second of `search(rows) -> ids`: the median of single
    queries, and one batch (`queries`: arrays of one row per query)."""
    latencies = [
        timed(search, [part[i : i + 1] for part in queries])[1] for i in range(singles)
    ]
    ids, seconds = timed(search, queries)
    return {
        "qps_batch_1": 1 / float(np.median(latencies)),
        "qps_batch": rate(len(queries[0]), seconds),
        "ids": ids,
    }


def _searched(index):
    return lambda parts: index.search(parts[0], K_NEIGHBOURS)[1]


def _answered(index):
    """`answer` by both codes with fingerprints, as `subic search` asks."""

    def answer(parts):
        queries, instance_queries, fingerprints = parts
        rows = index.answer(
            queries, K_NEIGHBOURS, fingerprints=fingerprints,
            instance_queries=instance_queries,
        )  # fmt: skip
        return [[row["id"] for row in answer] for answer in rows]

    return answer


def run_pictures(n: int, args, rng, directory: str) -> dict:
    """One size of `--pictures`: both indexes of the same n pictures."""
    codes = rng.integers(0, BLOCK_SIZE, (n, NUM_BLOCKS), dtype=np.uint8)
    near = rng.integers(0, INSTANCE[1], (n, INSTANCE[0]), dtype=np.uint8)
    paths = [f"{i % 100:02d}/{i:07d}.png" for i in range(n)]
    fingerprints = rng.integers(1, 2**63, n, dtype=np.uint64)
    queries = [
        np.maximum(rng.standard_normal((args.batch, NUM_BLOCKS * BLOCK_SIZE)), 0),
        # An instance code's query is FC0's logits: dense, with negatives.
        rng.standard_normal((args.batch, INSTANCE[0] * INSTANCE[1])),
        fingerprints[rng.integers(0, n, args.batch)],  # each query a stored picture
    ]
    record = {"digest": "0" * 64, "copy_margin": -10.0}
    common.log(f"{n} pictures: ImageIndex")
    local = ImageIndex(NUM_BLOCKS, BLOCK_SIZE, directory, instance=INSTANCE)
    local.instance.model = record
    _, local_add = timed(local.add, codes, paths, fingerprints, None, None, near)
    local_answer = search_rates(_answered(local), queries, args.singles)
    common.log(f"{n} pictures: MilvusPictures on Milvus Lite")
    remote = MilvusPictures(
        os.path.join(directory, f"pictures{n}.db"), "pictures", NUM_BLOCKS,
        BLOCK_SIZE, root=directory, instance=INSTANCE, instance_model=record,
    )  # fmt: skip
    _, remote_add = timed(remote.add, codes, paths, fingerprints, None, None, near)
    _answered(remote)([part[:1] for part in queries])  # loads the index
    remote_answer = search_rates(_answered(remote), queries, args.singles)
    remote.close()
    same = [
        a[:10] == b[:10]
        for a, b in zip(remote_answer.pop("ids"), local_answer.pop("ids"))
    ]
    return {
        "num_items": n,
        "image_index": {"insert_items_per_second": rate(n, local_add), **local_answer},
        "milvus_lite": {
            "insert_items_per_second": rate(n, remote_add),
            **remote_answer,
        },
        "milvus_same_first_10": float(np.mean(same)),
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
    local_search = search_rates(_searched(local), [queries], singles)

    common.log(f"{n} items: Milvus Lite")
    remote = MilvusIndex(
        os.path.join(directory, f"codes{n}.db"), "codes", NUM_BLOCKS, BLOCK_SIZE
    )
    _, remote_add = timed(remote.add, codes)
    remote.search(queries[:1], K_NEIGHBOURS)  # the first search loads the index
    remote_search = search_rates(_searched(remote), [queries], singles)
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
    run = run_pictures if args.pictures else run_size
    with tempfile.TemporaryDirectory() as directory:
        rows = [run(n, args, rng, directory) for n in args.sizes]
    report = {
        "command": " ".join(["python -m benchmarks.milvus_speed", *sys.argv[1:]]),
        "versions": common.versions("numpy", "faiss", "pymilvus", "milvus_lite"),
        "machine": common.machine(),
        "settings": {
            "num_blocks": NUM_BLOCKS,
            "block_size": BLOCK_SIZE,
            "k": K_NEIGHBOURS,
            "queries": "ReLU of standard normal; batch 1: median of single queries",
            "pictures": args.pictures,
            "batch": args.batch,
            "singles": args.singles,
            "quick": args.quick,
            "seed": args.seed,
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": rows,
    }
    name = "ImageIndex" if args.pictures else "SubicIndex"
    for row in rows:
        local, remote = (
            row["image_index" if args.pictures else "subic_index"],
            row["milvus_lite"],
        )
        inserts = remote["insert_items_per_second"]
        local_inserts = local["insert_items_per_second"]
        print(
            f"{row['num_items']:>9} items: insert {inserts:,.0f} items/s "
            f"({name} {local_inserts:,.0f}); "
            f"search {remote['qps_batch_1']:.1f} / {remote['qps_batch']:.1f} q/s "
            f"at batch 1 / {args.batch} ({name} {local['qps_batch_1']:.1f} / "
            f"{local['qps_batch']:.1f})"
            + (
                f"; the same first 10 as ImageIndex {row['milvus_same_first_10']:.2f}"
                if args.pictures
                else "; recall@100 vs SubicIndex "
                f"{row['milvus_recall_at_100_vs_subic_index']:.4f}"
            )
        )
    common.write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
