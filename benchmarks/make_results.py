"""Writes `benchmarks/results/RESULTS.md` from the benchmarks' JSON results.

Every number in the Markdown is read from a JSON file in the results
directory; nothing is typed in by hand. Each section names the command that
reproduces it and its wall time. Known files get a dedicated table; any other
`*.json` (or a known one whose structure has changed) is rendered
generically from its lists and dictionaries of numbers. Missing files are
skipped.

    python -m benchmarks.make_results
    python -m benchmarks.make_results --results-dir /tmp/results --output /tmp/R.md
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from benchmarks import common
from benchmarks.markdown import fmt, header, render_generic, runnable, table

HERE = os.path.dirname(os.path.abspath(__file__))
_PAPER_BITS = (12, 24, 36, 48)

# ---------------------------------------------------------------------------
# Known files.


def _epochs_text(row: dict) -> str:
    """`"P + E"` for E epochs after P of classifier pre-training, else `"E"`."""
    pretrain = row["hparams"].get("pretrain_epochs")
    return f"{pretrain} + {row['epochs']}" if pretrain else f"{row['epochs']}"


def cifar_label(row: dict) -> str:
    """A table row's method, epochs and, for SuBiC, entropy weights."""
    label = f"{row.get('label', row['method'])}, {_epochs_text(row)} epochs"
    for name, symbol in (("gamma", "γ"), ("mu", "μ")):
        if name in row["hparams"]:
            label += f", {symbol} = {row['hparams'][name]:g}"
    return label


def _map_cell(cell: dict | None, key: str = "map") -> str | None:
    """A mean mAP, with `± std (n seeds)` for the strict one over seeds."""
    if cell is None or cell.get(key) is None:
        return None
    if key == "map" and cell.get("map_std") is not None:
        return f"{cell['map']:.4f} ± {cell['map_std']:.4f} (n={len(cell['seeds'])})"
    return f"{cell[key]:.4f}"


def render_cifar10_comparison(comparison: dict) -> list[str]:
    """SuBiC's current recipe against the paper and our baselines, per bit-rate."""
    h = comparison["subic_hparams"]
    lines = [
        f"**SuBiC against the paper and our baselines** (paper protocol; the CNN "
        f"pre-trained {comparison['pretrain_epochs']} epochs as a classifier, then "
        f"{comparison['epochs']} epochs per model; SuBiC γ = {h['gamma']:g}, "
        f"μ = {h['mu']:g}; mean over seeds). Strict is the definition of the "
        "tables below; 21-point is the SuBiC authors' AP, the definition behind "
        "the paper's numbers.",
        "",
    ]
    body = []
    for entry in comparison["bits"]:
        met = entry["met"]
        body.append(
            [
                entry["bits"],
                entry["paper_subic"],
                _map_cell(entry["subic"]),
                _map_cell(entry["subic"], "map_expected"),
                _map_cell(entry["subic"], "map_21point"),
                _map_cell(entry["subic_cq"]),
                _map_cell(entry.get("subic_z")),
                _map_cell(entry["subic16"]),
                _map_cell(entry["dsh"]),
                _map_cell(entry["dlbhc"]),
                met["subic_21point_vs_paper"],
                met["subic_strict_vs_paper"],
                met["subic_vs_our_dsh"],
            ]
        )
    lines += table(
        [
            "bits",
            "SuBiC (paper)",
            "SuBiC (ours, query chosen on validation), strict",
            "expected ties",
            "21-point",
            "class-posterior query, strict",
            "z* query, strict",
            "SuBiC K=16, strict",
            "DSH (ours), strict",
            "DLBHC (ours), strict",
            "≥ paper, 21-point",
            "≥ paper, strict",
            "> our DSH, strict",
        ],
        body,
    )
    return lines


def render_cifar10(data: dict) -> list[str]:
    rows = data["rows"]
    paper = data.get("paper_table2", {})
    bits = sorted({r["bits"] for r in rows} | set(_PAPER_BITS))
    lines = [
        f"mAP: {data.get('map_definition', 'see the benchmark')}. Model selection: "
        f"{data.get('selection_metric', 'see the benchmark')}.",
        "",
    ]
    if data.get("comparison"):
        lines += render_cifar10_comparison(data["comparison"])
    if data.get("training_commands"):
        lines += ["Models trained by:", ""]
        lines += [f"- `{runnable(c)}`" for c in data["training_commands"]] + [""]
    protocols = []
    for row in rows:
        for name in row["test"]:
            if name not in protocols:
                protocols.append(name)
    titles = {
        "paper": "Paper protocol (1,000 queries, 9,000 database)",
        "dsh": "DSH protocol (10,000 queries against the whole test set)",
    }
    configs: dict = {}
    for row in rows:
        key = (
            row["method"],
            json.dumps([row["epochs"], row["hparams"]], sort_keys=True),
        )
        configs.setdefault(key, {})[row["bits"]] = row
    # Rows come in the benchmark's order (`cifar10_retrieval.aggregate`).
    for name in protocols:
        body = []
        if name == "paper":
            for method, values in paper.items():
                body.append([f"{method} (paper)"] + [values.get(str(b)) for b in bits])
        for by_bits in configs.values():
            cells = []
            for b in bits:
                cell = by_bits.get(b, {}).get("test", {}).get(name)
                if cell is None:
                    cells.append(None)
                elif cell.get("map_std") is None:
                    cells.append(cell["map_mean"])
                else:
                    cells.append(f"{cell['map_mean']:.4f} ± {cell['map_std']:.4f}")
            body.append([cifar_label(next(iter(by_bits.values()))), *cells])
        lines += [f"**{titles.get(name, name)}**", ""]
        lines += table(["method", *(f"{b}-bit" for b in bits)], body)
    cost = []
    for (method, _), by_bits in configs.items():
        for b, row in sorted(by_bits.items()):
            cost.append(
                [
                    row.get("label", method),
                    b,
                    _epochs_text(row),
                    row["seeds"],
                    ", ".join(f"{t:.0f}" for t in row["train_seconds"]),
                    row["best_epoch"],
                ]
            )
    definitions = [
        [
            cifar_label(row),
            b,
            row["test"]["paper"]["map_mean"],
            row["test"]["paper"]["map_expected_mean"],
            row["test"]["paper"]["map_21point_mean"],
        ]
        for by_bits in configs.values()
        for b, row in sorted(by_bits.items())
        if row["test"].get("paper", {}).get("map_21point_mean") is not None
    ]
    if definitions:
        lines += [
            "**Other mAP definitions, paper protocol** (strict = the tables above; "
            "expected = exact mean over random orders of equal scores; 21-point = "
            "the SuBiC authors' code, the definition behind the paper's numbers)",
            "",
        ]
        lines += table(
            ["method", "bits", "strict", "expected ties", "21-point"], definitions
        )
    if data.get("pretraining"):
        lines += [
            "**Classifier pre-training of the CNN** (one per seed, shared by "
            "every method; selected by validation accuracy)",
            "",
        ]
        lines += table(
            ["seed", "epochs", "validation accuracy", "training time (s)"],
            [
                [
                    r["seed"],
                    r["epochs"],
                    r["best_validation_accuracy"],
                    f"{r['train_seconds']:.0f}",
                ]
                for r in data["pretraining"]
            ],
        )
    lines += ["**Training time per model**", ""]
    lines += table(
        ["method", "bits", "epochs", "seeds", "training time (s)", "selected epoch"],
        cost,
    )
    if data.get("sweep"):
        sweep = [
            [
                s["bits"],
                s["epochs"],
                *(
                    f"{s['hparams'][k]:.3g}" if k in s["hparams"] else None
                    for k in ("gamma", "mu", "warmup_fraction", "learning_rate")
                ),
                s["validation_map"],
                f"{s['train_seconds']:.0f}",
            ]
            for s in data["sweep"]
        ]
        lines += ["**SuBiC validation sweep (validation mAP; no test data)**", ""]
        lines += table(
            [
                "bits",
                "epochs",
                "γ",
                "μ",
                "warm-up fraction",
                "learning rate",
                "validation mAP",
                "training time (s)",
            ],
            sweep,
        )
    if data.get("figure"):
        lines += [f"Fig. 5: `benchmarks/results/{data['figure']}`.", ""]
    return lines


def render_cross_domain(data: dict) -> list[str]:
    methods = data["methods"]
    datasets = []
    for method in methods.values():
        for name in method["summary"]:
            if name not in datasets:
                datasets.append(name)
    body, total = [], 0.0
    for name, method in methods.items():
        cells = []
        for dataset in datasets:
            cell = method["summary"].get(dataset)
            if cell is None:
                cells.append(None)
            elif cell.get("num_seeds", 1) > 1:
                cells.append(f"{cell['map_mean']:.4f} ± {cell['map_std']:.4f}")
            else:
                cells.append(cell["map_mean"])
        seeds = method.get("per_seed", {}).values()
        validation = [s["validation_map"] for s in seeds if "validation_map" in s]
        wall = sum(s.get("wall_seconds", 0.0) for s in seeds)
        total += wall
        body.append([name, *cells, validation or None, f"{wall:.0f}"])
    lines = []
    for key in ("description", "metric", "protocol"):
        if isinstance(data.get(key), str):
            lines += [f"{key.capitalize()}: {data[key]}", ""]
    lines += table(
        ["method", *(f"{d} mAP" for d in datasets), "validation mAP", "wall time (s)"],
        body,
    )
    lines += [f"Sum of the per-method wall times: {total:,.0f} s.", ""]
    paper = data.get("paper_table3")
    if isinstance(paper, dict) and paper.get("rows"):
        lines += [
            "**Paper's Table 3 (other datasets: VOC2007, Caltech-101, ImageNet)**",
            "",
        ]
        lines += table(
            ["method", *paper["columns"]],
            [[name, *values] for name, values in paper["rows"].items()],
        )
    return lines


def render_search_speed(data: dict) -> list[str]:
    results = data["results"]
    batches = sorted({r["batch"] for r in results})
    grouped: dict = {}
    for r in results:
        key = (
            r.get("data", "random"),
            r.get("num_items"),
            r["bits"],
            r["num_blocks"],
            r["block_size"],
            r["method"],
        )
        grouped.setdefault(key, {})[r["batch"]] = r
    body = []
    for (source, items, bits, m, k, method), by_batch in grouped.items():
        first = next(iter(by_batch.values()))
        mark = " (extrapolated)" if first.get("extrapolated") else ""
        if first.get("kernel"):
            mark += f" [{first['kernel']}]"
        body.append(
            [source, items, bits, m, k, method + mark]
            + [by_batch[b]["qps"] if b in by_batch else None for b in batches]
            + [first.get("recall_at_100"), first.get("bytes_per_item")]
        )
    settings = data.get("settings", {})
    machine = data.get("machine", {})
    flags = ", ".join(machine.get("simd_flags") or []) or "unrecorded"
    lines = [
        f"Queries per second, k = {fmt(settings.get('k'))}, on "
        f"{machine.get('cpu', 'an unrecorded CPU')} (SIMD flags: {flags}) with "
        f"{fmt(machine.get('search_threads', machine.get('faiss_threads')))} "
        f"threads, OMP_WAIT_POLICY {machine.get('omp_wait_policy') or 'unset'} "
        f"(faiss SIMD level {machine.get('faiss_simd_level', 'unrecorded')}). "
        "`native-*`: `SubicIndex` with that native kernel forced; `faiss`, "
        "`faiss-fastscan`: with faiss's scans. `random`: uniform random codes "
        "and ReLU-Gaussian queries; a model's run directory: all 60,000 "
        "CIFAR-10 images encoded by that model, queried with 1,000 test "
        "images. recall@100 is against a float64 brute force with equal "
        "scores ordered by position; scans that cut ties otherwise (faiss's "
        "float32 sums, NumPy's `argpartition`) lose recall on the trained "
        "codes, which tie often.",
        "",
    ]
    lines += table(
        ["data", "items", "bits", "M", "K", "method"]
        + [f"queries/s @ batch {b}" for b in batches]
        + ["recall@100", "bytes/item"],
        body,
    )
    if data.get("targets"):
        lines += table(
            ["target", "ratio (wall)", "ratio (per CPU-second)", "met"],
            [
                [t["target"], t["ratio"], t.get("ratio_per_cpu_second"), t["met"]]
                for t in data["targets"]
            ],
        )
    return lines


def render_omp_policy(data: dict) -> list[str]:
    lines = [
        "`benchmarks/search_speed.py` run twice, with `OMP_WAIT_POLICY` unset "
        "and `PASSIVE`: each native kernel's ratio to faiss's Hamming scan in "
        "both runs, and how far apart they are (the goal: within 20% at "
        f"batches of 1,000; largest gap {data['largest_apart_at_1000']:.0%}). "
        "The native scan uses no OpenMP; faiss's scans do.",
        "",
    ]
    return lines + table(
        ["data", "K", "kernel", "batch", "unset", "PASSIVE", "apart"],
        [
            [
                r["data"],
                r["block_size"],
                r["method"],
                r["batch"],
                r["ratio_unset"],
                r["ratio_passive"],
                f"{r['apart']:.0%}",
            ]
            for r in data["rows"]
        ],
    )


def render_milvus_speed(data: dict) -> list[str]:
    settings = data.get("settings", {})
    lines = [
        f"Uniform random codes of {fmt(settings.get('num_blocks'))} blocks of "
        f"{fmt(settings.get('block_size'))}, ReLU-Gaussian queries, "
        f"k = {fmt(settings.get('k'))}; Milvus Lite in a local file against "
        "SubicIndex in memory, on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}.",
        "",
    ]
    body = []
    for row in data["results"]:
        for name, label in (
            ("milvus_lite", "Milvus Lite"),
            ("subic_index", "SubicIndex"),
        ):
            entry = row[name]
            body.append(
                [
                    row["num_items"],
                    label,
                    entry["insert_items_per_second"],
                    entry["qps_batch_1"],
                    entry["qps_batch"],
                    row["milvus_recall_at_100_vs_subic_index"]
                    if name == "milvus_lite"
                    else None,
                ]
            )
    lines += table(
        [
            "items",
            "backend",
            "inserts/s",
            "queries/s @ batch 1",
            f"queries/s @ batch {fmt(settings.get('batch'))}",
            "recall@100 vs SubicIndex",
        ],
        body,
    )
    return lines


def render_encode_speed(data: dict) -> list[str]:
    results = data["results"]
    batches = sorted({r["batch"] for r in results})
    methods = []
    for r in results:
        if r["method"] not in methods:
            methods.append(r["method"])
    rate = {(r["method"], r["batch"]): r["images_per_second"] for r in results}
    lines = ["Images encoded per second.", ""]
    lines += table(
        ["method", *(f"batch {b}" for b in batches)],
        [[m, *(rate.get((m, b)) for b in batches)] for m in methods],
    )
    if isinstance(data.get("size_bytes"), dict):
        lines += table(
            ["artifact", "size (bytes)"],
            [[k, v] for k, v in data["size_bytes"].items()],
        )
    return lines


def render_export_parity(data: dict) -> list[str]:
    results = data["results"]
    columns = [
        "block_agreement",
        "images_with_all_blocks_equal",
        "mismatched_blocks",
        "max_abs_z_diff",
        "relative_z_error",
    ]
    lines = table(
        ["export", *columns],
        [[name, *(r.get(c) for c in columns)] for name, r in results.items()],
    )
    if isinstance(data.get("retrieval_map"), dict):
        lines += table(
            ["encoder", "retrieval mAP"], list(map(list, data["retrieval_map"].items()))
        )
    if isinstance(data.get("targets"), dict):
        lines += table(["target", "met"], list(map(list, data["targets"].items())))
    return lines


def render_train_overhead(data: dict) -> list[str]:
    best = data["best_images_per_second"]
    seconds = data.get("seconds_per_cifar10_epoch", {})
    lines = [
        f"{data.get('backbone', '')} on {data.get('dataset', '')}, batch "
        f"{fmt(data.get('batch_size'))}, {fmt(data.get('bits'))} bits, measured on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}; "
        f"`subic train` / plain classifier = "
        f"{fmt(data.get('subic_train_over_plain_classifier'))}.",
        "",
    ]
    lines += table(
        ["training", "best images/s", "seconds per CIFAR-10 epoch"],
        [[kind, rate, seconds.get(kind)] for kind, rate in best.items()],
    )
    return lines


def render_train_recipe(data: dict) -> list[str]:
    lines = [
        f"`subic train` with its defaults at {fmt(data.get('bits'))} bits, then "
        f"`subic evaluate --protocol paper`; {data.get('map_definition', '')}; "
        f"measured on {data.get('machine', {}).get('cpu', 'an unrecorded CPU')}.",
        "",
    ]
    rows = []
    for run in data["runs"]:
        test = run["test_map"]
        rows.append(
            [
                run["seed"],
                run["summary"]["query"],
                test["saved"]["map"],
                test["fc0"]["map"],
                test["class_posterior"]["map"],
                run["train_wall_seconds"],
                run["load_average_1min"]["start"],
            ]
        )
    lines += table(
        [
            "seed",
            "query chosen",
            "mAP (chosen query)",
            "mAP z*",
            "mAP class-posterior",
            "training s",
            "load at start",
        ],
        rows,
    )
    lines.append(
        f"Mean mAP {data['mean_test_map']:.4f} ± {data['std_test_map']:.4f} "
        f"over {len(data['runs'])} seed(s); the paper: {fmt(data.get('paper_map'))}."
    )
    return lines


def render_serve_load(data: dict) -> list[str]:
    single = data["in_process"]
    goals = data["goals"]
    lines = [
        f"`subic serve` on {data['items']:,} random {data['bits']}-bit codes "
        f"(M = {data['num_blocks']}, K = {data['block_size']}, k = {data['k']}), "
        "clients on the same machine over loopback (keep-alive HTTP), on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')} "
        f"(SIMD flags: {', '.join(data.get('cpu_flags') or ['none recorded'])}; "
        f"{data.get('machine', {}).get('cpu_count', '?')} cores shared by "
        "server and clients; "
        + (
            f"scanner {data['scanner']}). "
            if data.get("scanner")
            else f"native kernel {data['native_kernel']}). "
            if data.get("native_kernel")
            else "faiss's scan, the native one off or not built). "
        )
        + "`query`: `POST /search/query` with a query vector; `image`: `POST "
        "/search` with a 32x32 PNG, decoded and encoded by the model. In the "
        f"same run, in-process `SubicIndex.search` of one query took "
        f"{fmt(single['p50_ms'])} ms (p50), {fmt(single['p99_ms'])} ms (p99); "
        f"a query request's p50 at one client is "
        f"{fmt(goals['query_p50_over_in_process_p50'])}x that.",
        "",
    ]
    lines += table(
        ["request", "clients", "p50 (ms)", "p99 (ms)", "requests/s", "errors"],
        [
            [
                r["kind"],
                r["clients"],
                r["p50_ms"],
                r["p99_ms"],
                r["requests_per_second"],
                r["errors"],
            ]
            for r in data["load"]
        ],
    )
    return lines


def render_stream_training(data: dict) -> list[str]:
    ratios = data["ratios"]
    lines = [
        f"One SuBiC epoch ({data.get('model', '')}) from PNG files in class "
        "folders, streamed by `datasets.image_folder`, and from in-memory "
        f"arrays, each in its own process, on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')} "
        f"({data.get('machine', {}).get('cpu_count', '?')} cores). Peak RSS "
        f"of 50,000 files over 5,000: {fmt(ratios['rss_50000_over_5000'])}x; "
        "training pictures/s from the 50,000 files over the arrays: "
        f"{fmt(ratios['speed_folder_over_arrays'])}x.",
        "",
    ]
    lines += table(
        [
            "source",
            "backbone",
            "training pictures",
            "pictures/s",
            "peak RSS (MB)",
            "check s",
        ],
        [
            [
                name.split("_")[0] + " " + name.split("_")[1],
                case.get("backbone", "DSH CNN at 32x32"),
                case["num_train"],
                case["images_per_second"],
                round(case["peak_rss_kb"] / 1024),
                case["prepare_seconds"],
            ]
            for name, case in data["cases"].items()
        ],
    )
    return lines


def render_folder_training(data: dict) -> list[str]:
    budget = data["budget"]
    lines = [
        f"`subic train --images` on CIFAR-10's training set written as PNG "
        f"class folders, against `subic train --dataset cifar10`, at "
        f"{budget['pretrain_epochs']} + {budget['epochs']} epochs and "
        f"{budget['bits']} bits; {data.get('map_definition', '')}; measured on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}. Mean "
        f"difference {data['difference']:+.4f}; the largest range between "
        f"seeds of one kind {data['largest_seed_range']:.4f}.",
        "",
    ]
    rows = [
        [kind, run["seed"], run["test_map"], run["query"], run["train_seconds"]]
        for kind, runs in data["runs"].items()
        for run in runs
    ]
    lines += table(["trained from", "seed", "test mAP", "query", "training s"], rows)
    return lines


KNOWN = {
    "cifar10_retrieval.json": ("CIFAR-10 category retrieval (Table 2)", render_cifar10),
    "cross_domain.json": (
        "Cross-domain category retrieval (Table 3)",
        render_cross_domain,
    ),
    "search_speed.json": ("Search speed", render_search_speed),
    "milvus_speed.json": ("Search on Milvus Lite", render_milvus_speed),
    "encode_speed.json": ("Encoding speed", render_encode_speed),
    "export_parity.json": ("Export parity", render_export_parity),
    "train_overhead.json": ("Training overhead", render_train_overhead),
    "train_recipe.json": ("`subic train` defaults", render_train_recipe),
    "serve_load.json": ("Serving under load", render_serve_load),
    "stream_training.json": ("Training from a folder", render_stream_training),
    "folder_training.json": (
        "Folder against arrays: the same mAP",
        render_folder_training,
    ),
    "omp_policy.json": (
        "OpenMP's wait policy and the search ratios",
        render_omp_policy,
    ),
    "serve_load_faiss.json": (
        "Serving under load with faiss's scan (`--scanner faiss`)",
        render_serve_load,
    ),
}


def _cpu(data: dict) -> str:
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


def _summary_cifar10(data: dict) -> tuple[str, str]:
    entries = data["comparison"]["bits"]
    ours = " / ".join(f"{e['subic']['map']:.3f}" for e in entries)
    paper = " / ".join(f"{e['paper_subic']:.3f}" for e in entries)
    bits = "/".join(str(e["bits"]) for e in entries)
    return (
        f"CIFAR-10 retrieval (Table 2), strict mAP at {bits} bits",
        f"{ours} (paper {paper})",
    )


def _summary_train_recipe(data: dict) -> tuple[str, str]:
    return (
        f"`subic train` defaults, {data['bits']} bits, {len(data['runs'])} seeds",
        f"mAP {data['mean_test_map']:.4f} ± {data['std_test_map']:.4f}, "
        f"{data['max_train_wall_seconds'] / 60:.0f} min per training",
    )


def _target_parts(target: dict) -> list[str]:
    """A search target's data, bits, block size and kernel, from its text
    ("random, 64 bits, K=16, native-avx2: >= 1.5x hamming")."""
    return [part.strip() for part in target["target"].split(":")[0].split(",")]


def _summary_search_speed(data: dict) -> tuple[str, str]:
    ratios = {}
    for t in data.get("targets", []):
        source, _, block, kernel = _target_parts(t)
        if source == "random":
            ratios.setdefault(kernel, []).append(f"{block} {t['ratio']:.2g}x")
    figure = "; ".join(
        f"{kernel.removeprefix('native-')}: {', '.join(parts)}"
        for kernel, parts in ratios.items()
    )
    return "exact search against faiss Hamming at equal bits, 1M codes", figure


def search_kernel_table(data: dict) -> list[str]:
    """Each native kernel against Hamming, batches of 1,000 queries."""
    rows = {}
    for t in data.get("targets", []):
        source, bits, block, kernel = _target_parts(t)
        label = "1M random codes" if source == "random" else "CIFAR-10 codes"
        column = f"{label}, {bits}, {block}"
        rows.setdefault(kernel, {})[column] = f"{t['ratio']:.2f}x"
    columns = list(dict.fromkeys(c for by in rows.values() for c in by))
    machine = data.get("machine", {})
    # The flags the kernels ask for (all of them are in the JSON).
    wanted = ("avx2", "avx512bw", "avx512vbmi", "asimd")
    flags = ", ".join(f for f in machine.get("simd_flags") or [] if f in wanted)
    flags = flags or "unrecorded"
    lines = [
        "Exact search, each native kernel forced, as a multiple of faiss's "
        "Hamming scan at equal bits (queries per second, batches of 1,000, "
        f"k = 100, one run of `python -m benchmarks.search_speed` on "
        f"{machine.get('cpu', 'an unrecorded CPU')}, SIMD flags {flags}, "
        f"OpenMP wait policy {machine.get('omp_wait_policy') or 'unset'}):",
        "",
    ]
    return lines + table(
        ["kernel", *columns],
        [[kernel, *(by.get(c) for c in columns)] for kernel, by in rows.items()],
    )


def _summary_serve_load(data: dict) -> tuple[str, str]:
    goals = data["goals"]
    return (
        f"`subic serve`, {data['items']:,} codes",
        f"a query request {goals['query_p50_over_in_process_p50']}x in-process "
        f"search; {goals['image_requests_per_second']} picture requests/s",
    )


def _summary_stream_training(data: dict) -> tuple[str, str]:
    ratios = data["ratios"]
    return (
        "training from 50,000 PNG files",
        f"peak memory {ratios['rss_50000_over_5000']}x that of 5,000; "
        f"{ratios['speed_folder_over_arrays']}x the speed of arrays",
    )


def _summary_folder_training(data: dict) -> tuple[str, str]:
    means = data["mean_test_map"]
    return (
        "`--images` folder against `--dataset cifar10`, same budget",
        f"strict mAP {means['folder']:.4f} against {means['arrays']:.4f} "
        f"(seeds range up to {data['largest_seed_range']:.4f})",
    )


# The README's headline results, in order: file, and what to say of it.
_SUMMARIES = {
    "cifar10_retrieval.json": _summary_cifar10,
    "train_recipe.json": _summary_train_recipe,
    "search_speed.json": _summary_search_speed,
    "serve_load.json": _summary_serve_load,
    "stream_training.json": _summary_stream_training,
    "folder_training.json": _summary_folder_training,
}


def _summary_rows(results: dict) -> list[list]:
    """One row per headline result: what, the figure, the CPU."""
    return [
        [*summary(results[name]), _cpu(results[name])]
        for name, summary in _SUMMARIES.items()
        if name in results
    ]


def render_summary(results: dict) -> str:
    """The README's compact results table; RESULTS.md has every table."""
    lines = [
        "Every figure is read from `benchmarks/results/*.json` by `python -m "
        "benchmarks.make_results --readme README.md`; "
        "[benchmarks/results/RESULTS.md](benchmarks/results/RESULTS.md) has "
        "every table, the command that produced it and its settings.",
        "",
    ]
    lines += table(["result", "figure", "CPU (2 cores)"], _summary_rows(results))
    if "search_speed.json" in results:
        lines += ["", *search_kernel_table(results["search_speed.json"])]
    return "\n".join(lines).rstrip() + "\n"


def render(name: str, data) -> list[str]:
    title, renderer = KNOWN.get(name, (name[: -len(".json")], None))
    meta = data if isinstance(data, dict) else {}
    lines = header(title, name, meta)
    if renderer is not None:
        try:
            return lines + renderer(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            lines += [
                f"(The file's structure is not the expected one ({error!r}); "
                "shown generically.)",
                "",
            ]
    return lines + render_generic(data)


def _read_results(results_dir: str) -> tuple[dict, list[str]]:
    """The JSON results of `results_dir` by file name (known files first),
    and the lines to show for unreadable ones."""
    present = {
        os.path.basename(p): p
        for p in sorted(glob.glob(os.path.join(results_dir, "*.json")))
    }
    order = [n for n in KNOWN if n in present]
    order += [n for n in present if n not in KNOWN]
    results, problems = {}, []
    for name in order:
        try:
            with open(present[name]) as handle:
                results[name] = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            problems += [f"### {name}", "", f"(unreadable: {error})", ""]
    return results, problems


def make_results(results_dir: str) -> str:
    """The Markdown of every JSON result in `results_dir`, known files first."""
    results, problems = _read_results(results_dir)
    lines = [
        "## Results",
        "",
        "Generated by `python -m benchmarks.make_results` from "
        "`benchmarks/results/*.json`; every number below is read from those "
        "files. Timings are on 2-core machines, often shared, and are "
        "indicative.",
        "",
    ]
    if not results and not problems:
        lines += ["No benchmark results found.", ""]
    for name, data in results.items():
        lines += render(name, data)
    lines += problems
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--output", default=None, help="default: RESULTS.md in --results-dir"
    )
    parser.add_argument(
        "--readme",
        default=None,
        help="also replace the text between the README's results markers",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.results_dir):
        parser.error(f"--results-dir not found: {args.results_dir!r}")
    output = args.output or os.path.join(args.results_dir, "RESULTS.md")
    text = make_results(args.results_dir)
    with common.atomic_output(output, suffix=".md") as tmp:
        with open(tmp, "w") as handle:
            handle.write(text)
    print(f"wrote {output}")
    if args.readme:
        update_readme(args.readme, render_summary(_read_results(args.results_dir)[0]))
        print(f"updated {args.readme}")
    return text


README_START = "<!-- results: generated by benchmarks/make_results.py -->"
README_END = "<!-- end of results -->"


def update_readme(path: str, text: str) -> None:
    """Replaces the README's section between the results markers with `text`."""

    with open(path, encoding="utf-8") as handle:
        readme = handle.read()
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(
            f"{path} has no results markers: add {README_START!r} and {README_END!r}"
        )
    body = text.strip()
    readme = readme[: start + len(README_START)] + "\n\n" + body + "\n\n" + readme[end:]
    with common.atomic_output(path, suffix=".md") as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(readme)


if __name__ == "__main__":
    main()
