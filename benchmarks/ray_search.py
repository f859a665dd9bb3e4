"""Sharded search on Ray against one in-process index, on one machine.

`RayIndex` (`subic_keras.search.ray_index`) puts each shard of a manifest
in a Ray actor and merges the shards' top `k`. This measures, on
trained-like codes (M = 8, K = 64, `benchmarks.filter_speed`), with ReLU
queries and k = 100, in one run:

- in-process `SubicIndex` against `RayIndex` with 1, 2 and 4 shards (a
  local Ray instance on this machine): queries per second in batches of
  1,000, and single-query p50 / p99 latency;
- the resident memory of Ray's worker processes;
- recovery: the longest search while a shard's actor is killed (it
  restarts and reloads its file), and results checked exact throughout;
- a model of 1,000,000,000 codes on N machines from the measured per-shard
  scan rate and fan-out cost.

    python -m benchmarks.ray_search                 # ~10 min on 2 cores
    python -m benchmarks.ray_search --num-items 1000000   # a quick run

Writes `benchmarks/results/ray_search.json` with the command, CPU and
versions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np

from benchmarks import common
from benchmarks.filter_speed import trained_like_codes
from subic_keras.search import SubicIndex
from subic_keras.search.manifests import save_shards
from subic_keras.search.ray_index import RayIndex

RESULTS = os.path.join(os.path.dirname(__file__), "results", "ray_search.json")
K = 100


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-items", type=int, default=10_000_000)
    parser.add_argument("--singles", type=int, default=200)
    parser.add_argument("--output", default=RESULTS)
    return parser.parse_args(argv)


def speed(index, batch: np.ndarray, singles: np.ndarray) -> dict:
    index.search(batch[:10], K)  # layouts built, actors warm
    start = time.perf_counter()
    index.search(batch, K)
    batch_s = time.perf_counter() - start
    times = []
    for query in singles:
        start = time.perf_counter()
        index.search(query[None], K)
        times.append(time.perf_counter() - start)
    return {
        "queries_per_second": len(batch) / batch_s,
        "single_p50_ms": 1000 * float(np.percentile(times, 50)),
        "single_p99_ms": 1000 * float(np.percentile(times, 99)),
    }


def ray_memory_mb() -> float:
    """Resident memory of Ray's processes (raylet, GCS, workers), MB."""
    import psutil

    total = 0
    for process in psutil.process_iter(["name", "cmdline", "memory_info"]):
        command = " ".join(process.info["cmdline"] or [])
        if (
            "ray" in (process.info["name"] or "")
            or "ray::" in command
            or ("raylet" in command or "gcs_server" in command)
        ):
            total += process.info["memory_info"].rss
    return total / 1e6


def recovery(remote: RayIndex, batch: np.ndarray, expected) -> dict:
    """Searches in a loop while a shard's actor is killed."""
    import ray

    stalls, failures = [], 0
    done = threading.Event()

    def loop():
        nonlocal failures
        while not done.is_set():
            start = time.perf_counter()
            try:
                _, ids = remote.search(batch, K)
                failures += not np.array_equal(ids, expected)
            except Exception:  # counted and reported
                failures += 1
            stalls.append(time.perf_counter() - start)

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(1.0)
    ray.kill(remote.actors[-1], no_restart=False)
    time.sleep(8.0)
    done.set()
    thread.join()
    return {
        "searches": len(stalls),
        "failed_or_inexact": failures,
        "longest_search_s": max(stalls),
        "median_search_s": float(np.median(stalls)),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    import ray

    rng = np.random.default_rng(0)
    codes = trained_like_codes(rng, args.num_items)
    batch = np.maximum(rng.standard_normal((1000, 512)), 0).astype(np.float32)
    singles = np.maximum(rng.standard_normal((args.singles, 512)), 0).astype(np.float32)
    index = SubicIndex(8, 64)
    index.add(codes)
    expected = index.search(batch[:10], K)[1]
    results = {"in_process": speed(index, batch, singles)}
    common.log(f"in process: {results['in_process']}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(log_to_driver=False, include_dashboard=False)
    with tempfile.TemporaryDirectory() as folder:
        for shards in (1, 2, 4):
            manifest = os.path.join(folder, f"s{shards}.shards.json")
            save_shards(index, manifest, shards)
            start = time.perf_counter()
            remote = RayIndex(manifest)
            opened = time.perf_counter() - start
            got = remote.search(batch[:10], K)[1]
            entry = speed(remote, batch, singles)
            entry.update(
                exact=bool(np.array_equal(got, expected)),
                open_s=opened,
                ray_memory_mb=ray_memory_mb(),
                throughput_ratio=entry["queries_per_second"]
                / results["in_process"]["queries_per_second"],
                added_single_ms=entry["single_p50_ms"]
                - results["in_process"]["single_p50_ms"],
            )
            if shards == 4:
                entry["recovery"] = recovery(remote, batch[:10], expected)
            results[f"ray_{shards}_shards"] = entry
            common.log(f"{shards} shards: {entry}")
            for actor in remote.actors:
                ray.kill(actor, no_restart=True)
    ray.shutdown()
    # A model: a search costs the slowest shard's scan plus the fan-out.
    one = results["ray_1_shards"]
    per_item_s = 1 / (one["queries_per_second"] * args.num_items)  # per query
    fan_out_ms = max(0.0, one["added_single_ms"])
    model = {}
    for machines in (1, 10, 100):
        items = 1_000_000_000 / machines
        model[f"{machines}_machines"] = {
            "codes_per_machine": items,
            "queries_per_second_batched": 1 / (per_item_s * items),
            "single_query_ms_estimate": results["in_process"]["single_p50_ms"]
            * items
            / args.num_items
            + fan_out_ms,
        }
    result = {
        **common.run_metadata("ray_search", "numpy", "ray"),
        "items": args.num_items,
        "k": K,
        "results": results,
        "billion_code_model": model,
    }
    common.write_json(args.output, result)
    base = results["in_process"]
    print(
        f"in process: {base['queries_per_second']:.0f} q/s, single p50 "
        f"{base['single_p50_ms']:.2f} ms"
    )
    for shards in (1, 2, 4):
        entry = results[f"ray_{shards}_shards"]
        print(
            f"Ray, {shards} shards: {entry['queries_per_second']:.0f} q/s "
            f"({entry['throughput_ratio']:.2f}x), single p50 "
            f"{entry['single_p50_ms']:.2f} ms (+{entry['added_single_ms']:.2f}), "
            f"p99 {entry['single_p99_ms']:.2f} ms, exact {entry['exact']}"
        )
    rec = results["ray_4_shards"]["recovery"]
    print(
        f"actor killed: {rec['failed_or_inexact']} failed or inexact of "
        f"{rec['searches']} searches, longest {rec['longest_search_s']:.2f} s"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
