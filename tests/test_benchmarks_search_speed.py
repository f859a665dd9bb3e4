"""Smoke test of benchmarks/search_speed.py."""

import json
import os
import subprocess
import sys

import pytest

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Benchmark smoke test -----------------------------------------------------


def test_benchmark_quick_runs_and_writes_json(tmp_path):
    output = tmp_path / "results" / "speed.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    script = os.path.join(REPO, "benchmarks", "search_speed.py")
    args = ["--quick", "--num-items", "1500", "--threads", "1", "--output", output]
    completed = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "qps@1000" in completed.stdout
    report = json.loads(output.read_text())
    assert (
        "python -m benchmarks.search_speed --quick --num-items 1500"
        in report["command"]
    )
    assert report["settings"]["num_items"] == 1500
    assert {"faiss", "numpy"} <= set(report["versions"])
    assert report["machine"]["cpu_count"] == os.cpu_count()
    from subic_keras.search import scanners

    methods_per_config = [
        len(scanners.available(m, k)) + 4 for m, k in ((16, 16), (8, 64), (8, 256))
    ]
    assert len(report["results"]) == 3 * sum(methods_per_config)
    for row in report["results"]:
        assert row["qps"] > 0
        if row["method"] == "hamming":
            assert row["recall_at_100"] is None
        elif row["method"].startswith("native-"):  # exact
            assert row["recall_at_100"] == 1.0
        else:  # exact ties between distinct codes may be cut either way
            assert row["recall_at_100"] >= 0.99
    # Each scanner's rate over every baseline's.
    assert {key for key in report["ratios"][0] if key.startswith("qps_over_")} == {
        f"qps_over_{name}" for name in ("faiss_pq", "hamming", "numpy", "numpy_gather")
    }
    kernels = [n for n in scanners.available(8, 64) if n.startswith("native-")]
    assert {t["target"].split(":")[0] for t in report["targets"]} == {
        f"random, {bits} bits, K={k}, {kernel}"
        for bits, k in ((64, 16), (48, 64), (64, 256))
        for kernel in kernels
    }
    machine = report["machine"]
    assert machine["cpu"] and machine["faiss_simd_level"] and "simd_flags" in machine
    assert machine["scanners"] == scanners.available(8, 16)
    assert "omp_wait_policy" in machine


def test_num_blocks_sets_the_shape_and_the_hamming_bits(tmp_path, capsys):
    """`--num-blocks 32 --block-sizes 16`: the 128-bit shape, against faiss's
    Hamming scan at 128 bits; M that leaves a part of a byte is refused."""
    from benchmarks import search_speed

    output = tmp_path / "speed.json"
    report = search_speed.main(
        ["--quick", "--num-items", "1200", "--threads", "1", "--block-sizes", "16",
         "--num-blocks", "32", "--output", str(output)]
    )  # fmt: skip
    assert {(row["num_blocks"], row["bits"]) for row in report["results"]} == {
        (32, 128)
    }
    assert "--num-blocks 32" in json.loads(output.read_text())["command"]
    with pytest.raises(SystemExit):
        search_speed.main(["--quick", "--block-sizes", "16", "--num-blocks", "3"])
    assert "--num-blocks must give whole bytes at K = 16 (faiss's Hamming scan), " \
        "received 3" in capsys.readouterr().err  # fmt: skip


def test_milvus_benchmark_quick_runs_and_writes_json(tmp_path):
    import pytest

    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    output = tmp_path / "milvus.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.milvus_speed",
            "--sizes",
            "300,600",
            "--quick",
            "--output",
            output,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": REPO},
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(output.read_text())
    assert [row["num_items"] for row in report["results"]] == [300, 600]
    for row in report["results"]:
        assert row["milvus_lite"]["insert_items_per_second"] > 0
        assert row["subic_index"]["qps_batch"] > 0
        assert row["milvus_recall_at_100_vs_subic_index"] >= 0.99


def test_milvus_pictures_benchmark_answers_as_the_image_index(tmp_path):
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    from benchmarks import milvus_speed
    from benchmarks.render_systems import render_milvus_speed

    output = tmp_path / "pictures.json"
    report = milvus_speed.main(
        ["--pictures", "--sizes", "200", "--quick", "--output", str(output)]
    )
    assert json.loads(output.read_text())["settings"]["pictures"] is True
    (row,) = report["results"]
    assert row["num_items"] == 200 and row["milvus_same_first_10"] == 1.0
    assert row["image_index"]["qps_batch"] > 0 < row["milvus_lite"]["qps_batch_1"]
    lines = render_milvus_speed(report)
    assert lines[0].startswith("Pictures: a path, a fingerprint")
    assert "| 200 | ImageIndex |" in "\n".join(lines)
