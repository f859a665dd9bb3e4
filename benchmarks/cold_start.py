"""Cold start: the first search after loading an index against a warm one.

The native scan scores each distinct code once: it groups the items of
equal codes (`native.group_equal`, a hash table in C, after an estimate
from every code's hash of whether they repeat at all) and writes the
distinct codes into tiles for its kernel. An index file of format version
5 holds that grouping, checked and laid out on load; a file without it
(codes that hardly repeat, or version 4 and before) is grouped and laid
out on load too, so that the first search is a warm one either way. This
measures both files, for trained-like codes (M = 8, K = 64; `--codes
random`: uniform ones) and every native kernel this CPU runs (each
forced):

- `load_s`: `subic_keras.search.open` (the file read and verified, the
  grouping found or read, the layout, one warm-up search);
- `first_s`: the first search after it (one query, k = 10);
- `warm_s`: the best of 5 searches after that;
- the same for a batch of 1,000 queries;
- `group_s`: `group_equal` alone.

    python -m benchmarks.cold_start --num-items 10000000
    python -m benchmarks.cold_start --codes random --num-items 5000000

Writes `benchmarks/results/cold_start.json` (`cold_start_random.json`) with
the command, CPU and versions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from benchmarks import common
from benchmarks.filter_speed import trained_like_codes
from subic_keras.search import SubicIndex, file_format, native, scanners
from subic_keras.search import open as open_index

RESULTS = os.path.join(os.path.dirname(__file__), "results", "cold_start.json")
RANDOM_RESULTS = RESULTS.replace("cold_start.json", "cold_start_random.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-items", type=int, default=5_000_000)
    parser.add_argument("--codes", choices=("trained", "random"), default="trained")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    args.output = args.output or (RANDOM_RESULTS if args.codes == "random" else RESULTS)
    return args


def seconds(function, *args, **kwargs) -> float:
    start = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    rng = np.random.default_rng(0)
    if args.codes == "random":
        codes = rng.integers(0, 64, (args.num_items, 8))
    else:
        codes = trained_like_codes(rng, args.num_items)
    single = np.maximum(rng.standard_normal((1, 512)), 0).astype(np.float32)
    batch = np.maximum(rng.standard_normal((1000, 512)), 0).astype(np.float32)
    kernels = [name for name in scanners.available(8, 64) if name.startswith("native")]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        index = SubicIndex(8, 64)
        index.add(codes)
        paths = {
            "grouping_in_file": os.path.join(folder, "grouped.subic"),
            "no_grouping_in_file": os.path.join(folder, "plain.subic"),
        }
        index.save(paths["grouping_in_file"])
        with index.contents() as (header, chunks, ids):
            packed = np.concatenate(list(chunks))
            # What versions before 5 hold: the codes and ids alone.
            file_format.write(paths["no_grouping_in_file"], header, [packed], ids)
        group_s = min(seconds(native.group_equal, packed) for _ in range(3))
        grouped = native.group_equal(packed)
        distinct = len(packed) if grouped is None else len(grouped[0])
        for kernel in kernels:
            results[kernel] = {}
            for file_kind, path in paths.items():
                entry = results[kernel][file_kind] = {}
                for name, queries in (("single", single), ("batch_1000", batch)):
                    start = time.perf_counter()
                    loaded = open_index(path, scanner=kernel)
                    load = time.perf_counter() - start
                    first = seconds(loaded.search, queries, 10)
                    warm = min(seconds(loaded.search, queries, 10) for _ in range(5))
                    entry[name] = {
                        "load_s": load,
                        "first_s": first,
                        "warm_s": warm,
                        "first_over_warm": first / warm,
                    }
                    del loaded
                common.log(
                    f"{kernel}, {file_kind}: load "
                    f"{entry['single']['load_s']:.2f} s, single first "
                    f"{entry['single']['first_s'] * 1000:.2f} ms, warm "
                    f"{entry['single']['warm_s'] * 1000:.2f} ms; batch first "
                    f"{entry['batch_1000']['first_s']:.3f} s, warm "
                    f"{entry['batch_1000']['warm_s']:.3f} s"
                )
    result = {
        **common.run_metadata("cold_start", "numpy"),
        "first_over_warm_goal": 2.0,
        "items": args.num_items,
        "codes": args.codes,
        "distinct_codes": distinct,
        "group_s": group_s,
        "kernels": results,
    }
    common.write_json(args.output, result)
    print(
        f"{args.num_items:,} codes ({distinct:,} distinct): grouped in "
        f"{group_s * 1000:.0f} ms"
    )
    for kernel, kinds in results.items():
        for file_kind, entry in kinds.items():
            print(
                f"{kernel}, {file_kind}: load {entry['single']['load_s']:.2f} s, "
                f"first search {entry['single']['first_s'] * 1000:.2f} ms, warm "
                f"{entry['single']['warm_s'] * 1000:.2f} ms "
                f"({entry['single']['first_over_warm']:.1f}x); 1,000 queries "
                f"first {entry['batch_1000']['first_s']:.3f} s, warm "
                f"{entry['batch_1000']['warm_s']:.3f} s "
                f"({entry['batch_1000']['first_over_warm']:.2f}x)"
            )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
