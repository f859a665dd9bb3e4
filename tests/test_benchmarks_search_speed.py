"""Smoke test of benchmarks/search_speed.py."""

import json
import os
import subprocess
import sys

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
    assert report["command"][1:3] == ["--quick", "--num-items"]
    assert report["settings"]["num_items"] == 1500
    assert {"faiss", "numpy"} <= set(report["versions"])
    assert report["machine"]["cpu_count"] == os.cpu_count()
    assert len(report["results"]) == 4 * 6 * 3
    for row in report["results"]:
        assert row["qps"] > 0
        if row["method"] == "hamming":
            assert row["recall_at_100"] is None
        else:  # ReLU queries allow rare exact ties between distinct codes
            assert row["recall_at_100"] >= 0.99
    assert {t["target"].split(":")[0] for t in report["targets"]} == {
        "64 bits, K=256",
        "64 bits, K=16",
        "48 bits, K=64",
        "48 bits, K=16",
    }
