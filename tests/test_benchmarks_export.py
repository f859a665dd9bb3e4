"""Quick runs of benchmarks/export_parity.py and encode_speed.py."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_benchmarks_quick(shared_data_dir, tmp_path, load_benchmark):
    parity = load_benchmark("export_parity")
    report = parity.main(
        [
            "--quick",
            "--data-dir",
            str(shared_data_dir),
            "--output",
            str(tmp_path / "p.json"),
        ]
    )
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["settings"]["quick"] and saved["versions"]["tensorflow"]
    assert report["results"]["saved_model_float_images"]["block_agreement"] == 1.0
    assert report["results"]["saved_model_png_bytes"]["max_abs_z_diff"] == 0.0
    assert report["results"]["litert_float32"]["block_agreement"] >= 0.99
    assert 0 <= report["retrieval_map"]["litert_int8"] <= 1

    speed = load_benchmark("encode_speed")
    report = speed.main(
        [
            "--quick",
            "--data-dir",
            str(shared_data_dir),
            "--output",
            str(tmp_path / "s.json"),
        ]
    )
    saved = json.loads((tmp_path / "s.json").read_text())
    methods = {row["method"] for row in saved["results"]}
    assert methods == {
        "keras_predict",
        "keras_call",
        "saved_model",
        "saved_model_png_bytes",
        "litert_float32",
        "litert_int8",
    }
    assert all(row["images_per_second"] > 0 for row in saved["results"])
    assert saved["size_bytes"]["litert_int8"] < saved["size_bytes"]["litert_float32"]
    assert saved["machine"]["cpu_count"] == os.cpu_count()
