"""Tests of `python -m benchmarks.cifar10_retrieval`: its `--quick` run end to end,
and its cache, aggregation and Markdown on hand-made entries."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("cifar10_retrieval")


report = importlib.import_module("benchmarks.cifar10_report")
cifar_models = importlib.import_module("benchmarks.cifar10_models")
common = importlib.import_module("benchmarks.common")


def _fake_entry(bench, method, bits, seed, paper_map, dsh_map, epochs=3):
    hparams = bench.hparams_for(method, bench.DEFAULT_HPARAMS["subic"])
    key = cifar_models.entry_key(
        "table", method, bits, seed, epochs, hparams, bench.FULL
    )
    test = {}
    for name, value in (("paper", paper_map), ("dsh", dsh_map)):
        test[name] = {
            "map": value,
            "precision@10": value + 0.1,
            "protocol": name,
            "protocol_args": {},
            "num_queries": 1000 if name == "paper" else 10000,
            "num_database": 9000 if name == "paper" else 10000,
            "ties": "pessimistic",
        }
    return {
        "key": key,
        "kind": "table",
        "method": method,
        "bits": bits,
        "seed": seed,
        "epochs": epochs,
        "hparams": hparams,
        "batch_size": 200,
        "data": {"num_fit": 45000, "num_validation": 5000, "num_test": 10000},
        "selection": {"best_epoch": 2, "best_validation_map": 0.3},
        "train_seconds": 100.0 + seed,
        "eval_seconds": 5.0,
        "test": test,
    }


def test_aggregate_means_and_stds_over_seeds(bench):
    entries = [
        _fake_entry(bench, "subic", 48, 0, 0.40, 0.45),
        _fake_entry(bench, "subic", 48, 1, 0.50, 0.55),
        _fake_entry(bench, "dsh", 12, 0, 0.30, 0.35),
        {"kind": "sweep", "method": "subic", "bits": 48},  # not a table row
    ]
    rows = {(r["method"], r["bits"]): r for r in report.aggregate(entries)}
    assert set(rows) == {("subic", 48), ("dsh", 12)}
    subic = rows[("subic", 48)]["test"]["paper"]
    assert subic["map_mean"] == pytest.approx(0.45)
    assert subic["map_std"] == pytest.approx(np.std([0.40, 0.50]))
    assert subic["map_per_seed"] == [0.40, 0.50]
    assert rows[("subic", 48)]["seeds"] == [0, 1]
    assert rows[("dsh", 12)]["test"]["dsh"]["map_std"] is None

    result = {
        "rows": report.aggregate(entries),
        "paper_bits": [12, 24, 36, 48],
        "command": "python benchmarks/cifar10_retrieval.py",
        "num_entries": 3,
        "timestamp": "now",
        "machine": {"cpu_count": 2, "platform": "test"},
        "sweep": [],
    }
    text = report.markdown(result)
    assert "| SuBiC (paper) | 0.6349 | 0.6719 | 0.6823 | 0.6863 |" in text
    assert "0.4500 ± 0.0500 (n=2)" in text
    assert "| DSH (ours), 3 epochs | 0.3000 | — | — | — |" in text
    assert "| SuBiC K=64 (ours), 3 epochs, γ = 1, μ = 1 | —" in text
    assert "pessimistic" in text


def _budget_entry(bench, method, bits, seed, paper_map, gamma=None, pretrain=20):
    entry = _fake_entry(bench, method, bits, seed, paper_map, paper_map)
    entry["hparams"]["pretrain_epochs"] = pretrain
    if gamma is not None:
        entry["hparams"].update(gamma=gamma, mu=gamma)
    for test in entry["test"].values():
        test["map_expected"] = test["map"] + 0.05
        test["map_21point"] = test["map"] + 0.1
    return entry


def test_comparison_takes_the_largest_budget_and_the_sweeps_choice(bench):
    entries = [
        # An older, smaller budget: never the headline, whatever its mAP.
        _fake_entry(bench, "subic", 48, 0, 0.90, 0.90),
        _fake_entry(bench, "dsh", 48, 0, 0.95, 0.95),
        # Two SuBiC settings at the largest budget; the sweep prefers 0.1.
        _budget_entry(bench, "subic", 12, 0, 0.70, gamma=0.3),
        _budget_entry(bench, "subic", 48, 0, 0.80, gamma=0.3),
        _budget_entry(bench, "subic", 12, 0, 0.60, gamma=0.1),
        _budget_entry(bench, "subic", 48, 0, 0.70, gamma=0.1),
        _budget_entry(bench, "subic", 48, 1, 0.72, gamma=0.1),
        _budget_entry(bench, "subic16", 48, 0, 0.66, gamma=0.3),
        _budget_entry(bench, "dsh", 12, 0, 0.65),
        _budget_entry(bench, "dsh", 48, 0, 0.60),
    ]
    rows = report.aggregate(entries)
    sweep = [
        {"hparams": dict(entries[4]["hparams"]), "validation_map": 0.5},
        {"hparams": dict(entries[2]["hparams"]), "validation_map": 0.4},
    ]
    headline = report.headline_rows(rows, sweep)
    assert [(r["bits"], r["hparams"]["gamma"]) for r in headline] == [
        (12, 0.1),
        (48, 0.1),
    ]
    result = report.comparison(rows, sweep)
    assert (result["pretrain_epochs"], result["epochs"]) == (20, 3)
    low, high = result["bits"]
    assert low["bits"] == 12 and low["paper_subic"] == 0.6349
    assert low["subic"]["map"] == pytest.approx(0.60)
    assert low["subic"]["map_21point"] == pytest.approx(0.70)
    assert low["dsh"]["map"] == pytest.approx(0.65)
    # Strict 0.60 < 0.6349, 21-point 0.70 >= 0.6349, and below our DSH.
    assert low["met"] == {
        "subic_strict_vs_paper": False,
        "subic_21point_vs_paper": True,
        "subic_vs_our_dsh": False,
    }
    assert high["subic"]["map"] == pytest.approx(0.71)
    assert high["subic"]["seeds"] == [0, 1]
    assert high["dsh"]["map"] == pytest.approx(0.60)  # same budget only
    assert high["subic16"] is None  # trained with the other γ
    assert high["met"]["subic_vs_our_dsh"] is True
    # Without a sweep at that budget: the setting covering more bit-rates
    # (both cover two here; then the one with more seeds).
    assert [r["hparams"]["gamma"] for r in report.headline_rows(rows, [])] == [
        0.1,
        0.1,
    ]

    result = {
        "rows": rows,
        "comparison": result,
        "paper_bits": [12, 24, 36, 48],
        "command": "python benchmarks/cifar10_retrieval.py",
        "num_entries": len(entries),
        "timestamp": "now",
        "machine": {"cpu_count": 2, "platform": "test"},
        "sweep": [],
    }
    text = report.markdown(result)
    assert "| 48 | 0.6863 | 0.7100 ± 0.0100 (n=2) | 0.7600 | 0.8100 |" in text


def test_entry_key_depends_on_every_setting(bench):
    hparams = dict(bench.DEFAULT_HPARAMS["subic"])
    base = cifar_models.entry_key("table", "subic", 48, 0, 15, hparams, bench.FULL)
    assert base == cifar_models.entry_key(
        "table", "subic", 48, 0, 15, dict(hparams), bench.FULL
    )
    others = {
        cifar_models.entry_key("table", "subic", 48, 1, 15, hparams, bench.FULL),
        cifar_models.entry_key("table", "subic", 48, 0, 16, hparams, bench.FULL),
        cifar_models.entry_key("table", "subic", 12, 0, 15, hparams, bench.FULL),
        cifar_models.entry_key(
            "table", "subic", 48, 0, 15, {**hparams, "gamma": 2}, bench.FULL
        ),
        cifar_models.entry_key("table", "subic", 48, 0, 15, hparams, bench.QUICK),
        cifar_models.entry_key("sweep", "subic", 48, 0, 15, hparams, bench.FULL),
    }
    assert base not in others and len(others) == 6


def test_run_entry_reads_the_cache_without_training(bench, tmp_path):
    entry = _fake_entry(bench, "dlbhc", 24, 0, 0.2, 0.25, epochs=15)
    common.write_json(str(tmp_path / (entry["key"] + ".json")), entry)
    got = bench.run_entry(
        "table",
        "dlbhc",
        24,
        0,
        15,
        entry["hparams"],
        data=None,  # would fail if it trained
        scale=bench.FULL,
        cache_dir=str(tmp_path),
        models_dir=str(tmp_path / "models"),
        command="test",
        verbose=False,
    )
    assert got == entry
    assert bench.load_entries(str(tmp_path)) == [entry]


def test_code_shapes_and_bad_arguments(bench):
    assert bench.code_shape("subic", 48) == (8, 64)
    assert bench.code_shape("subic16", 12) == (3, 16)
    with pytest.raises(ValueError, match="multiple of 6"):
        bench.code_shape("subic", 16)
    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", "subic,pq"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--bits", "16", "--methods", "subic"])


# A quick run trains on 600 pictures for an epoch: the recipe says it learned
# little, as it should.
QUICK_LEARNS_LITTLE = pytest.mark.filterwarnings(
    "ignore::subic_keras.trainers.recipe.LearnedLittleWarning"
)


def run_quick(run_benchmark, tmp_path, shared_data_dir, *extra) -> str:
    """Runs the script with --quick into `tmp_path`; returns what it printed."""
    arguments = ["--quick", *extra]
    for flag, path in (
        ("--data-dir", shared_data_dir),
        ("--output-dir", tmp_path / "out"),
        ("--cache-dir", tmp_path / "cache"),
        ("--models-dir", tmp_path / "models"),
    ):
        arguments += [flag, path]
    return run_benchmark("cifar10_retrieval", *arguments)


@pytest.mark.slow
@QUICK_LEARNS_LITTLE
def test_quick_run_end_to_end(run_benchmark, tmp_path, shared_data_dir):
    out, cache, models = tmp_path / "out", tmp_path / "cache", tmp_path / "models"
    # One code length (the quick default trains 12 and 24 bits; the figure,
    # which needs two, is drawn in the test below).
    run_quick(run_benchmark, tmp_path, shared_data_dir, "--bits", "24")

    result = json.loads((out / "cifar10_retrieval.json").read_text())
    rows = {(r["method"], r["bits"]): r for r in result["rows"]}
    methods = ("subic", "subic_cq", "subic_vq", "subic16", "subic16_cq")
    methods += ("subic16_vq", "dsh", "dlbhc")
    assert set(rows) == {(m, 24) for m in methods}
    assert rows[("subic", 24)]["num_blocks"] == 4
    assert rows[("subic16", 24)]["block_size"] == 16
    for row in rows.values():
        assert row["epochs"] == 1 and row["data"]["num_test"] == 200
        paper, dsh = row["test"]["paper"], row["test"]["dsh"]
        assert 0.0 < paper["map_mean"] <= 1.0 and 0.0 < dsh["map_mean"] <= 1.0
        # Quick runs query 5 images per class of the 200 test images.
        assert (paper["num_queries"], paper["num_database"]) == (50, 150)
        assert (dsh["num_queries"], dsh["num_database"]) == (200, 200)
        assert paper["ties"] == "pessimistic"
        assert row["validation_map"][0] > 0 and row["train_seconds"][0] > 0
    assert result["versions"]["tensorflow"] and result["machine"]["cpu_count"]
    assert "--quick" in result["command"]

    entries = sorted(cache.glob("*.json"))
    assert len(entries) == 4
    for path in entries:
        entry = json.loads(path.read_text())
        assert (models / entry["model_file"]).is_file()
        assert entry["selection"]["best_epoch"] == 1
        # The class-posterior rows re-score the same SuBiC models.
        if entry["method"].startswith("subic"):
            derived = rows[(entry["method"] + "_cq", entry["bits"])]
            assert derived["keys"] == [entry["key"]]
            class_query = entry["test_class_query"]["paper"]
            assert class_query["query"] == "class_posterior"
            assert derived["test"]["paper"]["map_mean"] == class_query["map"]
            assert derived["validation_map"] == [
                entry["selection"]["validation_map_class_query"]
            ]
            # The recipe's rows: the query with the higher validation mAP.
            chosen = rows[(entry["method"] + "_vq", entry["bits"])]
            assert chosen["validation_map"] == [
                max(
                    derived["validation_map"][0],
                    entry["selection"]["best_validation_map"],
                )
            ]
            assert entry["selection"]["query_chosen_on_validation"] in (
                "fc0",
                "class_posterior",
            )

    text = (out / "cifar10_retrieval.md").read_text()
    assert "| SuBiC (paper) | 0.6349 |" in text
    for label in (
        "SuBiC K=64 (ours)",
        "SuBiC K=64, class-posterior query (ours)",
        "SuBiC K=16 (ours)",
        "DSH (ours)",
        "DLBHC",
    ):
        assert label in text
    mean = rows[("dsh", 24)]["test"]["paper"]["map_mean"]
    assert f"{mean:.4f}" in text
    assert "figure" not in result and not (out / "fig5_top10.png").exists()


@pytest.mark.slow
@QUICK_LEARNS_LITTLE
def test_quick_run_with_classifier_pretraining(
    run_benchmark, tmp_path, shared_data_dir
):
    cache, models = tmp_path / "cache", tmp_path / "models"
    # One method at two code lengths: the pre-trained CNN is shared by both,
    # and the figure needs two.
    extra = ("--pretrain-epochs", "1", "--methods", "subic", "--bits", "12,24")
    printed = run_quick(run_benchmark, tmp_path, shared_data_dir, *extra)
    assert printed.count("[pretrain]") == 1  # once per seed, shared
    out = tmp_path / "out"
    assert (out / "fig5_top10.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    result = json.loads((out / "cifar10_retrieval.json").read_text())
    assert result["figure"] == "fig5_top10.png"
    (record,) = result["pretraining"]
    assert record["seed"] == 0 and record["epochs"] == 1
    assert 0.0 <= record["best_validation_accuracy"] <= 1.0
    assert (models / f"{record['key']}.weights.h5").is_file()
    entries = [json.loads(p.read_text()) for p in cache.glob("table-*.json")]
    trained = sorted((e["method"], e["bits"]) for e in entries)
    assert trained == [("subic", 12), ("subic", 24)]
    for entry in entries:
        assert entry["hparams"]["pretrain_epochs"] == 1
        assert entry["pretraining"]["key"] == record["key"]
    text = (tmp_path / "out" / "cifar10_retrieval.md").read_text()
    assert "Classifier pre-training of the CNN" in text
    assert "1 (classifier) + 1 epochs" in text

    # A rerun reads every model and the pre-trained CNN from the cache, and
    # scores an entry cached without the class-posterior query from its model.
    subic_path = next(cache.glob("table-subic-*.json"))
    entry = json.loads(subic_path.read_text())
    scored = entry.pop("test_class_query")
    subic_path.write_text(json.dumps(entry))
    again = run_quick(run_benchmark, tmp_path, shared_data_dir, *extra, "--no-figure")
    assert "[train]" not in again and "[pretrain]" not in again
    assert again.count("[rescored]") == 1
    assert json.loads(subic_path.read_text())["test_class_query"] == scored
