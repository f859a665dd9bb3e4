"""Memory of `subic serve` under decompression bombs: peak RSS over idle.

Starts the real server (`subic serve`, a child process, default settings:
`--max-decode-mb 128`) on a small index, and sends pictures that are small
files but huge decodes, one at a time and three at once:

- a 16-bit grey PNG of 10,000 × 10,000 (190 KB; refused from its header:
  decoding it takes more memory than the server decodes with);
- an RGB PNG of 15,000 × 15,000 (650 KB; refused: more pixels than
  `images.MAX_PIXELS`);
- an RGB PNG of 5,000 × 2,000 (30 KB; decoded: it fits the budget, so three
  at once take turns instead of adding up).

For each case the server's peak resident memory (Linux `VmHWM`, reset
through `/proc/PID/clear_refs` before the case) is reported against its
resident memory at rest, with the answers' statuses and the wall time.

Example:

    python -m benchmarks.decode_memory
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import threading
import time

from benchmarks.bombs import GREY, RGB, png_bomb
from benchmarks.common import log, run_metadata, run_threads, write_json
from benchmarks.serve_load import build_index, build_model, free_port, start_server

LIMIT_MB = 200  # the goal: peak within this much of the idle server


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--output",
        default="benchmarks/results/decode_memory.json",
        help="where the JSON goes (default: %(default)s)",
    )
    return parser.parse_args(argv)


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _post(port: int, data: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("POST", "/search", data, {"Content-Type": "image/png"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def measure(pid: int, port: int, data: bytes, copies: int) -> dict:
    """Peak RSS over idle while `copies` uploads of `data` run at once."""
    time.sleep(1.0)
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # resets the peak (VmHWM) to the current RSS
    idle = _status_kb(pid, "VmRSS")
    statuses: list[int] = []
    seconds = run_threads(
        [
            threading.Thread(target=lambda: statuses.append(_post(port, data)))
            for _ in range(copies)
        ]
    )
    peak = _status_kb(pid, "VmHWM")
    return {
        "copies": copies,
        "statuses": sorted(statuses),
        "idle_mb": round(idle / 1024, 1),
        "peak_over_idle_mb": round((peak - idle) / 1024, 1),
        "seconds": round(seconds, 2),
    }


def run(directory: str) -> list[dict]:
    """Every case against one server; the rows of the result."""
    cases = {
        "16-bit grey PNG 10000x10000": png_bomb(10_000, 10_000, 16, GREY),
        "RGB PNG 15000x15000": png_bomb(15_000, 15_000, 8, RGB),
        "RGB PNG 5000x2000": png_bomb(5_000, 2_000, 8, RGB),
    }
    port = free_port()
    process = start_server(
        build_model(directory), build_index(directory, 1000), port, "auto"
    )
    try:
        rows = []
        for name, data in cases.items():
            for copies in (1, 3):
                row = {"picture": name, "file_kb": round(len(data) / 1024)}
                row.update(measure(process.pid, port, data, copies))
                log(
                    f"{name} x{copies}: {row['statuses']}, peak "
                    f"{row['peak_over_idle_mb']} MB over idle ({row['seconds']} s)"
                )
                rows.append(row)
        return rows
    finally:
        process.terminate()
        process.wait(60)


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        rows = run(directory)
    worst = max(row["peak_over_idle_mb"] for row in rows)
    result = {
        **run_metadata("decode_memory", "pillow", "fastapi", "uvicorn"),
        "settings": {"max_decode_mb": 128, "limit_mb": LIMIT_MB},
        "cases": rows,
        "worst_peak_over_idle_mb": worst,
        "within_limit": worst <= LIMIT_MB,
    }
    print(f"worst peak over idle: {worst} MB (goal <= {LIMIT_MB} MB)")
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
