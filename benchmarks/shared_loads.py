"""What the native scan gains from queries sharing code loads, and a single
query from its rows split among the cores.

The x86 kernels of 4-bit sub-codes (`K = 16`) scan four consecutive queries
of a batch in one pass over the codes, taking each load's nibbles apart
once for the four (AVX2: then two, then one, where fewer are left;
`subic_keras.search.native`). On 1,000,000 random codes of 64, 128 and 256
bits (16, 32 and 64 blocks of 16), each such kernel this CPU runs scans
batches of 1,000 ReLU queries on one thread with at most 1, 2 and 4 queries
a load (`native.search(..., queries_per_load=)`; AVX-512 kernels have no
two-query pass), interleaved, the best of `--repetitions` runs kept, and
the results are checked equal. A single query is timed on one thread and
on every core (a database of at least twice 12 MB of codes is scanned in
ranges of rows, one a core, their top `k`s merged), the median of
`--singles` queries.

Example:

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.shared_loads
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import common
from subic_keras.search import native, workers

BLOCK_SIZE = 16
K_NEIGHBOURS = 100
BATCH = 1000
# The passes each kernel has: AVX-512's nibble kernels share loads among
# four queries or scan one.
PASSES = {"avx2": (1, 2, 4), "avx512bw": (1, 4), "vbmi": (1, 4)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-items", type=int, default=None)
    parser.add_argument(
        "--num-blocks", default="16,32,64", help="M of the codes (default: 16,32,64)"
    )
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--singles", type=int, default=50)
    parser.add_argument(
        "--quick", action="store_true", help="20,000 items, one run: a smoke test"
    )
    parser.add_argument(
        "--output",
        default=os.path.join("benchmarks", "results", "shared_loads.json"),
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _timed(search) -> tuple[float, float, np.ndarray]:
    start, start_cpu = time.perf_counter(), time.process_time()
    positions = search()[1]
    return time.perf_counter() - start, time.process_time() - start_cpu, positions


def batches(layout, tiles, n, queries, kernel, reps) -> list[dict]:
    """Batches on one thread at each number of queries a load, interleaved."""
    walls = {p: [] for p in PASSES[kernel]}
    cpus = {p: [] for p in PASSES[kernel]}
    found = {}
    for _ in range(reps):
        for per_load in PASSES[kernel]:
            wall, cpu, found[per_load] = _timed(
                lambda p=per_load: native.search(
                    layout,
                    tiles,
                    n,
                    queries,
                    K_NEIGHBOURS,
                    1,
                    kernel,
                    queries_per_load=p,
                )
            )
            walls[per_load].append(wall)
            cpus[per_load].append(cpu)
    for per_load, positions in found.items():
        if not np.array_equal(positions, found[1]):
            raise AssertionError(
                f"{kernel}: {per_load} queries a load found other items than one"
            )
    one = len(queries) / min(walls[1])
    return [
        {
            "kernel": kernel,
            "batch": len(queries),
            "threads": 1,
            "queries_per_load": per_load,
            "qps": len(queries) / min(walls[per_load]),
            "qps_per_cpu_second": len(queries) / max(min(cpus[per_load]), 1e-9),
            "over_one_a_load": len(queries) / min(walls[per_load]) / one,
            "timing": f"best of {reps} interleaved runs",
        }
        for per_load in PASSES[kernel]
    ]


def singles(layout, tiles, n, queries, kernel, count) -> list[dict]:
    """Single queries on one thread and on every core, interleaved."""
    cores = workers.cores()
    threads = (1, cores) if cores > 1 else (1,)
    walls = {t: [] for t in threads}
    cpus = {t: [] for t in threads}
    for query in queries[:count]:
        for t in threads:
            wall, cpu, _ = _timed(
                lambda t=t, q=query[None]: native.search(
                    layout, tiles, n, q, K_NEIGHBOURS, t, kernel
                )
            )
            walls[t].append(wall)
            cpus[t].append(cpu)
    return [
        {
            "kernel": kernel,
            "batch": 1,
            "threads": t,
            "qps": 1 / float(np.median(walls[t])),
            "qps_per_cpu_second": 1 / max(float(np.median(cpus[t])), 1e-9),
            "over_one_thread": float(np.median(walls[1]) / np.median(walls[t])),
            "timing": f"median latency of {len(walls[t])} single queries",
        }
        for t in threads
    ]


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
        for row in [
            *batches(layout, tiles, n, queries, kernel, reps),
            *singles(layout, tiles, n, queries, kernel, count),
        ]:
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
