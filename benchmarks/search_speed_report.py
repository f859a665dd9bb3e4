"""What `benchmarks/search_speed.py` reports: each scanner's rate over the
baselines', the targets it must reach, and the table it prints."""

from __future__ import annotations

# The targets: each native kernel's exact search against Hamming at the same
# bits, by block size, on random codes; on trained codes, 1.5x.
SIMD_TARGETS = {16: 1.5, 64: 1.0, 256: 1.0}
PORTABLE_TARGET = 0.5
TRAINED_TARGET = 1.5


def ratios(rows: list[dict]) -> list[dict]:
    """Each scanner's rate over every baseline's, at every batch size."""
    by_key = {
        (r["data"], r["bits"], r["block_size"], r["method"], r["batch"]): r
        for r in rows
    }
    baselines = sorted({r["method"] for r in rows if not r["scanner"]})
    out = []
    for r in rows:
        if not r["scanner"]:
            continue
        key = (r["data"], r["bits"], r["block_size"])
        entry = {
            "data": r["data"],
            "bits": r["bits"],
            "num_blocks": r["num_blocks"],
            "block_size": r["block_size"],
            "method": r["method"],
            "batch": r["batch"],
        }
        for other in baselines:
            base = by_key[(*key, other, r["batch"])]
            entry[f"qps_over_{other}"] = r["qps"] / base["qps"]
            entry[f"cpu_qps_over_{other}"] = (
                r["qps_per_cpu_second"] / base["qps_per_cpu_second"]
            )
        out.append(entry)
    return out


def target_factor(data: str, block_size: int, method: str) -> float | None:
    """What a native kernel must reach against Hamming (None: no target)."""
    if not method.startswith("native-"):
        return None
    if method == "native-portable":
        return PORTABLE_TARGET if data == "random" else None
    if data != "random":
        return TRAINED_TARGET
    return SIMD_TARGETS.get(block_size)


def targets(rows: list[dict]) -> list[dict]:
    """The targets, checked on wall-clock rates at 1,000-query batches.

    Each native kernel's exact search against faiss's Hamming scan at the
    same bits, for random codes and for trained models' codes. The rate per
    CPU-second gives the same ratio, steadier on a shared machine.
    """
    at = {
        (r["data"], r["bits"], r["block_size"], r["method"]): r
        for r in rows
        if r["batch"] == 1000
    }
    out = []
    for (data, bits, block_size, method), row in at.items():
        factor = target_factor(data, block_size, method)
        if factor is None:
            continue
        base = at[data, bits, block_size, "hamming"]
        out.append(
            {
                "target": f"{data}, {bits} bits, K={block_size}, {method}: >= "
                f"{factor:g}x hamming",
                "ratio": row["qps"] / base["qps"],
                "ratio_per_cpu_second": row["qps_per_cpu_second"]
                / base["qps_per_cpu_second"],
                "recall_at_100": row["recall_at_100"],
                "met": row["qps"] / base["qps"] >= factor
                and row["recall_at_100"] == 1.0,
            }
        )
    return out


def print_table(rows: list[dict]) -> None:
    """Every method's rates at each batch size, one line each."""
    batches = sorted({r["batch"] for r in rows})
    header = (
        f"{'data':<14}{'bits':>4} {'M':>3} {'K':>4}  {'method':<16}"
        + "".join(f"{f'qps@{b}':>11}" for b in batches)
        + f"{'cpu-qps@1000':>14}{'recall@100':>12}{'bytes/item':>12}"
    )
    print(header)
    print("-" * len(header))
    seen = set()
    for r in rows:
        key = (r["data"], r["bits"], r["block_size"], r["method"])
        if key in seen:
            continue
        seen.add(key)
        same = [
            x
            for x in rows
            if (x["data"], x["bits"], x["block_size"], x["method"]) == key
        ]
        qps = "".join(f"{x['qps']:>11.1f}" for x in same)
        qps += f"{same[-1]['qps_per_cpu_second']:>14.1f}"
        rec = "-" if r["recall_at_100"] is None else f"{r['recall_at_100']:.4f}"
        mark = "*" if r.get("extrapolated") else ""
        print(
            f"{r['data'][:13]:<14}{r['bits']:>4} {r['num_blocks']:>3} "
            f"{r['block_size']:>4}  {r['method'] + mark:<16}{qps}{rec:>12}"
            f"{r['bytes_per_item']:>12}"
        )
    print(
        "* NumPy: timed on a subset of single queries, extrapolated. "
        "cpu-qps: queries per CPU-second of this process (all threads)."
    )
