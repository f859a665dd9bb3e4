"""What the native scan gains from queries sharing code loads, and a single
query from its rows split among the cores.

The x86 kernels of 4-bit sub-codes (`K = 16`) scan four consecutive queries
of a batch in one pass over the codes, taking each load's nibbles apart
once for the four (AVX2: then two, then one, where fewer are left;
`subic_keras.search.native`). On 1,000,000 random codes of 64, 128 and 256
bits (16, 32 and 64 blocks of 16), each such kernel this CPU runs scans
batches of 1,000 ReLU queries on one thread with at most 1, 2 and 4 queries
a load (`native.search(..., queries_per_load=)`; AVX-512 kernels have no
two-query pass), the best of `--repetitions` runs kept, and the results are
checked equal. A single query is timed on one thread and on every core (a
database of at least twice 12 MB of codes is scanned in ranges of rows, one
a core, their top `k`s merged), the median of `--singles` queries a
repetition. Every method is timed at every batch size in turn, as
`search_speed` times its methods (`search_speed.time_methods`).

Example:

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.shared_loads
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import common
from benchmarks.search_speed import BATCHES, time_methods
from subic_keras.search import native, workers

BLOCK_SIZE = 16
K_NEIGHBOURS = 100
BATCH = max(BATCHES)
# The passes each kernel has: AVX-512's nibble kernels share loads among
# four queries or scan one.
PASSES = {"avx2": (1, 2, 4), "avx512bw": (1, 4), "vbmi": (1, 4)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-items", type=int, default=None)
    parser.add_argument(
        "--num-blocks", default="16,32,64", help="M of the codes (default: 16,32,64)"
    )
    parser.add_argument(
        "--repetitions", type=int, default=3, help="interleaved runs (default 3)"
    )
    parser.add_argument(
        "--singles",
        type=int,
        default=20,
        help="single queries timed a repetition (default 20)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="20,000 items, one run: a smoke test"
    )
    parser.add_argument(
        "--output",
        default=os.path.join("benchmarks", "results", "shared_loads.json"),
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def kernel_rows(layout, tiles, n, queries, kernel, reps, singles) -> list[dict]:
    """Batches of `queries` on one thread at each number of queries a load,
    and single queries on one thread and on every core, interleaved
    (`search_speed.time_methods`)."""

    def search(threads: int, per_load: int | None = None):
        return lambda block: native.search(
            layout, tiles, n, block, K_NEIGHBOURS, threads, kernel,
            queries_per_load=per_load,
        )  # fmt: skip

    methods = {p: (search(1, p), queries) for p in PASSES[kernel]}
    cores = workers.cores()
    if cores > 1:
        methods["cores"] = (search(cores), queries)
    qps, cpu_qps, found = time_methods(methods, reps, singles)
    for method, ids in found.items():
        if not np.array_equal(ids, found[1]):
            raise AssertionError(f"{kernel}, {method}: other items than one a load")
    batch = len(queries)
    rows = [
        {
            "kernel": kernel,
            "batch": batch,
            "threads": 1,
            "queries_per_load": p,
            "qps": qps[p][batch],
            "qps_per_cpu_second": cpu_qps[p][batch],
            "over_one_a_load": qps[p][batch] / qps[1][batch],
            "timing": f"best of {reps} interleaved runs",
        }
        for p in PASSES[kernel]
    ]
    # A single query on one thread: the kernel's own pass (a query alone).
    alone = max(PASSES[kernel])
    for threads, method in ((1, alone), (cores, "cores")):
        if method in methods:
            rows.append(
                {
                    "kernel": kernel,
                    "batch": 1,
                    "threads": threads,
                    "qps": qps[method][1],
                    "qps_per_cpu_second": cpu_qps[method][1],
                    "over_one_thread": qps[method][1] / qps[alone][1],
                    "timing": f"median latency of {reps * singles} single queries",
                }
            )
    return rows


def measure(num_blocks: int, args, rng) -> list[dict]:
    n = args.num_items
    codes = rng.integers(0, BLOCK_SIZE, (n, num_blocks), dtype=np.uint8)
    queries = np.maximum(
        rng.standard_normal((BATCH, num_blocks * BLOCK_SIZE)), 0
    ).astype(np.float32)
    reps, count = (1, 3) if args.quick else (args.repetitions, args.singles)
    rows = []
    for kernel in native.kernels():
        if kernel not in PASSES:
            continue
        layout = native.Layout.for_kernel(num_blocks, BLOCK_SIZE, kernel, n)
        if layout.bits != 4:
            continue  # VBMI scans short codes of large databases as bytes
        tiles = layout.tiles(layout.columns_of(codes))
        common.log(f"{num_blocks * 4} bits, {kernel}")
        for row in kernel_rows(layout, tiles, n, queries, kernel, reps, count):
            rows.append(
                {
                    "num_items": n,
                    "bits": num_blocks * 4,
                    "num_blocks": num_blocks,
                    "block_size": BLOCK_SIZE,
                    "code_megabytes": n * num_blocks / 2 / 2**20,
                    **row,
                }
            )
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.num_items is None:
        args.num_items = 20_000 if args.quick else 1_000_000
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    rows = []
    for num_blocks in (int(m) for m in args.num_blocks.split(",")):
        rows += measure(num_blocks, args, rng)
    report = {
        **common.run_metadata("shared_loads", "numpy"),
        "search_threads": workers.cores(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    for r in rows:
        if r["batch"] > 1:
            print(
                f"{r['bits']:>4} bits {r['kernel']:<9} batch of {r['batch']}, one "
                f"thread, {r['queries_per_load']} a load: {r['qps']:8.1f} q/s "
                f"({r['over_one_a_load']:.2f}x one a load)"
            )
        else:
            print(
                f"{r['bits']:>4} bits {r['kernel']:<9} single query, "
                f"{r['threads']} thread(s): {r['qps']:8.1f} q/s "
                f"({r['over_one_thread']:.2f}x one thread)"
            )
    common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
