"""What the benchmarks share: the machine they ran on and atomic JSON output."""

from __future__ import annotations

import json
import os
import platform
import sys


def cpu_model() -> str:
    """The CPU's model name: kernel rankings and speed ratios depend on it."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """The machine a measurement ran on."""
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def command(module: str) -> str:
    """The command line that ran `python -m benchmarks.<module>`."""
    return " ".join(["python", "-m", f"benchmarks.{module}", *sys.argv[1:]])


def write_json(path: str, obj) -> None:
    """Writes `obj` to `path` atomically (a temporary file, then a rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(obj, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
