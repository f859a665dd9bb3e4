"""Latency and throughput of `subic serve` under concurrent load, on loopback.

Starts the real server (`subic serve`, a child process) on an index of
`--items` random codes of `subic train`'s shape (`TrainConfig`: 12 blocks
of 16, 48 bits) with synthetic paths, and an untrained model of the same
shape (speed does not depend on the weights).
Bounded clients on this machine then send requests over keep-alive HTTP
connections, at 1, 4 and 16 concurrent clients, each level for
`--requests` requests or `--seconds`, whichever ends first:

- `query`: `POST /search/query`, a query vector already computed (ReLU
  outputs `max(0, N(0, 1))`, the shape of SuBiC's `z*`): the cost of HTTP,
  JSON and the search;
- `image`: `POST /search` with a 32×32 PNG: decoding, encoding with the
  model, searching, and the answer.

Beside them, in the same run: in-process `SubicIndex.search` of one query at
a time on the same codes (what the server's search costs without HTTP).
Clients and server share the machine's cores, so throughput is the whole
machine's. Everything is recorded with the CPU model and the scanner
(`--scanner`, as `subic serve` takes it; `faiss` is what a machine without
a C compiler gets).

Example:

    python -m benchmarks.serve_load                  # 1,000,000 codes
    python -m benchmarks.serve_load --items 20000 --requests 40 --quick
    python -m benchmarks.serve_load --scanner faiss \
        --output benchmarks/results/serve_load_faiss.json
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks.common import log, run_metadata, run_threads, simd_flags, write_json
from subic_keras.config import TrainConfig

# The shape `subic train` gives a model (and the codes it writes).
M, K = TrainConfig.num_blocks, TrainConfig.block_size
CONCURRENCY = (1, 4, 16)
K_RESULTS = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=1_000_000, help="index size")
    parser.add_argument(
        "--requests", type=int, default=600, help="requests per level at most"
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="time per level at most"
    )
    parser.add_argument(
        "--quick", action="store_true", help="levels 1 and 4 only (for tests)"
    )
    parser.add_argument(
        "--output",
        default=os.path.join("benchmarks", "results", "serve_load.json"),
        help="the JSON report",
    )
    parser.add_argument(
        "--scanner",
        default="auto",
        help="what scans the codes, in the server and in process (default: auto)",
    )
    return parser.parse_args(argv)


# --------------------------------------------------------------------------
# What is served


def build_index(directory: str, items: int, seed: int = 0) -> str:
    """An `ImageIndex` of `items` random codes with synthetic paths, saved."""
    from subic_keras.search.image_index import ImageIndex

    rng = np.random.default_rng(seed)
    root = os.path.join(directory, "photos")
    os.makedirs(root, exist_ok=True)  # a server serves only a folder that exists
    index = ImageIndex(M, K, root, (32, 32, 3))
    codes = rng.integers(0, K, size=(items, M))
    paths = [f"synthetic/{i // 1000:04d}/{i:07d}.png" for i in range(items)]
    fingerprints = rng.integers(1, 2**63, size=items).astype(np.uint64)
    index.add(codes, paths, fingerprints)
    path = os.path.join(directory, "photos.subic")
    index.save(path)
    return path


def build_model(directory: str) -> str:
    from subic_keras import build_subic
    from subic_keras.models import backbones

    path = os.path.join(directory, "model.keras")
    build_subic(backbones.dsh_cnn(), M, K, 10).train_model.save(path)
    return path


def png(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def relu_queries(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(rng.standard_normal((n, M * K)), 0).astype(np.float32)


# --------------------------------------------------------------------------
# The server and its clients


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model: str, index: str, port: int, scanner: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "subic_keras.cli", "serve", model, index,
         "--port", str(port), "--scanner", scanner],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"subic serve exited: {process.stderr.read()}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.25)
    process.kill()
    raise RuntimeError("subic serve did not answer within 300 s")


def load(port: int, make_request, clients: int, requests: int, seconds: float) -> dict:
    """`clients` threads send at most `requests` requests in all, for at most
    `seconds`; latencies in ms, throughput in requests per second."""
    latencies: list[float] = []
    served: list[float] = []  # the server's own time, as its answers say
    errors: list[int] = []
    lock = threading.Lock()
    sent = [0]
    deadline = time.perf_counter() + seconds

    def client(number: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.perf_counter() < deadline:
            with lock:
                if sent[0] >= requests:
                    break
                sent[0] += 1
                serial = sent[0]
            method, path, body, headers = make_request(serial)
            start = time.perf_counter()
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            elapsed = 1000 * (time.perf_counter() - start)
            with lock:
                latencies.append(elapsed)
                if response.status != 200:
                    errors.append(response.status)
                elif b'"milliseconds"' in answer:
                    served.append(json.loads(answer)["milliseconds"])
        connection.close()

    wall = run_threads(
        [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    )
    latencies.sort()
    row = {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "seconds": round(wall, 3),
        "requests_per_second": round(len(latencies) / wall, 1),
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
    }
    if served:  # what the request spent in the server's search and checks
        row["server_p50_ms"] = round(statistics.median(served), 3)
    return row


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, int(np.ceil(q / 100 * len(sorted_values))) - 1)
    return sorted_values[max(rank, 0)]


def in_process_latency(index_path: str, queries: np.ndarray, scanner: str) -> dict:
    """One query at a time through `SubicIndex.search`, in this process."""
    from subic_keras.search import SubicIndex

    index = SubicIndex.load(index_path, scanner=scanner)
    index.search(queries[:1], K_RESULTS)  # builds the scan's tiles
    times = []
    for query in queries:
        start = time.perf_counter()
        index.search(query[None], K_RESULTS)
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return {
        "queries": len(times),
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 99), 3),
    }


# --------------------------------------------------------------------------


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.time()
    from subic_keras.search import SubicIndex

    levels = CONCURRENCY[:2] if args.quick else CONCURRENCY
    queries = relu_queries(max(args.requests, 200))
    pictures = [png(seed) for seed in range(32)]
    with tempfile.TemporaryDirectory() as directory:
        log(f"building an index of {args.items:,} random codes")
        index_path = build_index(directory, args.items)
        model_path = build_model(directory)
        log("in-process SubicIndex.search, one query at a time")
        in_process = in_process_latency(index_path, queries[:200], args.scanner)
        port = free_port()
        log(f"starting subic serve on 127.0.0.1:{port}")
        server = start_server(model_path, index_path, port, args.scanner)
        try:

            def query_request(serial: int):
                body = json.dumps({"query": queries[serial % len(queries)].tolist()})
                return (
                    "POST",
                    f"/search/query?k={K_RESULTS}",
                    body,
                    {"Content-Type": "application/json"},
                )

            def image_request(serial: int):
                return (
                    "POST",
                    f"/search?k={K_RESULTS}",
                    pictures[serial % len(pictures)],
                    {"Content-Type": "image/png"},
                )

            rows = []
            for kind, make in (("query", query_request), ("image", image_request)):
                load(port, make, 1, 10, 30)  # warm-up
                for clients in levels:
                    row = load(port, make, clients, args.requests, args.seconds)
                    row["kind"] = kind
                    rows.append(row)
                    log(
                        f"{kind:5s} x{clients:<2d}: p50 {row['p50_ms']:.2f} ms, "
                        f"p99 {row['p99_ms']:.2f} ms, {row['requests_per_second']} "
                        f"req/s ({row['requests']} requests, {row['errors']} errors)"
                    )
        finally:
            server.terminate()
            server.wait(60)
    query_single = next(r for r in rows if r["kind"] == "query" and r["clients"] == 1)
    best_image = max(
        (r["requests_per_second"] for r in rows if r["kind"] == "image"), default=0
    )
    report = {
        "benchmark": "serve_load",
        **run_metadata("serve_load", "numpy", "tensorflow", "keras", "fastapi"),
        "cpu_flags": simd_flags(),
        "scanner": SubicIndex(M, K, args.scanner).scanner,
        "items": args.items,
        "num_blocks": M,
        "block_size": K,
        "bits": M * (K.bit_length() - 1),
        "k": K_RESULTS,
        "in_process": in_process,
        "load": rows,
        "goals": {
            "query_p50_over_in_process_p50": round(
                query_single["p50_ms"] / in_process["p50_ms"], 2
            ),
            "query_p50_goal": "<= 2",
            # The rest of a request: HTTP on loopback, uvicorn, Starlette's
            # thread pool and JSON, beside the server's own time.
            "query_p50_outside_server_ms": round(
                query_single["p50_ms"] - query_single.get("server_p50_ms", 0.0), 3
            ),
            "image_requests_per_second": best_image,
            "image_goal": ">= 50",
        },
        "wall_seconds": round(time.time() - started, 1),
    }
    print(json.dumps(report["goals"]))
    write_json(args.output, report)
    log(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
