"""Smoke test of `python -m benchmarks.cross_domain --quick` (Table 3 and Figs. 3-4)."""

from __future__ import annotations

import json

import pytest

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
# One worker runs them all (the README's `--dist loadgroup`): one quick run.
# The quick run's 100 training points are fewer than k-means advises.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("cross_domain"),
    pytest.mark.filterwarnings("ignore:training 16 codewords per codebook"),
]


@pytest.fixture(scope="module")
def quick_run(shared_data_dir, tmp_path_factory, run_benchmark):
    """Runs the quick mode once; returns its output directory and what it
    printed."""
    if not (shared_data_dir / "mobilenet").is_dir():
        pytest.skip(f"no MobileNet extractor under {shared_data_dir}")
    output = tmp_path_factory.mktemp("cross_domain")
    printed = run_benchmark(
        "cross_domain",
        "--quick",
        "--data-dir",
        shared_data_dir,
        "--output-dir",
        output,
        "--cache-dir",
        output / "cache",
    )
    return output, printed


def test_quick_writes_json_with_every_method(quick_run):
    output, _ = quick_run
    report = json.loads((output / "cross_domain.json").read_text())
    for key in (
        "command",
        "seeds",
        "settings",
        "versions",
        "methods",
        "sweep",
        "paper_table3",
        "metric",
        "wall_seconds",
    ):
        assert key in report
    assert report["quick"] is True
    # Nothing was cached, and no sweep point is the 2-layer model (γ = 5).
    walls = [e["per_seed"]["0"]["wall_seconds"] for e in report["methods"].values()]
    walls += [p["wall_seconds"] for p in report["sweep"]["points"]]
    assert report["total_compute_seconds"] == pytest.approx(sum(walls))
    expected = {
        "uncompressed_l2",
        "uncompressed_cosine",
        "pq",
        "lsq",
        "dsh",
        "subic_2layer",
        "subic_3layer",
    }
    assert set(report["methods"]) == expected
    for name, entry in report["methods"].items():
        result = entry["per_seed"]["0"]
        assert "wall_seconds" in result, name
        assert result["cached"] is False, name
        for dataset in ("fashion_mnist", "cifar10"):
            value = result["test"][dataset]["map"]
            assert 0.0 < value <= 1.0, (name, dataset, value)
            assert result["test"][dataset]["ties"] == "pessimistic"
            assert entry["summary"][dataset]["map_mean"] == pytest.approx(value)
    for name in ("subic_2layer", "subic_3layer"):
        params = report["methods"][name]["per_seed"]["0"]["hyperparameters"]
        assert params["chosen_epoch"] >= 1
        assert {"gamma", "mu", "learning_rate", "warmup_epochs"} <= set(params)


def test_quick_sweep_records_figure_numbers(quick_run):
    output, _ = quick_run
    report = json.loads((output / "cross_domain.json").read_text())
    points = report["sweep"]["points"]
    assert [p["gamma_over_mu"] for p in points] == [0.5, 2.0]
    block_size = report["settings"]["block_size"]
    for point in points:
        for dataset in ("fashion_mnist", "cifar10"):
            stats = point["code_statistics"][dataset]
            sorted_block = stats["sorted_first_block"]
            assert len(sorted_block) == block_size
            assert sum(sorted_block) == pytest.approx(1.0, abs=1e-4)
            assert sorted_block == sorted(sorted_block, reverse=True)
            support = stats["first_block_support_sorted"]
            assert sum(support) == report["data"]["test_sizes"][dataset]
            assert support == sorted(support, reverse=True)
            assert 0.0 < point["test"][dataset]["map"] <= 1.0


def test_quick_writes_markdown_and_figures(quick_run):
    output, _ = quick_run
    text = (output / "cross_domain.md").read_text()
    assert "| SuBiC 2-layer |" in text
    assert "Table 3" in text
    for name in ("fig3_gamma_mu.png", "fig4_map_vs_gamma_mu.png"):
        data = (output / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_total_compute_seconds_counts_the_shared_sweep_point_once(load_benchmark):
    module = load_benchmark("cross_domain_report")
    methods = {
        "pq": {"per_seed": {"0": {"wall_seconds": 10.0}, "1": {"wall_seconds": 5.0}}},
        "subic_2layer": {"per_seed": {"0": {"wall_seconds": 100.0}}},
    }
    sweep = {
        "points": [
            {"gamma": 1.0, "shares_table_model": False, "wall_seconds": 7.0},
            {"gamma": 5.0, "shares_table_model": True, "wall_seconds": 100.0},
        ]
    }
    assert module.total_compute_seconds(methods, sweep) == 122.0
    assert module.total_compute_seconds(methods, None) == 115.0
