"""Markdown building blocks of the results pages: cells, tables, headers.

`benchmarks.make_results` renders each known benchmark's JSON with these;
`render_generic` shows any other JSON from its lists and dictionaries of
numbers, so a new benchmark appears in the results before it has a table.
"""

from __future__ import annotations

import numbers
import re

# Top-level keys that describe a run rather than its results.
_META = {"command", "timestamp", "versions", "machine", "settings", "quick"}
_WALL_KEYS = (
    "elapsed_seconds",
    "wall_seconds",
    "wall_time_seconds",
    "total_seconds",
    "duration_seconds",
    "total_train_seconds",
)
# ---------------------------------------------------------------------------
# Formatting helpers.


def fmt(value) -> str:
    """A number as text: integers as they are, floats to about 4 digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(value)
    if isinstance(value, numbers.Real):
        if value != value:  # NaN
            return "nan"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        if value == 0 or abs(value) >= 1e-3:
            return f"{value:.4f}"
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)) and all(_is_scalar(v) for v in value):
        return ", ".join(fmt(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _is_scalar(value) -> bool:
    return value is None or isinstance(value, (str, numbers.Number))


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return [*lines, ""]


def command_text(data: dict) -> str:
    command = data.get("command")
    if command is None:
        return "not recorded"
    if isinstance(command, (list, tuple)):
        command = " ".join(str(part) for part in command)
    return runnable(command)


def runnable(command: str) -> str:
    """A recorded command as a user runs it today.

    The scripts became modules of the `benchmarks` package (`python -m
    benchmarks.<name>`), and the data directory the run read is shown as
    `DIR`: the user's own copy of the official files (or `$SUBIC_DATA_DIR`).
    """
    command = re.sub(
        r"^(?:python )?benchmarks/(\w+)\.py", r"python -m benchmarks.\1", command
    )
    return re.sub(r"--data-dir \S+", "--data-dir DIR", command)


def wall_seconds(data: dict):
    for key in _WALL_KEYS:
        value = data.get(key)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return value
    return None


_CACHED_MODELS = "benchmarks/cache/models/"


def header(title: str, name: str, data: dict) -> list[str]:
    # `total_compute_seconds`: what a report read from a result cache cost to
    # compute, where its `wall_seconds` is only the last (cached) run's.
    seconds = data.get("total_compute_seconds", wall_seconds(data))
    wall = "not recorded" if seconds is None else f"{seconds:,.1f} s"
    if "total_compute_seconds" in data:
        # A report aggregated from cached models: its own command is quick, and
        # the time is the models' (their commands are listed in the section).
        reproduce = (
            f"Reproduce the report with `{command_text(data)}` from the cached "
            f"models, whose training and evaluation took {wall} in all."
        )
    else:
        reproduce = f"Reproduce with `{command_text(data)}` (wall time {wall})."
    if _CACHED_MODELS in command_text(data):
        # Commands that take a trained model should name one a reader can make.
        reproduce += (
            " Its model is one that `python -m benchmarks.cifar10_retrieval` "
            f"trains and keeps under `{_CACHED_MODELS}` (see the CIFAR-10 "
            "section for its command)."
        )
    lines = [
        f"### {title}",
        "",
        f"Source: `benchmarks/results/{name}`. {reproduce}",
    ]
    machine = data.get("machine")
    if isinstance(machine, dict) and machine:
        cpus = machine.get("cpu_count", machine.get("cpus"))
        where = machine.get("platform", "")
        cpu = f" of an {machine['cpu']}" if machine.get("cpu") else ""
        lines.append(f"Measured on {cpus} CPU cores{cpu} ({where}).")
    if data.get("timestamp"):
        lines.append(f"Run at {data['timestamp']}.")
    return [*lines, ""]


# ---------------------------------------------------------------------------
# Any other structure.


def _flatten(value, prefix: str = "", depth: int = 0) -> dict:
    """Scalars of nested dicts, keyed by their `/`-joined path."""
    if _is_scalar(value) or (
        isinstance(value, list) and all(_is_scalar(v) for v in value)
    ):
        return {prefix: value}
    if isinstance(value, dict) and depth < 4:
        out = {}
        for key, inner in value.items():
            out.update(
                _flatten(inner, f"{prefix}/{key}" if prefix else str(key), depth + 1)
            )
        return out
    return {}


def _records_table(records: list[dict]) -> list[str]:
    flat = [_flatten(r) for r in records]
    columns = []
    for row in flat:
        for key in row:
            if key not in columns:
                columns.append(key)
    return table(columns, [[row.get(c) for c in columns] for row in flat])


def render_generic(data) -> list[str]:
    """Tables from lists of records and dictionaries of numbers."""
    if isinstance(data, list):
        data = {"results": data}
    lines = []
    for key, value in data.items():
        if key in _META or key in _WALL_KEYS:
            continue
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) for v in value)
        ):
            lines += [f"**{key}**", "", *_records_table(value)]
        elif isinstance(value, dict) and value:
            inner = list(value.values())
            if all(isinstance(v, dict) for v in inner):
                records = [{"": name, **_flatten(v)} for name, v in value.items()]
                lines += [f"**{key}**", "", *_records_table(records)]
            else:
                flat = _flatten(value)
                if flat:
                    lines += [f"**{key}**", ""]
                    lines += table(["key", "value"], list(map(list, flat.items())))
        elif _is_scalar(value) and not isinstance(value, str):
            lines += [f"{key}: {fmt(value)}", ""]
    settings = data.get("settings")
    if isinstance(settings, dict) and settings:
        lines += ["**settings**", ""]
        lines += table(["key", "value"], list(map(list, _flatten(settings).items())))
    return lines or ["(no tabular content)", ""]


def cpu_of(data: dict) -> str:
    """The CPU a result was measured on, with its SIMD level where recorded."""
    machine = data.get("machine", {})
    cpu = machine.get("cpu", "unrecorded CPU")
    flags = set(machine.get("simd_flags") or data.get("cpu_flags") or [])
    if "avx512vbmi" in flags:
        return f"{cpu}, AVX-512 VBMI"
    if "avx512f" in flags:
        return f"{cpu}, AVX-512"
    if "avx2" in flags:
        return f"{cpu}, AVX2, no AVX-512"
    if machine.get("faiss_simd_level"):
        return f"{cpu} (faiss {machine['faiss_simd_level']})"
    return cpu


def target_parts(target: dict) -> list[str]:
    """A search target's data, bits, block size and kernel, from its text
    ("random, 64 bits, K=16, native-avx2: >= 1.5x hamming")."""
    return [part.strip() for part in target["target"].split(":")[0].split(",")]
