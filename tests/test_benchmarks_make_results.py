"""Tests of `python -m benchmarks.make_results` on small fake result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def make_results(load_benchmark):
    return load_benchmark("make_results")


def _write(directory: Path, name: str, data) -> None:
    (directory / name).write_text(json.dumps(data))


CIFAR = {
    "command": "python benchmarks/cifar10_retrieval.py --bits 48",
    "timestamp": "2026-01-01T00:00:00Z",
    "machine": {"cpu_count": 2, "platform": "TestOS"},
    "wall_seconds": 1234.5,
    "map_definition": "non-interpolated mAP",
    "selection_metric": "validation mAP",
    "paper_table2": {"SuBiC": {"12": 0.6349, "48": 0.6863}},
    "rows": [
        {
            "method": "subic",
            "label": "SuBiC K=64 (ours)",
            "bits": 48,
            "epochs": 12,
            "hparams": {"gamma": 1.0},
            "seeds": [0, 1],
            "train_seconds": [600.4, 610.2],
            "best_epoch": [11, 12],
            "test": {
                "paper": {"map_mean": 0.41234, "map_std": 0.0123},
                "dsh": {"map_mean": 0.45678, "map_std": None},
            },
        }
    ],
    "comparison": {
        "pretrain_epochs": 30,
        "epochs": 4,
        "subic_hparams": {"gamma": 0.1, "mu": 0.1},
        "bits": [
            {
                "bits": 48,
                "paper_subic": 0.6863,
                "subic": {
                    "map": 0.69,
                    "map_std": 0.01,
                    "seeds": [0, 1, 2],
                    "map_expected": 0.70,
                    "map_21point": 0.71,
                },
                "subic_cq": {"map": 0.695, "map_std": None, "seeds": [0]},
                "subic_z": {"map": 0.6812, "map_std": None, "seeds": [0]},
                "subic16": None,
                "dsh": {"map": 0.61, "map_std": None, "seeds": [0]},
                "dlbhc": None,
                "met": {
                    "subic_21point_vs_paper": True,
                    "subic_strict_vs_paper": True,
                    "subic_vs_our_dsh": True,
                },
            }
        ],
    },
    "sweep": [
        {
            "bits": 48,
            "epochs": 4,
            "hparams": {"gamma": 0.3, "mu": 0.3, "warmup_fraction": 0.33},
            "validation_map": 0.3141,
            "train_seconds": 77.0,
        }
    ],
}
SEARCH = {
    "command": ["python", "benchmarks/search_speed.py"],
    "elapsed_seconds": 99.5,
    "settings": {"num_items": 1000000, "k": 100},
    "results": [
        {
            "bits": 64,
            "num_blocks": 16,
            "block_size": 16,
            "method": m,
            "batch": b,
            "qps": q,
            "recall_at_100": 0.999,
            "bytes_per_item": 8,
        }
        for m, b, q in (("subic", 1, 1111.0), ("subic", 1000, 22222.0))
    ],
    "targets": [{"target": "fast enough", "ratio": 3.25, "met": True}],
}
OVERHEAD = {
    "command": "python benchmarks/train_overhead.py",
    "best_images_per_second": {"subic_train": 1500.0, "plain_classifier": 1550.0},
    "seconds_per_cifar10_epoch": {"subic_train": 33.1, "plain_classifier": 31.0},
    "subic_train_over_plain_classifier": 0.9677,
    "machine": {"cpu": "AMD EPYC"},
}
RECIPE = {
    "command": "python -m benchmarks.train_recipe --seeds 0",
    "bits": 48,
    "runs": [
        {
            "seed": 0,
            "summary": {"query": "class_posterior"},
            "test_map": {
                "saved": {"map": 0.7329},
                "fc0": {"map": 0.6749},
                "class_posterior": {"map": 0.7329},
            },
            "train_wall_seconds": 2050.0,
            "load_average_1min": {"start": 0.59},
        }
    ],
    "mean_test_map": 0.7329,
    "std_test_map": 0.0,
    "paper_map": 0.6863,
    "machine": {"cpu": "AMD EPYC"},
}
ENCODE = {
    "command": ["python", "benchmarks/encode_speed.py"],
    "elapsed_seconds": 29.0,
    "results": [{"method": "litert_int8", "batch": 1, "images_per_second": 2573.9}],
    "size_bytes": {"litert_int8": 891144},
}
PARITY = {
    "command": ["python", "benchmarks/export_parity.py"],
    "elapsed_seconds": 6.3,
    "results": {"litert_int8": {"block_agreement": 0.986, "mismatched_blocks": 112}},
    "retrieval_map": {"keras_float": 0.2351},
    "targets": {"block agreement >= 0.999": False},
}
# A structure no renderer knows: rendered generically.
CROSS = {
    "command": "python benchmarks/cross_domain.py",
    "elapsed_seconds": 321.0,
    "results": {"voc2007": {"subic_2layer": 0.5432, "pq": 0.4965}},
    "notes": [{"dataset": "caltech101", "map": 0.3923}],
}


def test_every_number_comes_from_the_jsons(make_results, tmp_path):
    for name, data in (
        ("cifar10_retrieval.json", CIFAR),
        ("search_speed.json", SEARCH),
        ("train_overhead.json", OVERHEAD),
        ("train_recipe.json", RECIPE),
        ("encode_speed.json", ENCODE),
        ("export_parity.json", PARITY),
        ("cross_domain.json", CROSS),
    ):
        _write(tmp_path, name, data)
    output = tmp_path / "out" / "R.md"
    make_results.main(["--results-dir", str(tmp_path), "--output", str(output)])
    text = output.read_text()

    # Sections in order, each with its command and wall time.
    order = [
        "CIFAR-10 category retrieval",
        "Cross-domain",
        "Search speed",
        "Encoding speed",
        "Export parity",
        "Training overhead",
    ]
    positions = [text.index(title) for title in order]
    assert positions == sorted(positions)
    assert (
        "`python -m benchmarks.cifar10_retrieval --bits 48` (wall time 1,234.5 s)"
        in text
    )
    assert "`python -m benchmarks.search_speed` (wall time 99.5 s)" in text
    assert "`python -m benchmarks.train_overhead` (wall time not recorded)" in text
    assert "`python -m benchmarks.cross_domain` (wall time 321.0 s)" in text

    # CIFAR-10: paper numbers, ours with std, times, sweep.
    assert "| SuBiC (paper) | 0.6349 | — | — | 0.6863 |" in text
    assert "0.4123 ± 0.0123" in text and "0.4568" in text
    assert "| SuBiC K=64 (ours), 12 epochs, γ = 1 | —" in text
    assert "| 48 | 0.6863 | 0.6900 ± 0.0100 (n=3) | 0.7000 | 0.7100 |" in text
    assert "0.6950 | 0.6812 | — | 0.6100 | — | yes | yes | yes |" in text
    assert "600, 610" in text and "0.3141" in text
    # The other known files.
    assert "1,111.0" in text and "22,222.0" in text and "3.2500" in text
    assert "1,500.0" in text and "33.1" in text and "0.9677" in text
    assert "AMD EPYC" in text
    assert "| 0 | class_posterior | 0.7329 | 0.6749 | 0.7329 | 2,050.0 |" in text
    assert "Mean mAP 0.7329 ± 0.0000 over 1 seed(s); the paper: 0.6863." in text
    assert "2,573.9" in text and "891144" in text
    assert "0.9860" in text and "112" in text and "0.2351" in text
    # Unknown structure: rendered generically.
    assert "| voc2007 | 0.5432 | 0.4965 |" in text
    assert "caltech101" in text and "0.3923" in text


def test_missing_and_unexpected_files(make_results, tmp_path):
    assert "No benchmark results found." in make_results.make_results(str(tmp_path))
    # A known name with another structure falls back to the generic tables;
    # an unreadable file is named, not fatal.
    _write(tmp_path, "search_speed.json", {"results": {"subic": 5.5}})
    (tmp_path / "broken.json").write_text("{not json")
    text = make_results.make_results(str(tmp_path))
    assert "shown generically" in text and "5.5000" in text
    assert "broken.json" in text and "unreadable" in text
    assert "cross_domain" not in text.lower()


def test_missing_results_dir_is_an_error(make_results, tmp_path):
    with pytest.raises(SystemExit):
        make_results.main(["--results-dir", str(tmp_path / "absent")])


CROSS_LAYOUT = {
    "command": ["benchmarks/cross_domain.py"],
    "wall_seconds": 11.5,
    "metric": "mAP, pessimistic ties",
    "methods": {
        "subic_2layer": {
            "summary": {
                "fashion_mnist": {"map_mean": 0.3385, "num_seeds": 1},
                "cifar10": {"map_mean": 0.71, "map_std": 0.02, "num_seeds": 2},
            },
            "per_seed": {
                "0": {"wall_seconds": 380.0, "validation_map": 0.7446},
                "1": {"wall_seconds": 390.0, "validation_map": 0.7},
            },
        },
        "pq": {
            "summary": {"cifar10": {"map_mean": 0.409, "num_seeds": 1}},
            "per_seed": {"0": {"wall_seconds": 46.0}},
        },
    },
    "paper_table3": {"columns": ["VOC2007"], "rows": {"pq": [0.4965]}},
}


def test_cross_domain_layout(make_results, tmp_path):
    _write(tmp_path, "cross_domain.json", CROSS_LAYOUT)
    text = make_results.make_results(str(tmp_path))
    assert "| subic_2layer | 0.3385 | 0.7100 ± 0.0200 | 0.7446, 0.7000 | 770 |" in text
    assert "| pq | — | 0.4090 | — | 46 |" in text
    assert "| pq | 0.4965 |" in text and "shown generically" not in text


def test_an_aggregated_report_names_its_models_training_time(make_results, tmp_path):
    _write(
        tmp_path,
        "cifar10_retrieval.json",
        {
            **CIFAR,
            "command": "python b.py --report-only",
            "wall_seconds": 17.0,  # the cached run's own time: not the cost
            "total_compute_seconds": 1234.5,
        },
    )
    output = tmp_path / "R.md"
    make_results.main(["--results-dir", str(tmp_path), "--output", str(output)])
    text = output.read_text()
    assert (
        "Reproduce the report with `python b.py --report-only` from the cached "
        "models, whose training and evaluation took 1,234.5 s in all." in text
    )
    assert "(wall time 1,234.5 s)" not in text


def test_a_command_on_a_cached_model_says_where_the_model_comes_from(
    make_results, tmp_path
):
    parity = {
        "command": "python benchmarks/export_parity.py --model "
        "benchmarks/cache/models/table-subic-48b-s0-e5-abc.keras",
        "results": {"savedmodel": {"block_agreement": 1.0}},
    }
    _write(tmp_path, "export_parity.json", parity)
    text = make_results.make_results(str(tmp_path))
    assert (
        "Its model is one that `python -m benchmarks.cifar10_retrieval` trains "
        "and keeps under `benchmarks/cache/models/`" in text
    )
    _write(tmp_path, "export_parity.json", {**parity, "command": "python e.py"})
    assert "Its model is one" not in make_results.make_results(str(tmp_path))


def test_a_cached_report_gives_its_compute_time_not_its_last_run(
    make_results, tmp_path
):
    cross = {**CROSS_LAYOUT, "command": "python c.py", "total_compute_seconds": 1409.0}
    _write(tmp_path, "cross_domain.json", cross)
    text = make_results.make_results(str(tmp_path))
    assert (
        "Reproduce the report with `python c.py` from the cached models, whose "
        "training and evaluation took 1,409.0 s in all." in text
    )


def test_readme_summary_reads_its_figures_from_the_jsons(make_results, tmp_path):
    stream = {
        "machine": {"cpu": "Some CPU", "simd_flags": ["avx2"]},
        "cases": {
            "folder_5000": {
                "num_train": 9,
                "images_per_second": 1.5,
                "peak_rss_kb": 2048,
                "prepare_seconds": 0.1,
            },
        },
        "ratios": {"rss_50000_over_5000": 1.234, "speed_folder_over_arrays": 0.876},
    }
    folder = {
        "machine": {
            "cpu": "Other CPU",
            "simd_flags": ["avx2", "avx512f", "avx512vbmi"],
        },
        "budget": {"pretrain_epochs": 5, "epochs": 2, "bits": 48},
        "runs": {
            "folder": [{"seed": 0, "test_map": 0.5, "query": "fc0", "train_seconds": 1}]
        },
        "mean_test_map": {"folder": 0.5123, "arrays": 0.4987},
        "difference": 0.0136,
        "largest_seed_range": 0.0211,
    }
    (tmp_path / "stream_training.json").write_text(json.dumps(stream))
    (tmp_path / "folder_training.json").write_text(json.dumps(folder))
    results = make_results._read_results(str(tmp_path))[0]
    summary = make_results.render_summary(results)
    for figure in ("1.234x", "0.876x", "0.5123", "0.4987", "0.0211"):
        assert figure in summary
    assert "Some CPU, AVX2, no AVX-512" in summary
    assert "Other CPU, AVX-512 VBMI" in summary
    full = make_results.make_results(str(tmp_path))
    assert "### Training from a folder" in full
    assert "| folder 5000 | DSH CNN at 32x32 | 9 | 1.5000 | 2 | 0.1000 |" in full
    assert "Folder against arrays" in full


def test_the_instance_scan_row_reads_each_kernel_by_batch(make_results, tmp_path):
    def ratio(method, batch, value):
        return {
            "data": "random",
            "bits": 256,
            "num_blocks": 64,
            "block_size": 16,
            "method": method,
            "batch": batch,
            "qps_over_hamming": value,
        }

    speed = {
        "machine": {"cpu": "Some CPU", "simd_flags": ["avx2"]},
        "settings": {"num_items": 1_000_000},
        "ratios": [
            ratio("native-avx2", 1, 1.234),
            ratio("native-avx2", 1000, 1.456),
            ratio("faiss", 1000, 0.111),
        ],
    }
    (tmp_path / "search_speed_avx2_256.json").write_text(json.dumps(speed))
    results = make_results._read_results(str(tmp_path))[0]
    summary = make_results.render_summary(results)
    row = next(line for line in summary.splitlines() if "instance scan" in line)
    assert "256 bits, 64 blocks of 16" in row and "batches of 1,000 / 1" in row
    assert "avx2 1.46x / 1.23x" in row and "0.11" not in row
    assert "Some CPU, AVX2, no AVX-512" in row


def test_near_duplicates_reads_as_one_row_and_a_table(make_results, tmp_path):
    def recall(value):
        return {"recall@1": value, "recall@10": value}

    data = {
        "machine": {"cpu": "Some CPU", "simd_flags": ["avx2"]},
        "settings": {
            "epochs": 2,
            "train_pictures": 500,
            "batch_size": 64,
            "queries": 100,
            "num_blocks": 8,
            "block_size": 256,
            "bits": 64,
        },
        "results": {
            "whole family": {
                "instance code 10k": recall(0.5),
                "instance code 60k": recall(0.45),
                "look 10k": recall(0.3),
                "look 60k": recall(0.2),
            },
            "rotation": {
                "instance code 10k": recall(0.25),
                "instance code 60k": recall(0.125),
            },
        },
    }
    (tmp_path / "near_duplicates.json").write_text(json.dumps(data))
    results = make_results._read_results(str(tmp_path))[0]
    summary = make_results.render_summary(results)
    assert "instance code 0.500 / 0.450; look 0.300 / 0.200" in summary
    full = make_results.make_results(str(tmp_path))
    assert "### Copies found first: an instance code" in full
    assert "| rotation | 0.250 | 0.125 | — | — |" in full


def _instance_run(**settings) -> dict:
    """The machine and settings of a 4-epoch instance-code run."""
    return {
        "machine": {"cpu": "Some CPU", "simd_flags": ["avx2"]},
        "settings": {
            "epochs": 4,
            "train_pictures": 500,
            "queries": 100,
            "bits": 64,
            **settings,
        },
    }


def test_held_out_families_read_as_a_table_beside_the_reference(make_results, tmp_path):
    def recall(value):
        return {"recall@1": value, "recall@10": value}

    data = {
        **_instance_run(held_out={"rotation": ["rotation"]}),
        "results": {
            "rotation": {
                "held out group": "rotation",
                "held out 10k": recall(0.25),
                "reference 10k": recall(0.5),
                "held out 60k": recall(0.125),
                "reference 60k": recall(0.375),
            }
        },
    }
    (tmp_path / "held_out_families.json").write_text(json.dumps(data))
    full = make_results.make_results(str(tmp_path))
    assert "### Leave one family out" in full
    assert "| rotation | rotation | 0.250 | 0.500 | 0.125 | 0.375 |" in full
    assert "both 4 epochs on 500 pictures (64 bits)" in full
    summary = make_results.render_summary(make_results._read_results(str(tmp_path))[0])
    assert "| rotation 0.125 (0.375) |" in summary


def test_a_reference_alone_reads_as_recalls_by_family(make_results, tmp_path):
    data = {
        **_instance_run(width=2, held_out={}),
        "results": {},
        "reference": {
            "whole family": {
                "10k": {"recall@1": 0.5, "recall@10": 0.75},
                "60k": {"recall@1": 0.25, "recall@10": 0.625},
            }
        },
    }
    (tmp_path / "held_out_reference_width2.json").write_text(json.dumps(data))
    full = make_results.make_results(str(tmp_path))
    assert "### Copies by family, 4 epochs: a CNN twice as wide" in full
    assert "| whole family | 0.500 | 0.750 | 0.250 | 0.625 |" in full
    assert "on the DSH CNN 2 times as wide, on Some CPU" in full


def test_the_unseen_row_reads_three_splits_where_they_were_run(make_results, tmp_path):
    def unseen(splits, value, block_size=64, epochs=(8, 3)):
        rows = {"subic_z": value, "one_hot_classifier": 0.3, "pq": 0.2, "opq": 0.2}
        return {
            "settings": {
                "splits": splits,
                "pretrain_epochs": epochs[0],
                "epochs": epochs[1],
                "block_size": block_size,
                "budget": "reduced" if epochs[0] else "subic train's defaults",
            },
            "mean_map": {"unseen 48": rows, "paper 48": rows},
        }

    def summary() -> str:
        results = make_results._read_results(str(tmp_path))[0]
        return make_results.render_summary(results)

    (tmp_path / "unseen_classes.json").write_text(json.dumps(unseen([0], 0.25)))
    assert "K = 64, split 0 | SuBiC z 0.250" in summary()
    splits = unseen([0, 1, 2], 0.375)
    (tmp_path / "unseen_classes_splits.json").write_text(json.dumps(splits))
    assert "splits [0, 1, 2] | SuBiC z 0.375" in summary()
    assert "0.250" not in summary()
    assert "### Codes that transfer: three splits" in make_results.make_results(
        str(tmp_path)
    )
    # subic train's blocks of 16 over the same splits supersede blocks of 64;
    # a run at subic train's whole budget is a row of its own.
    k16 = unseen([0, 1, 2], 0.4375, block_size=16)
    (tmp_path / "unseen_classes_k16.json").write_text(json.dumps(k16))
    full = unseen([0], 0.5, block_size=16, epochs=(None, None))
    (tmp_path / "unseen_classes_full.json").write_text(json.dumps(full))
    rows = summary()
    assert "K = 16, splits [0, 1, 2] | SuBiC z 0.438" in rows
    assert "`subic train`'s defaults, K = 16, split 0 | SuBiC z 0.500" in rows
    assert "0.375" not in rows
    document = make_results.make_results(str(tmp_path))
    assert "(pre-training epochs 100, SuBiC epochs 5, blocks of K = 16)" in document
    # More splits at the whole budget replace the one split's row.
    both = unseen([0, 1], 0.5625, block_size=16, epochs=(None, None))
    (tmp_path / "unseen_classes_full_splits.json").write_text(json.dumps(both))
    rows = summary()
    assert "`subic train`'s defaults, K = 16, splits [0, 1] | SuBiC z 0.562" in rows
    assert "0.500" not in rows


def test_unseen_classes_show_both_tie_counts(make_results, tmp_path):
    rows = {"subic_z": 0.4, "one_hot_classifier": 0.3}
    data = {
        "machine": {"cpu": "Some CPU", "simd_flags": ["avx2"]},
        "settings": {
            "splits": [0],
            "pretrain_epochs": 8,
            "epochs": 3,
            "budget": "reduced",
        },
        "runs": [],
        "mean_map": {"unseen 48": rows, "paper 48": rows},
        "mean_map_expected": {
            "unseen 48": {"subic_z": 0.45, "one_hot_classifier": 0.5},
            "paper 48": rows,
        },
    }
    (tmp_path / "unseen_classes.json").write_text(json.dumps(data))
    full = make_results.make_results(str(tmp_path))
    pessimistic, expected = full.split("exact mean over the orders of tied items")
    assert (
        "| one-hot classifier (log2 of the classes: 3 or 4 bits) | 0.3000 | 0.3000 |"
        in (pessimistic)
    )
    assert (
        "| one-hot classifier (log2 of the classes: 3 or 4 bits) | 0.3000 | 0.5000 |"
        in (expected)
    )


def test_a_recipe_run_with_a_block_size_names_it(load_benchmark):
    render = load_benchmark("render_systems").render_train_recipe
    assert "with its defaults at 48 bits" in render(RECIPE)[0]
    line = render({**RECIPE, "block_size": 64})[0]
    assert "with its defaults and `--block-size 64` at 48 bits" in line
    line = render({**RECIPE, "block_size": 64, "pretrain_epochs": 50})[0]
    assert "and `--block-size 64` and `--pretrain-epochs 50` at" in line
    assert "--block-size" not in render({**RECIPE, "block_size": 16})[0]
    assert "--pretrain-epochs" not in render({**RECIPE, "pretrain_epochs": 100})[0]


def test_a_recipe_run_on_a_cached_backbone_says_so(load_benchmark):
    render = load_benchmark("render_systems").render_train_recipe
    assert not any("cache shared" in line for line in render(RECIPE))
    runs = [{**RECIPE["runs"][0], "pretrain_cached": True}]
    lines = render({**RECIPE, "runs": runs})
    assert "Seed(s) 0 took the pre-trained backbone from a cache" in lines[-1]


def _mobilenet_row(whole: float, crop: float, distinct: int) -> dict:
    families = {"whole family": {"recall@1": whole}, "crop": {"recall@1": crop}}
    row = {
        split: {name: {size: value for size in ("50k", "60k", "70k")}
                for name, value in families.items()}
        for split in ("validation", "test", "fashion")
    }  # fmt: skip
    row["fashion"]["distinct_codes"] = {"70k": distinct}
    return row


def test_mobilenet_runs_get_one_row_per_code(make_results, tmp_path):
    run = {
        "command": "python -m benchmarks.mobilenet_instance --learning-rate 1e-3",
        "settings": {"queries": 1000, "size": 64, "epochs": 14,
                     "learning_rate": 0.001, "train_pictures": 45000},
        "train_seconds": 2728.2,
        "results": {"mobilenet": _mobilenet_row(0.4321, 0.1234, 62287),
                    "shipped": _mobilenet_row(0.6191, 0.4987, 64807)},
    }  # fmt: skip
    _write(tmp_path, "mobilenet_instance_lr1e-3.json", run)
    text = make_results.make_results(str(tmp_path))
    assert "MobileNet v1 fine-tuned at a learning rate of 1e-3" in text
    assert "14 epochs at a learning rate of 0.001" in text and "2,728 s" in text
    row = "| mobilenet | 0.432 | 0.123 | 0.432 | 0.123 | 0.432 | 0.123 | 62,287 |"
    assert row in text
    assert (
        "| shipped | 0.619 | 0.499 | 0.619 | 0.499 | 0.619 | 0.499 | 64,807 |" in text
    )
