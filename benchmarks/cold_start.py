"""Cold start: the first search after loading an index against a warm one.

A scanner lays the codes out for its kernel the first time it searches
(`subic_keras.search.native_scanner`): the items of equal codes are grouped
(`native.group_equal`, a hash table in C, linear in the items) and the
distinct codes written into tiles. This measures, for 5,000,000 codes of
trained-like repetition (M = 8, K = 64), saved to a `.subic` file, for
every native kernel this CPU runs (each forced):

- `load_s`: `subic_keras.search.open` (the file read and verified);
- `first_s`: the first search after it (one query, k = 10), layout
  included;
- `warm_s`: the best of 5 searches after that;
- the same for a batch of 1,000 queries;
- `group_s`: `group_equal` alone.

    python -m benchmarks.cold_start              # ~2 min on 2 cores

Writes `benchmarks/results/cold_start.json` with the command, CPU and
versions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from benchmarks import common
from benchmarks.filter_speed import trained_like_codes
from subic_keras.search import SubicIndex, native, scanners
from subic_keras.search import open as open_index

RESULTS = os.path.join(os.path.dirname(__file__), "results", "cold_start.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-items", type=int, default=5_000_000)
    parser.add_argument("--output", default=RESULTS)
    return parser.parse_args(argv)


def seconds(function, *args, **kwargs) -> float:
    start = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    rng = np.random.default_rng(0)
    codes = trained_like_codes(rng, args.num_items)
    single = np.maximum(rng.standard_normal((1, 512)), 0).astype(np.float32)
    batch = np.maximum(rng.standard_normal((1000, 512)), 0).astype(np.float32)
    kernels = [name for name in scanners.available(8, 64) if name.startswith("native")]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "codes.subic")
        index = SubicIndex(8, 64)
        index.add(codes)
        index.save(path)
        with index.contents() as (_, chunks, _ids):
            packed = np.concatenate(list(chunks))
        group_s = min(seconds(native.group_equal, packed) for _ in range(3))
        grouped = native.group_equal(packed)
        distinct = len(packed) if grouped is None else len(grouped[0])
        for kernel in kernels:
            entry = {}
            for name, queries in (("single", single), ("batch_1000", batch)):
                load = seconds(open_index, path, scanner=kernel)
                loaded = open_index(path, scanner=kernel)
                first = seconds(loaded.search, queries, 10)
                warm = min(seconds(loaded.search, queries, 10) for _ in range(5))
                entry[name] = {
                    "load_s": load,
                    "first_s": first,
                    "warm_s": warm,
                    "first_over_warm": first / warm,
                }
            results[kernel] = entry
            common.log(
                f"{kernel}: single first {entry['single']['first_s'] * 1000:.1f} ms, "
                f"warm {entry['single']['warm_s'] * 1000:.2f} ms; batch first "
                f"{entry['batch_1000']['first_s']:.3f} s, warm "
                f"{entry['batch_1000']['warm_s']:.3f} s"
            )
    result = {
        **common.run_metadata("cold_start", "numpy"),
        "items": args.num_items,
        "distinct_codes": distinct,
        "group_s": group_s,
        "kernels": results,
    }
    common.write_json(args.output, result)
    print(
        f"{args.num_items:,} codes ({distinct:,} distinct): grouped in "
        f"{group_s * 1000:.0f} ms"
    )
    for kernel, entry in results.items():
        print(
            f"{kernel}: first search {entry['single']['first_s'] * 1000:.1f} ms, warm "
            f"{entry['single']['warm_s'] * 1000:.2f} ms "
            f"({entry['single']['first_over_warm']:.1f}x); 1,000 queries first "
            f"{entry['batch_1000']['first_s']:.3f} s, warm "
            f"{entry['batch_1000']['warm_s']:.3f} s "
            f"({entry['batch_1000']['first_over_warm']:.2f}x)"
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
