"""Markdown of the paper-protocol results (CIFAR-10, cross-domain), for
`benchmarks.make_results`.
"""

from __future__ import annotations

import json

from benchmarks.markdown import runnable, table
from subic_keras.config import TrainConfig

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
    configs: dict = {}
    for row in rows:
        key = (
            row["method"],
            json.dumps([row["epochs"], row["hparams"]], sort_keys=True),
        )
        configs.setdefault(key, {})[row["bits"]] = row
    # Rows come in the benchmark's order (`cifar10_retrieval.aggregate`).
    lines += _cifar10_protocols(rows, configs, bits, data.get("paper_table2", {}))
    lines += _cifar10_definitions(configs)
    lines += _cifar10_pretraining(data.get("pretraining"))
    lines += ["**Training time per model**", ""]
    lines += table(
        ["method", "bits", "epochs", "seeds", "training time (s)", "selected epoch"],
        [
            [
                row.get("label", method),
                b,
                _epochs_text(row),
                row["seeds"],
                ", ".join(f"{t:.0f}" for t in row["train_seconds"]),
                row["best_epoch"],
            ]
            for (method, _), by_bits in configs.items()
            for b, row in sorted(by_bits.items())
        ],
    )
    lines += _cifar10_sweep(data.get("sweep"))
    if data.get("figure"):
        lines += [f"Fig. 5: `benchmarks/results/{data['figure']}`.", ""]
    return lines


_CIFAR10_PROTOCOLS = {
    "paper": "Paper protocol (1,000 queries, 9,000 database)",
    "dsh": "DSH protocol (10,000 queries against the whole test set)",
}


def _cifar10_protocols(rows: list, configs: dict, bits: list, paper: dict) -> list:
    """A table of mAP by bits per test protocol, the paper's rows first."""
    protocols: list = []
    for row in rows:
        protocols += [name for name in row["test"] if name not in protocols]
    lines = []
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
        lines += [f"**{_CIFAR10_PROTOCOLS.get(name, name)}**", ""]
        lines += table(["method", *(f"{b}-bit" for b in bits)], body)
    return lines


def _cifar10_definitions(configs: dict) -> list:
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
    if not definitions:
        return []
    return [
        "**Other mAP definitions, paper protocol** (strict = the tables above; "
        "expected = exact mean over random orders of equal scores; 21-point = "
        "the SuBiC authors' code, the definition behind the paper's numbers)",
        "",
        *table(["method", "bits", "strict", "expected ties", "21-point"], definitions),
    ]


def _cifar10_pretraining(pretraining: list | None) -> list:
    if not pretraining:
        return []
    return [
        "**Classifier pre-training of the CNN** (one per seed, shared by "
        "every method; selected by validation accuracy)",
        "",
        *table(
            ["seed", "epochs", "validation accuracy", "training time (s)"],
            [
                [
                    r["seed"],
                    r["epochs"],
                    r["best_validation_accuracy"],
                    f"{r['train_seconds']:.0f}",
                ]
                for r in pretraining
            ],
        ),
    ]


def _cifar10_sweep(sweep: list | None) -> list:
    if not sweep:
        return []
    rows = [
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
        for s in sweep
    ]
    headers = ["bits", "epochs", "γ", "μ", "warm-up fraction", "learning rate",
               "validation mAP", "training time (s)"]  # fmt: skip
    return [
        "**SuBiC validation sweep (validation mAP; no test data)**",
        "",
        *table(headers, rows),
    ]


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


UNSEEN_ROWS = {
    "subic_z": "SuBiC, query z (Eq. 10)",
    "subic_class_posterior": "SuBiC, class-posterior query",
    "one_hot_classifier": "one-hot classifier (log2 of the classes: 3 or 4 bits)",
    "dsh": "DSH (same budget and pre-trained backbone, Hamming ranking)",
    "pq": "PQ of the backbone's features",
    "opq": "OPQ of the backbone's features",
}


def render_unseen_classes(data: dict) -> list[str]:
    """Mean mAP of every row on both protocols, by code length."""
    settings = data["settings"]
    means = data["mean_map"]
    columns = sorted(means, key=lambda key: (int(key.split()[1]), key))

    def epochs(key: str) -> str:  # None: subic train's default
        value = settings[key]
        return f"{value}" if value is not None else f"{getattr(TrainConfig, key)}"

    lines = [
        f"Budget: {settings['budget']} (pre-training epochs "
        f"{epochs('pretrain_epochs')}, SuBiC epochs {epochs('epochs')}, "
        f"blocks of K = {settings.get('block_size', 64)}); "
        f"unseen: classes held out of training, splits {settings['splits']} "
        "averaged (`protocols.held_out_classes`); paper: a model of every class "
        "with the same budget. mAP, pessimistic ties (they count against the "
        "one-hot classifier most: every item of a predicted class ties).",
        "",
    ]
    names = (f"{key.split()[0]}, {key.split()[1]} bits" for key in columns)
    header = ["method", *names]

    def rows(values: dict) -> list[list]:
        return [
            [UNSEEN_ROWS.get(row, row), *(values[key].get(row) for key in columns)]
            for row in UNSEEN_ROWS
        ]

    lines += table(header, rows(means))
    expected = data.get("mean_map_expected")
    if expected:
        lines += [
            "",
            "The same runs, mAP as the exact mean over the orders of tied items "
            '(`evaluation`\'s `ties="expected"`):',
            "",
            *table(header, rows(expected)),
        ]
    return lines
