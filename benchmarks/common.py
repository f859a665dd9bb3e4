"""What the benchmarks share: run metadata, the result cache, atomic output.

Every benchmark records the machine and library versions it ran on with its
results (kernel rankings and speed ratios depend on the CPU), caches one
JSON file per trained configuration in a `ResultCache`, and writes its
reports atomically: a temporary file beside the destination, then a rename,
so no report is ever half-written.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Iterator


def cpu_model() -> str:
    """The CPU's model name: kernel rankings and speed ratios depend on it.

    With its family and model numbers where the name alone is vague (a
    virtual machine's "AMD EPYC" covers Zen 1 to Zen 5).
    """
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's fields are enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def log(message: str) -> None:
    """`message` on stderr with the time: progress of a long run."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def simd_flags() -> list[str]:
    """The CPU's AVX2 / AVX-512 (x86) or Advanced SIMD (ARM) flags: which
    kernels it can run."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return sorted(
                        f
                        for f in line.split()[2:]
                        if f.startswith(("avx2", "avx512", "asimd"))
                    )
    except OSError:
        pass
    return []


def machine() -> dict:
    """The machine a measurement ran on, and how busy it was."""
    return {
        "cpu": cpu_model(),
        "simd_flags": simd_flags(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),
    }


def versions(*modules: str) -> dict:
    """Python's version and those of `modules` that are installed.

    Defaults to the libraries every benchmark depends on.
    """
    found = {"python": platform.python_version()}
    for name in modules or ("numpy", "faiss", "tensorflow", "keras"):
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "?")
        except ImportError:
            continue
    return found


def run_metadata(module: str, *packages: str) -> dict:
    """The command, versions, machine and time of a run, for its JSON."""
    return {
        "command": command(module),
        "versions": versions(*packages),
        "machine": machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_threads(threads: list[threading.Thread]) -> float:
    """Starts `threads` together and waits for them all; the wall seconds."""
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def command(module: str) -> str:
    """The command line that ran `python -m benchmarks.<module>`."""
    return " ".join(["python", "-m", f"benchmarks.{module}", *sys.argv[1:]])


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yields a temporary path beside `path`, renamed onto it on success.

    `suffix` keeps the extension writers choose a format from (`.keras`,
    `.weights.h5`, `.png`). On failure the temporary file is removed.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=directory
    )
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` atomically."""
    with atomic_output(path) as tmp, open(tmp, "w") as handle:
        handle.write(text)


def write_json(path: str, obj) -> None:
    """Writes `obj` as indented JSON to `path` atomically."""
    write_text(path, json.dumps(obj, indent=2, default=_plain) + "\n")


def _plain(value):
    """NumPy scalars and arrays as the Python values JSON can hold."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def add_data_dir(parser, layout: str) -> None:
    """`--data-dir`, defaulting to `$SUBIC_DATA_DIR`; `layout` says what it holds."""
    default = os.environ.get("SUBIC_DATA_DIR")
    parser.add_argument(
        "--data-dir",
        default=default,
        required=default is None,
        help=f"the data directory: {layout} (default: $SUBIC_DATA_DIR"
        + (f", now {default})" if default else ", unset)"),
    )


def read_json(path: str):
    with open(path) as handle:
        return json.load(handle)


def settings_key(prefix: str, settings: dict) -> str:
    """`prefix` and a short digest of `settings`: a cache key that changes
    whenever a setting that affects the result does."""
    digest = hashlib.sha256(
        json.dumps(settings, sort_keys=True, default=str).encode()
    ).hexdigest()[:10]
    return f"{prefix}-{digest}"


class ResultCache:
    """One JSON file per computed result, in `directory`, keyed by its settings.

    Reruns read what is cached instead of recomputing it; an unreadable file
    is skipped with a message, never trusted.
    """

    def __init__(self, directory: str):
        self.directory = directory

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key + ".json")

    def get(self, key: str) -> dict | None:
        path = self.path(key)
        if not os.path.isfile(path):
            return None
        try:
            return read_json(path)
        except (OSError, json.JSONDecodeError):
            print(f"skipping unreadable cache entry {path}", file=sys.stderr)
            return None

    def put(self, key: str, entry: dict) -> None:
        write_json(self.path(key), entry)

    def compute(self, key: str, compute, label: str | None = None) -> dict:
        """The entry at `key`, or `compute()`'s result, stored there first.

        The entry records `wall_seconds` (of the run that computed it);
        the returned copy adds `cached`, whether it was read.
        """
        label = label or key
        entry = self.get(key)
        if entry is not None:
            log(f"{label}: cached ({key})")
            return {**entry, "cached": True}
        log(f"{label}: running")
        start = time.perf_counter()
        entry = compute()
        entry["wall_seconds"] = time.perf_counter() - start
        self.put(key, entry)
        log(f"{label}: done in {entry['wall_seconds']:.0f} s")
        return {**entry, "cached": False}

    def entries(self) -> list[dict]:
        """Every readable entry, in file-name order."""
        found = []
        for path in sorted(glob.glob(os.path.join(self.directory, "*.json"))):
            entry = self.get(os.path.basename(path)[: -len(".json")])
            if entry is not None:
                found.append(entry)
        return found
