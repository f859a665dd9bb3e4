"""Smoke test of benchmarks/two_codes.py."""

import json

import pytest

from benchmarks import two_codes

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_quick_run_times_both_codes_on_every_scanner_asked(tmp_path):
    output = tmp_path / "two_codes.json"
    result = two_codes.main(
        ["--quick", "--rounds", "1", "--scanners", "native-portable,faiss",
         "--instance-shape", "32,16", "--output", str(output)]
    )  # fmt: skip
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))
    assert result["command"].startswith("python -m benchmarks.two_codes")
    assert result["settings"]["pictures"] == 20_000
    assert result["settings"]["instance_shape"] == (32, 16)
    assert [row["scanner"] for row in result["rows"]] == ["native-portable"] * 6 + [
        "faiss"
    ] * 6
    for row in result["rows"]:
        rates = row["queries_per_second"]
        assert set(rates) == {"instance scan", "class scan", "whole answer"}
        assert all(value > 0 for value in rates.values())
        assert row["answer_over_instance_scan"] == pytest.approx(
            rates["instance scan"] / rates["whole answer"]
        )
