"""Does OpenMP's wait policy change the search-speed ratios? Two runs compared.

`benchmarks/search_speed.py` run twice, once with `OMP_WAIT_POLICY` unset
(libgomp spins a while after each parallel region) and once with
`OMP_WAIT_POLICY=PASSIVE` (its threads sleep at once): for every target
(a native kernel against faiss's Hamming scan at equal bits, batches of
1,000 queries) and for single queries, the ratio in each run and how far
apart they are. The native scan uses no OpenMP; faiss's scans do.

Example:

    python -m benchmarks.search_speed
    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.search_speed \\
        --output benchmarks/results/search_speed_passive.json
    python -m benchmarks.omp_policy
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks import common

RESULTS = os.path.join("benchmarks", "results")


def _rates(report: dict, batch: int) -> dict:
    return {
        (r["data"], r["bits"], r["block_size"], r["method"]): r["qps"]
        for r in report["results"]
        if r["batch"] == batch
    }


def compare(unset: dict, passive: dict) -> list[dict]:
    """Each native kernel's ratio to Hamming in both runs, per batch size."""
    rows = []
    for batch in (1000, 1):
        a, b = _rates(unset, batch), _rates(passive, batch)
        for key in a:
            data, bits, block_size, method = key
            if not method.startswith("native-") or key not in b:
                continue
            hamming = (data, bits, block_size, "hamming")
            ratio_unset = a[key] / a[hamming]
            ratio_passive = b[key] / b[hamming]
            rows.append(
                {
                    "data": data,
                    "bits": bits,
                    "block_size": block_size,
                    "method": method,
                    "batch": batch,
                    "ratio_unset": round(ratio_unset, 3),
                    "ratio_passive": round(ratio_passive, 3),
                    "apart": round(
                        max(ratio_unset, ratio_passive)
                        / min(ratio_unset, ratio_passive)
                        - 1,
                        3,
                    ),
                    "method_qps_apart": round(
                        max(a[key], b[key]) / min(a[key], b[key]) - 1, 3
                    ),
                    "hamming_qps_apart": round(
                        max(a[hamming], b[hamming]) / min(a[hamming], b[hamming]) - 1, 3
                    ),
                }
            )
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unset", default=os.path.join(RESULTS, "search_speed.json"))
    parser.add_argument(
        "--passive", default=os.path.join(RESULTS, "search_speed_passive.json")
    )
    parser.add_argument("--output", default=os.path.join(RESULTS, "omp_policy.json"))
    args = parser.parse_args(argv)
    with open(args.unset) as handle:
        unset = json.load(handle)
    with open(args.passive) as handle:
        passive = json.load(handle)
    policies = (
        unset["machine"]["omp_wait_policy"],
        passive["machine"]["omp_wait_policy"],
    )
    if policies != (None, "PASSIVE"):
        raise SystemExit(
            f"expected runs with OMP_WAIT_POLICY unset and PASSIVE, received {policies}"
        )
    rows = compare(unset, passive)
    at_1000 = [r for r in rows if r["batch"] == 1000]
    report = {
        "command": common.command("omp_policy"),
        "runs": {"unset": unset["command"], "passive": passive["command"]},
        "machine": unset["machine"],
        "rows": rows,
        "largest_apart_at_1000": max(r["apart"] for r in at_1000),
        "goal": "ratios at batches of 1,000 within 20% of each other",
        "met": all(r["apart"] <= 0.2 for r in at_1000),
    }
    for r in rows:
        print(
            f"{r['data']:<18} K={r['block_size']:<4} {r['method']:<16} batch "
            f"{r['batch']:>4}: {r['ratio_unset']:.2f}x unset, "
            f"{r['ratio_passive']:.2f}x PASSIVE ({r['apart']:+.0%} apart; the "
            f"kernel {r['method_qps_apart']:+.0%}, "
            f"Hamming {r['hamming_qps_apart']:+.0%})"
        )
    print(f"largest gap at 1,000 queries: {report['largest_apart_at_1000']:.0%}")
    common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
