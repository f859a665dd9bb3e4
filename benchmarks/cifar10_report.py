"""The CIFAR-10 retrieval report: aggregation over seeds and Markdown.

`build_result` turns the cached entries of `benchmarks.cifar10_retrieval`
into the JSON of `benchmarks/results/cifar10_retrieval.json`, and `markdown`
renders it.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np

from benchmarks import common
from benchmarks.render_paper import cifar_label, render_cifar10_comparison

SUBIC_BLOCK_SIZES = {"subic": 64, "subic16": 16}
# SuBiC models are also scored with the class-posterior query
# (`Subic.query(kind="class_posterior")`): rows of method `<method>_cq`,
# the same trained models as `<method>`.
CLASS_QUERY = "class_posterior"
CLASS_QUERY_SUFFIX = "_cq"
# Rows `<method>_vq`: each model scored with the query chosen on validation,
# as `recipe.train_subic` saves it with the model.
CHOSEN_QUERY_SUFFIX = "_vq"
LABELS = {
    "subic_vq": "SuBiC K=64, query chosen on validation (ours)",
    "subic": "SuBiC K=64 (ours)",
    "subic_cq": "SuBiC K=64, class-posterior query (ours)",
    "subic16_vq": "SuBiC K=16, query chosen on validation (ours)",
    "subic16": "SuBiC K=16 (ours)",
    "subic16_cq": "SuBiC K=16, class-posterior query (ours)",
    "dsh": "DSH (ours)",
    "dlbhc": "DLBHC (ours)",
}
PAPER_TABLE2 = {
    "CNNH+": {12: 0.5425, 24: 0.5604, 36: 0.5640, 48: 0.5574},
    "DLBHC": {12: 0.5503, 24: 0.5803, 36: 0.5778, 48: 0.5885},
    "DNNH": {12: 0.5708, 24: 0.5875, 36: 0.5899, 48: 0.5904},
    "DSH": {12: 0.6157, 24: 0.6512, 36: 0.6607, 48: 0.6755},
    "SuBiC": {12: 0.6349, 24: 0.6719, 36: 0.6823, 48: 0.6863},
}

MAP_DEFINITION = (
    "mean over queries of the non-interpolated average precision over the full "
    "ranking; ties between equal scores pessimistic (relevant items last)"
)
SELECTION_METRIC = (
    "validation mAP: 10% of the training images held out (stratified, seed 0); "
    "a tenth of them (seeded) query the rest; the epoch with the highest mAP "
    "is kept"
)


# ---------------------------------------------------------------------------
# Aggregation and Markdown.


def _config_id(entry: dict) -> str:
    """Entries (or aggregated rows) with equal ids differ only in bits or seed."""
    return json.dumps(
        [entry["epochs"], entry["hparams"], entry["data"], entry["batch_size"]],
        sort_keys=True,
    )


def aggregate(entries: list[dict]) -> list[dict]:
    """Groups table entries by (method, configuration, bits): mean ± std."""
    groups: dict = {}
    for entry in entries:
        if entry.get("kind") != "table":
            continue
        key = (entry["method"], _config_id(entry), entry["bits"])
        groups.setdefault(key, []).append(entry)
        if "test_class_query" in entry:
            derived = dict(entry, test=entry["test_class_query"])
            derived["method"] = entry["method"] + CLASS_QUERY_SUFFIX
            derived["selection"] = dict(
                entry["selection"],
                best_validation_map=entry["selection"]["validation_map_class_query"],
            )
            key = (derived["method"], _config_id(entry), entry["bits"])
            groups.setdefault(key, []).append(derived)
            # What the recipe ships: the query with the higher validation mAP.
            chosen = dict(entry if _chooses_fc0(entry) else derived)
            chosen["method"] = entry["method"] + CHOSEN_QUERY_SUFFIX
            key = (chosen["method"], _config_id(entry), entry["bits"])
            groups.setdefault(key, []).append(chosen)
    rows = []
    for (method, _, bits), members in sorted(
        groups.items(), key=lambda item: (_rank(item[0][0]), item[0])
    ):
        members.sort(key=lambda e: e["seed"])
        first = members[0]
        row = {
            "method": method,
            "label": LABELS.get(method, method),
            "bits": bits,
            "epochs": first["epochs"],
            "hparams": first["hparams"],
            "batch_size": first["batch_size"],
            "data": first["data"],
            "seeds": [e["seed"] for e in members],
            "train_seconds": [e["train_seconds"] for e in members],
            "best_epoch": [e["selection"]["best_epoch"] for e in members],
            "validation_map": [e["selection"]["best_validation_map"] for e in members],
            "keys": [e["key"] for e in members],
            "diagnostics": [e.get("diagnostics", {}) for e in members],
        }
        if "num_blocks" in first:
            row["num_blocks"], row["block_size"] = (
                first["num_blocks"],
                first["block_size"],
            )
        row["test"] = {}
        for name in first["test"]:
            values = [e["test"][name]["map"] for e in members]
            row["test"][name] = {
                "map_mean": float(np.mean(values)),
                "map_std": float(np.std(values)) if len(values) > 1 else None,
                "map_per_seed": values,
                "precision@10_mean": _mean_of(members, name, "precision@10"),
                "map_expected_mean": _mean_of(members, name, "map_expected"),
                "map_21point_mean": _mean_of(members, name, "map_21point"),
                "protocol": first["test"][name]["protocol"],
                "protocol_args": first["test"][name].get("protocol_args", {}),
                "num_queries": first["test"][name]["num_queries"],
                "num_database": first["test"][name]["num_database"],
                "ties": first["test"][name]["ties"],
            }
        rows.append(row)
    return rows


def _chooses_fc0(entry: dict) -> bool:
    """The recipe's choice (`recipe.train_subic`): `z*` unless the
    class-posterior query has the strictly higher validation mAP."""
    selection = entry["selection"]
    return selection["best_validation_map"] >= selection["validation_map_class_query"]


def _rank(method: str) -> int:
    """Row order of the tables: `LABELS`' order, unknown methods last."""
    return list(LABELS).index(method) if method in LABELS else len(LABELS)


def _mean_of(members, protocol, metric):
    values = [e["test"][protocol].get(metric) for e in members]
    if any(v is None for v in values):
        return None
    return float(np.mean(values))


def _hparams_text(row: dict) -> str:
    h = row["hparams"]
    parts = [f"Adam lr {h['learning_rate']:g}"]
    if "gamma" in h:
        parts.insert(
            0,
            f"γ={h['gamma']:g}, μ={h['mu']:g}, "
            f"warm-up {h['warmup_fraction'] * row['epochs']:g} ep",
        )
    if "alpha" in h:
        parts.insert(0, f"α={h['alpha']:g}, m={h['margin']}")
    if h.get("pretrain_epochs"):
        parts.append(f"CNN pre-trained as a classifier for {h['pretrain_epochs']} ep")
    return ", ".join(parts)


def _accuracy_text(row: dict) -> str:
    values = []
    for diagnostics in row.get("diagnostics", []):
        # "accuracy_binary" from Subic.code_statistics; "test_accuracy_binary"
        # in entries cached before it existed.
        value = next(
            (
                diagnostics[key]
                for key in ("accuracy_binary", "test_accuracy_binary", "test_accuracy")
                if key in diagnostics
            ),
            None,
        )
        if value is not None:
            values.append(f"{value:.4f}")
    return ", ".join(values) or "—"


def _format_map(cell: dict | None) -> str:
    if cell is None:
        return "—"
    if cell["map_std"] is None:
        return f"{cell['map_mean']:.4f}"
    seeds = len(cell["map_per_seed"])
    return f"{cell['map_mean']:.4f} ± {cell['map_std']:.4f} (n={seeds})"


def markdown(result: dict) -> str:
    rows = result["rows"]
    bits = sorted({row["bits"] for row in rows} | set(result["paper_bits"]))
    configs: dict = {}
    for row in rows:
        configs.setdefault((row["method"], _config_id(row)), []).append(row)
    order = sorted(configs, key=lambda c: (_rank(c[0]), c[1]))
    by_config = [sorted(configs[c], key=lambda r: r["bits"]) for c in order]
    lines = [
        "# CIFAR-10 category retrieval (Table 2)",
        "",
        f"Generated by `{result['command']}` from {result['num_entries']} cached "
        f"models ({result['timestamp']}).",
        "",
        f"mAP: {MAP_DEFINITION}. Model selection: {SELECTION_METRIC}. "
        "The test set is never used for selection.",
        "",
    ]
    if result.get("comparison"):
        lines += render_cifar10_comparison(result["comparison"])
    lines += _protocol_tables(rows, by_config, bits)
    lines += _definitions_table(by_config)
    lines += _cost_table(by_config)
    lines += _sweep_table(result.get("sweep"))
    lines += _pretraining_table(result.get("pretraining"))
    lines += _budget_lines(rows)
    lines += [
        "",
        "Same DSH CNN, standardisation, augmentation (flip + shift), batch size "
        "and Adam schedule for every method of ours; SuBiC is searched "
        "asymmetrically (`SubicIndex`), DSH and DLBHC by Hamming distance. "
        f"Machine: {result['machine']['cpu_count']} CPU cores "
        f"({result['machine']['platform']}), shared with other jobs, so times "
        "are indicative.",
        "",
    ]
    return "\n".join(lines)


_PROTOCOLS = {
    "paper": "Paper protocol: test queries drawn per class (seed 0), the "
    "rest of the test set as database",
    "dsh": "DSH protocol: every test image queries the whole test set, itself included",
}


def _protocol_tables(rows: list, by_config: list, bits: list) -> list[str]:
    """One table of mAP by bits per test protocol, the paper's beside ours."""
    protocols: list = []
    for row in rows:
        protocols += [name for name in row["test"] if name not in protocols]
    header = "| method | " + " | ".join(f"{b}-bit" for b in bits) + " |"
    lines = []
    for name in protocols:
        sample = next(r["test"][name] for r in rows if name in r["test"])
        args = sample["protocol_args"]
        lines += [
            f"## {_PROTOCOLS.get(name, name)}",
            "",
            f"{sample['num_queries']:,} queries, {sample['num_database']:,} database "
            f"items (`evaluation.protocol_split({sample['protocol']!r}"
            + "".join(f", {k}={v!r}" for k, v in args.items())
            + ")`).",
            "",
            header,
            "|---|" + "---|" * len(bits),
        ]
        if name == "paper":
            for method, values in PAPER_TABLE2.items():
                cells = [f"{values[b]:.4f}" if b in values else "—" for b in bits]
                lines.append(f"| {method} (paper) | " + " | ".join(cells) + " |")
        for members in by_config:
            at = {r["bits"]: r for r in members}
            cells = [
                _format_map(at[b]["test"].get(name)) if b in at else "—" for b in bits
            ]
            lines.append(f"| {cifar_label(members[0])} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _definitions_table(by_config: list) -> list[str]:
    """The paper protocol's mAP under the three definitions, where recorded."""
    definitions = [
        row
        for members in by_config
        for row in members
        if row["test"].get("paper", {}).get("map_21point_mean") is not None
    ]
    if not definitions:
        return []
    lines = [
        "## The same rankings under other mAP definitions (paper protocol)",
        "",
        "Strict: the tables above. Expected ties: the exact mean over random "
        "orders of equal scores. 21-point: the SuBiC authors' code "
        "(interpolated precision at recall 0, 0.05, ..., 1; equal scores in "
        "database order), the definition behind the paper's numbers.",
        "",
        "| method | bits | strict | expected ties | 21-point (authors' code) |",
        "|---|---|---|---|---|",
    ]
    for row in definitions:
        cell = row["test"]["paper"]
        lines.append(
            f"| {cifar_label(row)} | {row['bits']} | {cell['map_mean']:.4f} | "
            f"{cell['map_expected_mean']:.4f} | {cell['map_21point_mean']:.4f} |"
        )
    return [*lines, ""]


def _cost_table(by_config: list) -> list[str]:
    lines = [
        "## Training cost and settings",
        "",
        "| method | bits | epochs | seeds | training time per model (s) | "
        "best epoch (validation) | validation mAP | test accuracy from the codes | "
        "hyper-parameters |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in (row for members in by_config for row in members):
        seconds = ", ".join(f"{s:.0f}" for s in row["train_seconds"])
        lines.append(
            f"| {LABELS.get(row['method'], row['method'])} | {row['bits']} | "
            f"{row['epochs']} | {', '.join(map(str, row['seeds']))} | {seconds} | "
            f"{', '.join(map(str, row['best_epoch']))} | "
            f"{', '.join(f'{v:.4f}' for v in row['validation_map'])} | "
            f"{_accuracy_text(row)} | {_hparams_text(row)}; "
            f"{row.get('hparams_source', '')} |"
        )
    return [*lines, ""]


def _sweep_table(sweep: list | None) -> list[str]:
    if not sweep:
        return []
    lines = [
        "## Validation sweep (SuBiC K=64)",
        "",
        "Validation mAP only (the test set is not evaluated). The best "
        "setting is used by the SuBiC models trained after the sweep (see "
        "each model's hyper-parameter source above).",
        "",
        "| bits | epochs | γ | μ | warm-up (fraction) | learning rate | "
        "validation mAP | best epoch | training time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sweep:
        h = s["hparams"]
        lines.append(
            f"| {s['bits']} | {s['epochs']} | {h['gamma']:g} | {h['mu']:g} | "
            f"{h['warmup_fraction']:.3g} | {h['learning_rate']:g} | "
            f"{s['validation_map']:.4f} | {s['best_epoch']} | "
            f"{s['train_seconds']:.0f} |"
        )
    return [*lines, ""]


def _pretraining_table(pretraining: list | None) -> list[str]:
    if not pretraining:
        return []
    lines = [
        "Classifier pre-training of the CNN (`--pretrain-epochs`; shared by "
        "every method of a seed, selected by validation accuracy):",
        "",
        "| seed | epochs | best epoch | validation accuracy | time (s) |",
        "|---|---|---|---|---|",
    ]
    for record in pretraining:
        lines.append(
            f"| {record['seed']} | {record['epochs']} | {record['best_epoch']} "
            f"| {record['best_validation_accuracy']:.4f} | "
            f"{record['train_seconds']:.0f} |"
        )
    return [*lines, ""]


def _budget_lines(rows: list) -> list[str]:
    """Each training budget in steps, beside DSH's own recipe."""
    budgets = sorted(
        {
            (
                r["hparams"].get("pretrain_epochs", 0),
                r["epochs"],
                r["data"]["num_fit"],
                r["batch_size"],
            )
            for r in rows
        }
    )
    lines = []
    for pretrain, epochs, num_fit, batch in budgets:
        steps = math.ceil(num_fit / batch) * (pretrain + epochs)
        stages = f"{pretrain} (classifier) + {epochs}" if pretrain else f"{epochs}"
        lines.append(
            f"Budget: {stages} epochs of {num_fit:,} images = {steps:,} steps of "
            f"{batch}; DSH's CIFAR-10 recipe (also the paper's base CNN) is "
            "70,000 steps of 200 images (about 280 epochs of 50,000)."
        )
    return lines


def hparams_source(row: dict, sweep_rows: list[dict]) -> str:
    if row["method"].split("_")[0] not in SUBIC_BLOCK_SIZES:
        return "the method's published settings, our shared Adam schedule"
    pretrain = row["hparams"].get("pretrain_epochs", 0)
    ranked = [
        s for s in sweep_rows if s["hparams"].get("pretrain_epochs", 0) == pretrain
    ]
    for rank, s in enumerate(ranked, 1):
        if s["hparams"] == row["hparams"]:
            place = "best" if rank == 1 else f"rank {rank} of {len(ranked)}"
            return (
                f"{place} in the validation sweep ({s['bits']} bits, "
                f"{s['epochs']} epochs, validation mAP {s['validation_map']:.4f})"
            )
    return (
        "default recipe (γ = μ = 1, warm-up over the first third), not "
        "re-validated by a sweep"
    )


def _budget(row: dict) -> tuple[int, int]:
    """`(pre-training epochs, epochs)` of a row or entry."""
    return row["hparams"].get("pretrain_epochs", 0), row["epochs"]


def headline_rows(rows: list[dict], sweep_rows: list[dict]) -> list[dict]:
    """The rows of SuBiC's current recipe, one per bit-rate.

    The SuBiC (K=64) configuration with the largest training budget; among
    several at that budget, the best setting of the validation sweep run
    with the same pre-training, else the one covering the most bit-rates.
    Never chosen by test results.
    """
    subic = [r for r in rows if r["method"] == "subic"]
    if not subic:
        return []
    budget = max(_budget(r) for r in subic)
    configs: dict = {}
    for row in subic:
        if _budget(row) == budget:
            configs.setdefault(_config_id(row), []).append(row)
    swept = [
        s["hparams"]
        for s in sweep_rows
        if s["hparams"].get("pretrain_epochs", 0) == budget[0]
    ]
    for members in configs.values():
        if swept and members[0]["hparams"] == swept[0]:
            return sorted(members, key=lambda r: r["bits"])
    members = max(
        configs.values(), key=lambda m: (len(m), sum(len(r["seeds"]) for r in m))
    )
    return sorted(members, key=lambda r: r["bits"])


def comparison(rows: list[dict], sweep_rows: list[dict]) -> dict | None:
    """SuBiC's current recipe against the paper and our baselines.

    Paper protocol, mean over seeds. Baselines are the rows of ours with the
    same training budget. The paper's numbers come from the authors' code,
    whose AP is 21-point interpolated; they are compared with ours
    under that definition as well as under the strict one of the tables.
    """
    headline = headline_rows(rows, sweep_rows)
    if not headline:
        return None
    budget = _budget(headline[0])
    hparams = headline[0]["hparams"]

    def same_recipe(row: dict) -> bool:
        if _budget(row) != budget or row["data"] != headline[0]["data"]:
            return False
        # SuBiC rows (K=16, the class-posterior query) share the chosen γ, μ.
        return row["method"] in ("dsh", "dlbhc") or row["hparams"] == hparams

    others = {
        (r["method"], r["bits"]): r
        for r in rows
        if r["method"] != "subic" and same_recipe(r)
    }

    def cell(row):
        test = row["test"].get("paper") if row else None
        if test is None:
            return None
        return {
            "map": test["map_mean"],
            "map_std": test["map_std"],
            "seeds": row["seeds"],
            "map_expected": test["map_expected_mean"],
            "map_21point": test["map_21point_mean"],
        }

    per_bits = []
    for row in headline:
        paper = PAPER_TABLE2["SuBiC"].get(row["bits"])
        # Ours is what the recipe ships: each model with the query chosen on
        # validation (rows `subic_vq`); entries older than that choice have
        # only the paper's query.
        chosen = others.get(("subic" + CHOSEN_QUERY_SUFFIX, row["bits"]))
        ours = cell(chosen) or cell(row)
        entry = {
            "bits": row["bits"],
            "paper_subic": paper,
            "paper_dsh": PAPER_TABLE2["DSH"].get(row["bits"]),
            "subic": ours,
            "subic_z": cell(row),
            "query": "chosen on validation" if chosen else "fc0",
        }
        for method in ("subic_cq", "subic16", "dsh", "dlbhc"):
            entry[method] = cell(others.get((method, row["bits"])))
        dsh = entry["dsh"]
        entry["met"] = {
            "subic_strict_vs_paper": None if paper is None else ours["map"] >= paper,
            "subic_21point_vs_paper": (
                None
                if paper is None or ours["map_21point"] is None
                else ours["map_21point"] >= paper
            ),
            "subic_vs_our_dsh": None if dsh is None else ours["map"] > dsh["map"],
        }
        per_bits.append(entry)
    return {
        "pretrain_epochs": budget[0],
        "epochs": budget[1],
        "subic_hparams": headline[0]["hparams"],
        "rule": "SuBiC K=64 with the largest training budget and, at that "
        "budget, the validation sweep's best setting; baselines with the same "
        "budget; paper protocol, mean over seeds",
        "bits": per_bits,
    }


def build_result(entries: list[dict], command: str) -> dict:
    table = [e for e in entries if e.get("kind") == "table"]
    sweep_rows = [
        {
            "bits": e["bits"],
            "epochs": e["epochs"],
            "hparams": e["hparams"],
            "validation_map": e["selection"]["best_validation_map"],
            "best_epoch": e["selection"]["best_epoch"],
            "train_seconds": e["train_seconds"],
        }
        for e in entries
        if e.get("kind") == "sweep"
    ]
    sweep_rows.sort(key=lambda s: -s["validation_map"])
    rows = aggregate(entries)
    for row in rows:
        row["hparams_source"] = hparams_source(row, sweep_rows)
    return {
        "command": command,
        # The runs that trained the cached models (`command` may only have
        # aggregated them).
        "training_commands": sorted({e["command"] for e in entries if "command" in e}),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": common.versions(),
        "machine": common.machine(),
        "map_definition": MAP_DEFINITION,
        "selection_metric": SELECTION_METRIC,
        "num_entries": len(table),
        "paper_bits": [12, 24, 36, 48],
        "paper_table2": {
            m: {str(b): v for b, v in d.items()} for m, d in PAPER_TABLE2.items()
        },
        "rows": rows,
        "comparison": comparison(rows, sweep_rows),
        "sweep": sweep_rows,
        "pretraining": sorted(
            (
                {
                    name: e[name]
                    for name in (
                        "key",
                        "seed",
                        "epochs",
                        "best_epoch",
                        "best_validation_accuracy",
                        "train_seconds",
                    )
                }
                for e in entries
                if e.get("kind") == "pretrain"
            ),
            key=lambda r: (r["epochs"], r["seed"]),
        ),
        "total_train_seconds": round(sum(e["train_seconds"] for e in entries), 1),
        # What the report costs from an empty cache: training and evaluation of
        # every cached model, summed over the runs that made them.
        "total_compute_seconds": round(
            sum(e["train_seconds"] + e.get("eval_seconds", 0.0) for e in entries), 1
        ),
    }


# ---------------------------------------------------------------------------
# Fig. 5.
