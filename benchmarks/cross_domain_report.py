"""The cross-domain benchmark's report: figures, Markdown, the paper's table.

`benchmarks.cross_domain` computes the results; this module turns them into
`cross_domain.json`, `cross_domain.md` and the Fig. 3 / Fig. 4 analogues.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from benchmarks import common

DATASETS = ("fashion_mnist", "cifar10")
DATASET_TITLES = {"fashion_mnist": "Fashion-MNIST test", "cifar10": "CIFAR-10 test"}
METHOD_TITLES = {
    "uncompressed_l2": "Uncompressed features, L2 (32,768 bits)",
    "uncompressed_cosine": "Uncompressed features, cosine (32,768 bits)",
    "pq": "PQ",
    "opq": "OPQ (CKM)",
    "lsq": "LSQ",
    "dsh": "DSH-64",
    "subic_2layer": "SuBiC 2-layer",
    "subic_3layer": "SuBiC 3-layer",
}
# Paper Table 3: VGG-M-128 features trained on ImageNet, 64 bits.
PAPER_TABLE3 = {
    "columns": ["VOC2007", "Caltech-101", "ImageNet"],
    "rows": {
        "pq": [0.4965, 0.3089, 0.1650],
        "opq": [0.4995, 0.3179, 0.1737],
        "lsq": [0.4993, 0.3372, 0.1882],
        "dsh": [0.4914, 0.2852, 0.1665],
        "subic_2layer": [0.5600, 0.3923, 0.2543],
        "subic_3layer": [0.5588, 0.4033, 0.2810],
    },
}
# The exploration behind FULL's SuBiC settings: validation mAP only (CIFAR-10
# validation queries against the validation database, or where a note says
# so a development split of Fashion-MNIST *training* images; never a test
# set). The first runs used 18,000 training / 2,000 validation features (the
# first 20,000 training images), before all 50,000 were extracted.
TUNING_NOTES = [
    {
        "setup": "2-layer, 18k train / 2k val, Adam 1e-3, γ = μ = 1, 20 epochs",
        "finding": "val mAP is best at the first epoch after the warm-up and "
        "then falls while training accuracy -> 0.99 (warm-up 3 epochs: 0.685 at "
        "epoch 4, 0.610 at epoch 20)",
    },
    {
        "setup": "2-layer, 18k/2k, Adam 1e-3, warm-up 1 epoch",
        "finding": "0.635 at epoch 2: a longer warm-up is better",
    },
    {
        "setup": "2-layer, 18k/2k, Adam 1e-4, warm-up 2, 12 epochs",
        "finding": "0.602 at epoch 12, still rising slowly: 1e-3 kept",
    },
    {
        "setup": "2-layer, 18k/2k, Adam 1e-3, warm-up 3, input dropout 0.5",
        "finding": "0.686 at epoch 4 (0.685 without): dropout not kept",
    },
    {
        "setup": "3-layer (1024 -> 128 ReLU trained), 18k/2k, Adam 1e-3, warm-up 3",
        "finding": "0.766 at epoch 4, same fall afterwards",
    },
    {
        "setup": "full data (45k/5k), Adam 1e-3, warm-up 5, up to 12 epochs",
        "finding": "2-layer γ/μ chosen from the sweep's validation mAP (see "
        "gamma_selection): 5; epochs chosen per run on validation mAP",
    },
    {
        "setup": "3-layer, full data, γ/μ in {1, 5} (μ = 1)",
        "finding": "validation mAP 0.730 (γ/μ = 1) and 0.753 (γ/μ = 5): 5 kept",
    },
    {
        "setup": "since result version 2: both variants trained by the "
        "library's recipe (Adam ×0.1 after 75% of the steps; epoch chosen on "
        "500 random validation queries, query z*), γ/μ re-chosen on validation",
        "finding": "2-layer: the sweep's best is γ/μ = 0.1 (see "
        "gamma_selection; 5 was best before); 3-layer: validation mAP 0.794 "
        "(γ/μ = 0.1) against 0.748 (5): 0.1 kept for both",
    },
    {
        "setup": "2-layer, full data, γ = μ = 1, trained on class-refined "
        "pseudo-classes (k-means inside each CIFAR-10 class: 10 or 100 "
        "sub-classes per class, so 100 or 1,000 training classes); scored on "
        "a Fashion-MNIST development split (the first 10,000 training images, "
        "paper protocol)",
        "finding": "Fashion-MNIST dev mAP 0.3858 with the 10 true classes, "
        "0.3515 with 100 pseudo-classes and 0.2763 with 1,000 (OPQ 0.3870 on "
        "the same split); CIFAR-10 validation mAP 0.664, 0.551 and 0.425: "
        "finer pseudo-classes hurt transfer, not kept",
    },
]


PACKAGES = ("numpy", "faiss", "tensorflow", "keras", "matplotlib")


def report(args, settings, data, methods: dict, sweep: dict | None) -> dict:
    """The JSON report of a run, without its run metadata and figures."""
    bits, m, k = settings.bits, settings.num_blocks, settings.block_size
    result = {
        "benchmark": "cross_domain",
        "description": (
            f"Cross-domain category retrieval at {bits} bits (M={m}, K={k}): "
            "codes trained on CIFAR-10 training features of a frozen ImageNet "
            "MobileNet v1 (1,024-d), tested on Fashion-MNIST test (cross-domain) "
            "and CIFAR-10 test (in-domain)."
        ),
        "metric": (
            "mAP over the full ranking of the database, non-interpolated, "
            "pessimistic ties (relevant items ranked after irrelevant ones of "
            "equal score), relevant = same class"
        ),
        "protocol": (
            "paper: 100 queries per class (1,000), the rest (9,000) as database"
            if settings.test_queries_per_class is None
            else f"random: {settings.test_queries_per_class} queries per class"
        ),
        "quick": args.quick,
        "seeds": args.seeds,
        "settings": dataclasses.asdict(settings),
        "data": {
            "features": "MobileNet v1 1.0 224 (ImageNet), LiteRT, 1,024-d",
            "train": "CIFAR-10 training set minus the validation split",
            "num_train": len(data.x_train),
            "num_validation": len(data.x_val),
            "test_sizes": {n: len(labels) for n, (_, labels) in data.tests.items()},
            "fingerprint": data.fingerprint,
        },
        "methods": methods,
        "sweep": sweep,
        "paper_table3": PAPER_TABLE3,
        "tuning_notes": TUNING_NOTES,
        "total_compute_seconds": total_compute_seconds(methods, sweep),
    }
    if sweep is not None:
        by_gamma = {
            f"{p['gamma_over_mu']:g}": p["validation_map"] for p in sweep["points"]
        }
        result["gamma_selection"] = {
            "rule": "2-layer SuBiC's γ/μ (μ = 1) is the sweep value with the "
            "best CIFAR-10 validation mAP",
            "validation_map_by_gamma_over_mu": by_gamma,
            "best": float(max(by_gamma, key=by_gamma.get)),
            "used_for_subic_2layer": settings.subic2_gamma / settings.subic2_mu,
        }
    return result


def summarize(per_seed: dict, test: str = "test") -> dict:
    """Mean and standard deviation over seeds of each test mAP in `test`."""
    summary = {}
    for dataset in DATASETS:
        values = [r[test][dataset]["map"] for r in per_seed.values()]
        summary[dataset] = {
            "map_mean": float(np.mean(values)),
            "map_std": float(np.std(values)),
            "num_seeds": len(values),
        }
    return summary


def total_compute_seconds(methods: dict, sweep: dict | None) -> float:
    """What the report costs from an empty cache, feature extraction aside.

    Cached results keep the wall time of the run that computed them, so this
    stays the same however much of the cache a run found. A sweep point that
    shares the table's 2-layer model is counted once, with the table.
    """
    total = sum(
        result.get("wall_seconds", 0.0)
        for method in methods.values()
        for result in method["per_seed"].values()
    )
    if sweep is not None:
        total += sum(
            point.get("wall_seconds", 0.0)
            for point in sweep["points"]
            if not point["shares_table_model"]
        )
    return total


def write_figures(sweep: dict, settings, output_dir: Path, references: dict) -> dict:
    """Fig. 3 and Fig. 4 as PNGs; `references` are the table's methods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    points = sweep["points"]
    colors = plt.cm.viridis(np.linspace(0.0, 0.9, len(points)))
    entries = settings.fig3_entries

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for row, dataset in enumerate(DATASETS):
        left, right = axes[row]
        for point, color in zip(points, colors):
            stats = point["code_statistics"][dataset]
            label = f"γ/μ = {point['gamma_over_mu']:g}"
            values = np.asarray(stats["sorted_first_block"][:entries])
            left.semilogy(
                np.arange(1, len(values) + 1),
                np.maximum(values, 1e-12),
                "o-",
                ms=3,
                color=color,
                label=label,
            )
            support = np.asarray(stats["first_block_support_sorted"], float)
            used = support[support > 0]  # sorted decreasing: the used bins
            right.semilogy(
                np.arange(1, len(used) + 1),
                used / max(support.sum(), 1.0),
                color=color,
                label=f"{label} ({stats['first_block_bins_used']} bins used)",
            )
        uniform = 1.0 / settings.block_size
        right.axhline(uniform, color="grey", ls="--", lw=1, label="uniform (ideal)")
        left.set_title(f"{DATASET_TITLES[dataset]}: sorted mean of block $\\tilde b_1$")
        left.set_xlabel(
            f"rank within the block (first {entries} of {settings.block_size})"
        )
        left.set_ylabel("mean sorted probability (log)")
        right.set_title(f"{DATASET_TITLES[dataset]}: sorted support histogram of $b_1$")
        right.set_xlabel(f"bin rank (of {settings.block_size})")
        right.set_ylabel("fraction of codes (log; unused bins not drawn)")
        left.legend(fontsize=8)
        right.legend(fontsize=8)
        left.grid(alpha=0.3)
        right.grid(alpha=0.3)
    fig.suptitle(
        "Fig. 3 analogue: effect of γ/μ (μ = 1) on the first block, "
        "2-layer SuBiC on CIFAR-10 MobileNet features"
    )
    fig3 = output_dir / "fig3_gamma_mu.png"
    with common.atomic_output(fig3, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.8), constrained_layout=True)
    ratios = [p["gamma_over_mu"] for p in points]
    for dataset, marker, color in zip(DATASETS, "os", ("C0", "C1")):
        maps = [p["test"][dataset]["map"] for p in points]
        ax.semilogx(
            ratios, maps, marker + "-", color=color, label=DATASET_TITLES[dataset]
        )
        for name, style in (("pq", ":"), ("opq", "-.")):
            if name in references:
                ax.axhline(
                    references[name]["summary"][dataset]["map_mean"],
                    color=color,
                    ls=style,
                    lw=1.2,
                    label=f"{METHOD_TITLES[name]}, {DATASET_TITLES[dataset]}",
                )
    ax.semilogx(
        ratios,
        [p["validation_map"] for p in points],
        "^--",
        color="grey",
        label="CIFAR-10 validation (from training set)",
    )
    ax.set_xticks(ratios)
    ax.set_xticklabels([f"{r:g}" for r in ratios])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("γ/μ (μ = 1)")
    ax.set_ylabel("mAP (full ranking, pessimistic ties)")
    ax.set_title(f"Fig. 4 analogue: mAP vs γ/μ, 2-layer SuBiC, {settings.bits} bits")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig4 = output_dir / "fig4_map_vs_gamma_mu.png"
    with common.atomic_output(fig4, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return {"fig3": fig3.name, "fig4": fig4.name}


def markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [
        "# Cross-domain category retrieval, "
        f"{settings['num_blocks'] * int(math.log2(settings['block_size']))} bits"
        + (" (QUICK smoke run: not a result)" if report["quick"] else ""),
        "",
        "Generated by `benchmarks.cross_domain` from `cross_domain.json`; "
        f"command: `{report['command']}`.",
        "",
        report["description"],
        "",
        f"- Metric: {report['metric']}.",
        f"- Protocol on each test set: {report['protocol']}.",
        f"- Training: {report['data']['num_train']} CIFAR-10 training features; "
        f"{report['data']['num_validation']} held out for validation (every "
        "model-selection choice).",
        f"- Seeds: {report['seeds']} (mean ± std over seeds where > 1).",
        "- SuBiC rows search with the paper's query `z*` (Eq. 9); the row "
        "below each scores the same model with the class-posterior query.",
        "",
        "| method | Fashion-MNIST mAP | CIFAR-10 mAP | CIFAR-10 validation mAP | "
        "wall time (s) |",
        "|---|---|---|---|---|",
    ]
    for name, entry in report["methods"].items():
        cells = []
        for dataset in DATASETS:
            s = entry["summary"][dataset]
            cell = f"{s['map_mean']:.4f}"
            if s["num_seeds"] > 1:
                cell += f" ± {s['map_std']:.4f}"
            cells.append(cell)
        runs = list(entry["per_seed"].values())
        wall = np.mean([r.get("wall_seconds", 0.0) for r in runs])
        val = [r["validation_map"] for r in runs if r.get("validation_map")]
        val_cell = f"{np.mean(val):.4f}" if val else "—"
        lines.append(
            f"| {METHOD_TITLES[name]} | {cells[0]} | {cells[1]} | {val_cell} | "
            f"{wall:.0f} |"
        )
        if "test_class_query" in runs[0]:
            s = summarize(entry["per_seed"], "test_class_query")
            val = [r["validation_map_class_query"] for r in runs]
            lines.append(
                f"| {METHOD_TITLES[name]}, class-posterior query `W₁ s*` (same "
                f"model) | {s[DATASETS[0]]['map_mean']:.4f} | "
                f"{s[DATASETS[1]]['map_mean']:.4f} | {np.mean(val):.4f} | — |"
            )
    lines += [
        "",
        "Chosen hyper-parameters (validation-selected where stated):",
        "",
    ]
    for name, entry in report["methods"].items():
        first = next(iter(entry["per_seed"].values()))
        params = first.get("hyperparameters")
        if params:
            shown = {k: v for k, v in params.items() if k != "selection"}
            lines.append(f"- {METHOD_TITLES[name]}: `{json.dumps(shown)}`")
    paper = report["paper_table3"]
    lines += [
        "",
        "## The paper's Table 3 (a different setting)",
        "",
        "VGG-M-128 features trained on ImageNet; SuBiC trained on ImageNet; "
        "tested on VOC2007, Caltech-101 and ImageNet-val. Not comparable number "
        "for number with the table above (MobileNet features, CIFAR-10 "
        "training, Fashion-MNIST / CIFAR-10 test); compare the ordering.",
        "",
        "| method | " + " | ".join(paper["columns"]) + " |",
        "|---|" + "---|" * len(paper["columns"]),
    ]
    for name, values in paper["rows"].items():
        lines.append(
            f"| {METHOD_TITLES[name]} | "
            + " | ".join(f"{v:.4f}" for v in values)
            + " |"
        )
    lines += _sweep_lines(report)
    lines += [
        "",
        f"Total wall time of this run: {report['wall_seconds']:.0f} s "
        "(cached results count 0; per-method wall times are those of the run "
        "that computed them, on a 2-core machine often shared with other jobs).",
    ]
    if "total_compute_seconds" in report:
        lines.append(
            f"Computing every result from an empty cache took "
            f"{report['total_compute_seconds']:.0f} s, feature extraction aside."
        )
    lines.append("")
    return "\n".join(lines)


def _sweep_lines(report: dict) -> list[str]:
    """The γ/μ sweep's table, the choice it made, and its figures."""
    if not report.get("sweep"):
        return []
    lines = [
        "",
        f"## γ/μ sweep (2-layer SuBiC, {report['sweep']['fixed']}, seed "
        f"{report['sweep']['seed']})",
        "",
        "| γ/μ | validation mAP | Fashion-MNIST mAP | CIFAR-10 mAP | "
        "bins used in b_1 (Fashion / CIFAR) | mean code entropy Σ_m E(b̃_m) "
        "in bits, at most M·log2 K (Fashion / CIFAR) |",
        "|---|---|---|---|---|---|",
    ]
    for p in report["sweep"]["points"]:
        stats = p["code_statistics"]
        lines.append(
            f"| {p['gamma_over_mu']:g} | {p['validation_map']:.4f} | "
            f"{p['test']['fashion_mnist']['map']:.4f} | "
            f"{p['test']['cifar10']['map']:.4f} | "
            f"{stats['fashion_mnist']['first_block_bins_used']} / "
            f"{stats['cifar10']['first_block_bins_used']} | "
            f"{stats['fashion_mnist']['mean_block_entropy_bits']:.3f} / "
            f"{stats['cifar10']['mean_block_entropy_bits']:.3f} |"
        )
    selection = report.get("gamma_selection")
    if selection:
        lines += [
            "",
            f"γ/μ of the table's SuBiC 2-layer: "
            f"{selection['used_for_subic_2layer']:g}; best validation mAP in "
            f"the sweep: {selection['best']:g} (rule: {selection['rule']}).",
        ]
    lines += [
        "",
        f"Figures: `{report['figures']['fig3']}` (Fig. 3), "
        f"`{report['figures']['fig4']}` (Fig. 4).",
    ]
    return lines


def write_outputs(report: dict, output_dir: Path) -> None:
    """`cross_domain.json` and `cross_domain.md` in `output_dir`, atomically."""
    common.write_json(output_dir / "cross_domain.json", report)
    common.write_text(output_dir / "cross_domain.md", markdown(report))
