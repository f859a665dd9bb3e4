"""benchmarks/serve_load.py at a tiny size: it serves, loads and reports."""

import json

import pytest

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def test_serve_load_reports_every_level_without_errors(load_benchmark, tmp_path):
    serve_load = load_benchmark("serve_load")
    output = tmp_path / "serve_load.json"
    report = serve_load.main(
        ["--items", "3000", "--requests", "12", "--quick", "--output", str(output)]
    )
    assert json.loads(output.read_text())["load"] == report["load"]
    assert [(r["kind"], r["clients"]) for r in report["load"]] == [
        ("query", 1),
        ("query", 4),
        ("image", 1),
        ("image", 4),
    ]
    for row in report["load"]:
        assert row["requests"] == 12 and row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        # Both kinds of answer say the server's own time, within the request's.
        assert 0 < row["server_p50_ms"] < row["p50_ms"]
    outside = report["goals"]["query_p50_outside_server_ms"]
    assert 0 < outside < report["load"][0]["p50_ms"]
    assert report["in_process"]["queries"] == 200
    assert report["machine"]["cpu"] and report["bits"] == 48
    assert "benchmarks.serve_load" in report["command"]
