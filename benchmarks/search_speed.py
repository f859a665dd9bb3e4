"""Search speed of `SubicIndex`, on every scanner, against faiss's Hamming scan.

Databases of 1,000,000 random codes at K = 16, 64 and 256 (64 bits with
M = 16, 48 bits with M = 8, 64 bits with M = 8); queries are ReLU outputs
`max(0, N(0, 1))`, the shape of SuBiC's `z*` and the worst case for the
native scan's bounds. With `--model` (and `--data-dir`), also the codes and
queries of trained models: all 60,000 CIFAR-10 images encoded as the
database, 1,000 test images as queries. For query batches of 1, 100 and
1,000 (k = 100) it measures queries per second, recall@100 against a
float64 NumPy brute force (on `--truth-queries` queries) and bytes per
item for:

- every scanner this machine runs (`subic_keras.search.scanners`): the
  native exact scan with each kernel the CPU has (`native-vbmi`,
  `native-avx512bw`, `native-avx2`, `native-portable`; `native-neon` on
  aarch64), faiss's
  exact scan (`faiss`) and, for K = 16, faiss's fast scan with exact
  re-scoring (`faiss-fastscan`), each a `SubicIndex(..., scanner=...)`;
- `faiss_pq`: a plain faiss `IndexPQ` (one sub-quantizer per block,
  identity centroids) on the same codes;
- `hamming`: faiss `IndexBinaryFlat` on random hashes of the same number of
  bits (recall is not applicable: different codes);

faiss's indexes run as the library runs faiss (`faiss_scanners.in_threads`: the
queries split over the machine's cores, one OpenMP thread each), which is as
fast as faiss's own OpenMP threads under libgomp's default wait policy and
does not depend on `OMP_WAIT_POLICY` (faiss's own threads do: its Hamming
scan of 60,000 codes ran 21% slower with `PASSIVE`);
- `numpy`: a NumPy look-up-table scan, one query at a time (one `np.take`
  per block on block-major uint8 codes, the fastest plain NumPy form found),
  timed on a subset of queries and extrapolated (`extrapolated` in the JSON);
- `numpy_gather`: the naive NumPy form, one gather of the `(n, M)` table
  offsets then a row sum, timed the same way (for reference).

Every method runs in one process, interleaved, so each kernel meets
Hamming on the same machine at the same time; the JSON records the CPU
model and SIMD flags, and the OpenMP wait policy of the run (run it with
and without `OMP_WAIT_POLICY=PASSIVE` to compare: `omp_policy.py`).
Rates are wall-clock queries per second; queries per CPU-second of the
process (all threads) are recorded too, as they vary much less when other
processes share the machine.

Example:

    python -m benchmarks.search_speed                      # 1,000,000 items
    python -m benchmarks.search_speed --quick              # a few seconds
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
import time

import faiss
import numpy as np

from benchmarks import common
from benchmarks.scan_baselines import (
    brute_force,
    identity_pq,
    numpy_gather_scan,
    numpy_scan,
    recall,
)
from benchmarks.search_speed_report import print_table, ratios, targets
from subic_keras.search import SubicIndex, faiss_scanners, scanners, workers

K_NEIGHBOURS = 100
BATCHES = (1, 100, 1000)
CONFIGS = ((64, 16, 16), (48, 8, 64), (64, 8, 256))
BASELINES = ("faiss_pq", "hamming", "numpy", "numpy_gather")
NUMPY_METHODS = ("numpy", "numpy_gather")
# Each method's runs start on idle cores: faiss's OpenMP threads spin for
# milliseconds after a call (libgomp's default wait policy), which would
# otherwise be charged to whichever method runs next.
SETTLE_SECONDS = 0.1
# What `--cold` writes before each single query: more than any cache.
COLD_BYTES = 256 << 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--num-items",
        type=int,
        default=None,
        help="database size (default 1,000,000; 5,000 with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few thousand items and short timings, for smoke tests",
    )
    parser.add_argument(
        "--output",
        default=os.path.join("benchmarks", "results", "search_speed.json"),
        help="JSON results path (default benchmarks/results/search_speed.json)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count(),
        help="faiss OpenMP threads (default: all cores)",
    )
    parser.add_argument(
        "--numpy-queries",
        type=int,
        default=None,
        help="queries timed for the NumPy scan (default 10; 3 with --quick)",
    )
    parser.add_argument(
        "--truth-queries",
        type=int,
        default=None,
        help="queries checked against the NumPy brute force (default 50; 5 "
        "with --quick)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="a trained SuBiC .keras model whose CIFAR-10 codes are searched "
        "too (repeatable; needs --data-dir)",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("SUBIC_DATA_DIR"),
        help="directory holding cifar-10-batches-bin/, for --model (default: "
        "$SUBIC_DATA_DIR)",
    )
    parser.add_argument(
        "--cache-dir",
        default=os.path.join("benchmarks", "cache", "search_speed"),
        help="where the models' codes and queries are cached (default "
        "benchmarks/cache/search_speed)",
    )
    parser.add_argument(
        "--block-sizes",
        default="16,64,256",
        help="the random-code configurations to run, by K (default: %(default)s)",
    )
    parser.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help="M of the random codes (default: each configuration's, 16 at K = 16 "
        "and 8 at K = 64 and 256); faiss's Hamming scan gets as many bits",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=3,
        help="interleaved timing runs per method; the best counts (default 3; 1 "
        "with --quick)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="time each single query after sweeping the caches (a buffer of "
        f"{COLD_BYTES >> 20} MB written), as for an index larger than them "
        "(default: single queries in a row, the index as warm as it gets)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    if args.num_items is None:
        args.num_items = 5_000 if args.quick else 1_000_000
    if args.numpy_queries is None:
        args.numpy_queries = 3 if args.quick else 10
    if args.truth_queries is None:
        args.truth_queries = 5 if args.quick else 50
    if args.model and not args.data_dir:
        parser.error("--model needs --data-dir (or SUBIC_DATA_DIR)")
    for name in (
        "num_items",
        "threads",
        "numpy_queries",
        "truth_queries",
        "repetitions",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_blocks is not None:
        for block_size in (int(k) for k in args.block_sizes.split(",") if k):
            if args.num_blocks < 1 or code_bits(args.num_blocks, block_size) % 8:
                parser.error(
                    f"--num-blocks must give whole bytes at K = {block_size} "
                    f"(faiss's Hamming scan), received {args.num_blocks}"
                )
    return args


def code_bits(num_blocks: int, block_size: int) -> int:
    """`M·log2 K`, the bits of a code of `num_blocks` blocks of `block_size`."""
    return num_blocks * (block_size.bit_length() - 1)


def time_methods(
    searches: dict, reps: int, singles: int, cold: bool = False
) -> tuple[dict, dict, dict]:
    """Times every method at every batch size, interleaved to spread noise.

    Each repetition runs every (batch, method) once, so a burst of load from
    other processes hits all methods alike, each after `SETTLE_SECONDS` of
    rest. Batches of 100 and 1,000 keep
    their best run; single queries keep the median latency (with `cold`,
    each timed after the caches are swept). Process CPU time
    (all threads) is recorded too: on a shared machine, queries per
    CPU-second vary much less than wall-clock rates.

    Returns:
        `(qps, cpu_qps, ids)`: `qps[method][batch]`, the same per CPU-second,
        and each method's ids for the 1,000-query batch.
    """
    sweep = np.zeros(COLD_BYTES if cold else 0, np.uint8)
    wall = {m: {b: [] for b in BATCHES} for m in searches}
    cpu = {m: {b: [] for b in BATCHES} for m in searches}
    found = {}
    for _ in range(reps):
        for batch in BATCHES:
            for method, (search, queries) in searches.items():
                time.sleep(SETTLE_SECONDS)
                runs = (
                    [q[None] for q in queries[:singles]]
                    if batch == 1
                    else [queries[:batch]]
                )
                for block in runs:
                    if cold and batch == 1:
                        sweep += 1  # every line of the caches replaced
                    start, start_cpu = time.perf_counter(), time.process_time()
                    ids = search(block)[1]
                    wall[method][batch].append(time.perf_counter() - start)
                    cpu[method][batch].append(time.process_time() - start_cpu)
                if batch == max(BATCHES):
                    found.setdefault(method, ids)

    def rate(times: dict) -> dict:
        return {
            m: {
                b: 1 / np.median(t) if b == 1 else b / max(min(t), 1e-9)
                for b, t in by.items()
            }
            for m, by in times.items()
        }

    return rate(wall), rate(cpu), found


def run_config(bits, num_blocks, block_size, args, rng) -> list[dict]:
    """Random codes and ReLU queries."""
    codes = rng.integers(0, block_size, (args.num_items, num_blocks), dtype=np.uint8)
    queries = np.maximum(
        rng.standard_normal((max(BATCHES), num_blocks * block_size)), 0
    ).astype(np.float32)
    return measure(bits, codes, queries, args, rng, "random")


def measure(bits, codes, queries, args, rng, data: str) -> list[dict]:
    n, num_blocks = codes.shape
    block_size = queries.shape[1] // num_blocks
    k = min(K_NEIGHBOURS, n)
    nbits = block_size.bit_length() - 1
    common.log(f"{data}: {bits} bits, M={num_blocks}, K={block_size}, {n} items")
    indexes = {}
    for name in scanners.available(num_blocks, block_size):
        indexes[name] = SubicIndex(num_blocks, block_size, name)
        indexes[name].add(codes)
        indexes[name].search(queries[:1], k)  # lays the codes out

    pq = identity_pq(num_blocks, block_size)
    pq.add_sa_codes(faiss.pack_bitstrings(codes.astype(np.int32), nbits))
    hamming = faiss.IndexBinaryFlat(bits)
    hamming.add(rng.integers(0, 256, (n, bits // 8), dtype=np.uint8))
    hash_queries = rng.integers(0, 256, (max(BATCHES), bits // 8), dtype=np.uint8)

    searches = {
        name: (lambda q, index=index: index.search(q, k), queries)
        for name, index in indexes.items()
    }
    # faiss's own indexes run as the library runs faiss (`faiss_scanners.in_threads`):
    # as fast as faiss's OpenMP at its default wait policy, whatever the policy.
    searches["faiss_pq"] = (
        lambda q: faiss_scanners.in_threads(lambda part: pq.search(part, k), q),
        queries,
    )
    searches["hamming"] = (
        lambda q: faiss_scanners.in_threads(lambda part: hamming.search(part, k), q),
        hash_queries,
    )
    reps, singles = (1, 5) if args.quick else (args.repetitions, 20)
    qps, cpu_qps, found = time_methods(searches, reps, singles, args.cold)
    checked = min(args.truth_queries, len(queries))
    truth = brute_force(codes, queries[:checked], k)

    numpy_inputs = {
        "numpy": (numpy_scan, np.ascontiguousarray(codes.T)),
        "numpy_gather": (
            numpy_gather_scan,
            codes.astype(np.int32) + np.arange(num_blocks, dtype=np.int32) * block_size,
        ),
    }
    numpy_rates = {}
    for method, (scan, database) in numpy_inputs.items():
        latencies, cpu_latencies, numpy_found = [], [], []
        for query in queries[: args.numpy_queries]:
            start, start_cpu = time.perf_counter(), time.process_time()
            numpy_found.append(scan(database, query, k))
            latencies.append(time.perf_counter() - start)
            cpu_latencies.append(time.process_time() - start_cpu)
        numpy_rates[method] = (
            1 / float(np.median(latencies)),
            1 / max(float(np.median(cpu_latencies)), 1e-9),
            recall(np.stack(numpy_found)[:checked], truth[: len(numpy_found)]),
            len(latencies),
        )
    del numpy_inputs

    sizes = {
        **{name: (i.code_size, i.bytes_per_item) for name, i in indexes.items()},
        "faiss_pq": (int(pq.code_size), int(pq.code_size)),
        "hamming": (bits // 8, bits // 8),
        "numpy": (num_blocks, num_blocks),
        "numpy_gather": (num_blocks, num_blocks),
    }
    rows = []
    for method in [*indexes, *BASELINES]:
        for batch in BATCHES:
            row = {
                "data": data,
                "num_items": n,
                "bits": bits,
                "num_blocks": num_blocks,
                "block_size": block_size,
                "method": method,
                "scanner": method in indexes,
                "batch": batch,
                "code_bytes_per_item": sizes[method][0],
                "bytes_per_item": sizes[method][1],
            }
            if method in NUMPY_METHODS:
                rate, cpu_rate, numpy_recall, timed = numpy_rates[method]
                row["qps"] = rate
                row["qps_per_cpu_second"] = cpu_rate
                row["recall_at_100"] = numpy_recall
                row["extrapolated"] = True
                row["timed_queries"] = timed
            else:
                row["qps"] = float(qps[method][batch])
                row["qps_per_cpu_second"] = float(cpu_qps[method][batch])
                row["recall_at_100"] = (
                    None
                    if method == "hamming"
                    else recall(found[method][:checked], truth)
                )
                row["timing"] = (
                    f"median latency of {reps * singles} single queries"
                    + (", the caches swept before each" if args.cold else "")
                    if batch == 1
                    else f"best of {reps} interleaved runs"
                )
            rows.append(row)
    return rows


def model_data(path: str, args) -> tuple[np.ndarray, np.ndarray]:
    """A trained model's codes of all 60,000 CIFAR-10 images and the queries
    (its default kind) of the first 1,000 test images, cached by model."""
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:16]
    cached = os.path.join(args.cache_dir, f"cifar10-{digest}.npz")
    if os.path.isfile(cached):
        with np.load(cached, allow_pickle=False) as saved:
            return saved["codes"], saved["queries"]
    from subic_keras.data.datasets import load_cifar10
    from subic_keras.serving.export import load_subic

    common.log(f"encoding CIFAR-10 with {path}")
    subic = load_subic(path)
    (x_train, _), (x_test, _) = load_cifar10(
        os.path.join(args.data_dir, "cifar-10-batches-bin")
    )
    codes = subic.encode(np.concatenate([x_train, x_test]))
    queries = subic.query(x_test[: max(BATCHES)])
    dtype = np.uint8 if subic.block_size <= 256 else np.uint16
    os.makedirs(args.cache_dir, exist_ok=True)
    with common.atomic_output(cached, suffix=".npz") as tmp:
        np.savez(tmp, codes=codes.astype(dtype), queries=queries)
    return codes.astype(dtype), queries


def main(argv=None) -> dict:
    args = parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows = []
    wanted = {int(k) for k in args.block_sizes.split(",") if k}
    for bits, num_blocks, block_size in CONFIGS:
        if args.num_blocks is not None:
            num_blocks = args.num_blocks
            bits = code_bits(num_blocks, block_size)
        if block_size in wanted:
            rows += run_config(bits, num_blocks, block_size, args, rng)
    for path in args.model:
        codes, queries = model_data(path, args)
        num_blocks = codes.shape[1]
        bits = code_bits(num_blocks, queries.shape[1] // num_blocks)
        # A model's run directory names it (`cifar10-48b-s0/best.keras`).
        label = os.path.basename(os.path.dirname(os.path.abspath(path)))
        rows += measure(bits, codes, queries, args, rng, label)
    report = {
        "command": " ".join(
            [
                *(
                    [f"OMP_WAIT_POLICY={policy}"]
                    if (policy := os.environ.get("OMP_WAIT_POLICY"))
                    else []
                ),
                "python -m benchmarks.search_speed",
                *(sys.argv[1:] if argv is None else map(str, argv)),
            ]
        ),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "versions": {
            "faiss": faiss.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            **common.machine(),
            "faiss_simd_level": faiss.SIMDConfig.get_level_name(),
            "faiss_compile_options": faiss.get_compile_options().strip(),
            "scanners": scanners.available(8, 16),
            "faiss_threads": args.threads,
            "search_threads": workers.cores(),
            # OpenMP's wait policy of the run (unset: libgomp spins a while
            # after each parallel region before it sleeps).
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "processor": platform.processor() or platform.machine(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        "settings": {
            "num_items": args.num_items,
            "k": K_NEIGHBOURS,
            "batches": list(BATCHES),
            "quick": args.quick,
            "cold": args.cold,
            "seed": args.seed,
            "queries": "ReLU of standard normal, width M*K",
            "numpy_note": (
                f"NumPy scans timed on {args.numpy_queries} single queries; "
                "their queries/second is extrapolated to every batch size"
            ),
            "recall_reference": (
                f"float64 NumPy brute force on the first {args.truth_queries} "
                "queries, equal scores by position"
            ),
            "models": args.model,
        },
        "elapsed_seconds": time.perf_counter() - started,
        "results": rows,
        "ratios": ratios(rows),
        "targets": targets(rows),
    }
    print_table(rows)
    for target in report["targets"]:
        status = "met" if target["met"] else "NOT met"
        print(
            f"{target['target']}: {target['ratio']:.2f}x ({status}); per "
            f"CPU-second {target['ratio_per_cpu_second']:.2f}x"
        )
    with common.atomic_output(args.output) as tmp, open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
