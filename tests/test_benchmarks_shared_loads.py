"""Smoke test of benchmarks/shared_loads.py."""

import json
import sys

import pytest

from benchmarks import make_results, shared_loads
from subic_keras.search import native, workers

KERNELS = [k for k in native.kernels() if k in shared_loads.PASSES]


@pytest.mark.skipif(not KERNELS, reason="no x86 kernel of 4-bit sub-codes here")
def test_quick_run_times_every_pass_and_writes_json(tmp_path, capsys, monkeypatch):
    output = tmp_path / "shared_loads.json"
    argv = ["--quick", "--num-items", "5000", "--num-blocks", "16,64"]
    monkeypatch.setattr(sys, "argv", ["shared_loads.py", *argv])  # the recorded command
    shared_loads.main([*argv, "--output", str(output)])
    report = json.loads(output.read_text())
    assert report["command"] == "python -m benchmarks.shared_loads " + " ".join(argv)
    assert report["machine"]["cpu"]
    rows = report["rows"]
    for bits in (64, 256):
        for kernel in KERNELS:
            mine = [r for r in rows if r["bits"] == bits and r["kernel"] == kernel]
            if kernel == "vbmi" and not mine:
                continue  # small databases of short codes: bytes, not nibbles
            batches = [r for r in mine if r["batch"] > 1]
            assert [r["queries_per_load"] for r in batches] == list(
                shared_loads.PASSES[kernel]
            )
            assert batches[0]["over_one_a_load"] == 1.0
            singles = [r for r in mine if r["batch"] == 1]
            assert [r["threads"] for r in singles] == sorted({1, workers.cores()})
            assert all(r["qps"] > 0 and r["qps_per_cpu_second"] > 0 for r in mine)
    printed = capsys.readouterr().out
    assert "4 a load" in printed and "single query" in printed

    # RESULTS.md reads both tables from the JSON.
    text = make_results.make_results(str(tmp_path))
    assert "queries sharing code loads" in text and "shown generically" not in text
    kernel = KERNELS[0]
    assert f"| 256 | {kernel} | 4 |" in text
    assert f"| 256 | 0.2 | {kernel} | 1 |" in text  # 5,000 codes of 32 bytes
