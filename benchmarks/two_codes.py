"""The answer of an index that keeps both codes, against its instance scan.

An `ImageIndex` made with `instance=` answers a query by both codes
(`subic_keras.search.instance_codes`): the instance code's exact scan for
the query's copies, the class code's exact scan, and the ordering of equal
class scores by instance score. This measures that whole answer
(`ImageIndex.search(..., instance_queries=...)`) against the instance scan
alone (`SubicIndex.search` of the instance codes) and the class scan alone,
on 1,000,000 synthetic pictures, in one process, interleaved, for batches
of 1, 100 and 1,000 queries (k = 10 and 100):

- class codes of `subic train`'s shape (12 blocks of 16, 48 bits;
  `--class-shape 8,64` for the earlier default), as a trained model gives
  them: each picture's code is one of 10 class prototypes with each block
  replaced by a random value with probability `--noise`, so that codes
  repeat (tie groups of thousands);
  class queries are `max(0, N(0, 1))` plus 3 on a prototype's blocks;
- instance codes of the shipped instance code's shape (64 blocks of 16,
  256 bits; `--instance-shape 32,16` for the 128 bits shipped before),
  uniform; instance queries `N(0, 1)`.

Example:

    python -m benchmarks.two_codes                # 1,000,000 pictures
    python -m benchmarks.two_codes --quick        # a few seconds
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from benchmarks import common
from subic_keras.config import TrainConfig
from subic_keras.search.image_index import ImageIndex

CLASS_SHAPE = (TrainConfig.num_blocks, TrainConfig.block_size)
INSTANCE_SHAPE = (64, 16)


def synthetic(
    n: int,
    noise: float,
    seed: int,
    shape: tuple[int, int] = CLASS_SHAPE,
    instance_shape: tuple[int, int] = INSTANCE_SHAPE,
) -> tuple[ImageIndex, np.ndarray]:
    """An index of `n` synthetic pictures with class codes of `shape` and
    instance codes of `instance_shape`, and the class prototypes."""
    rng = np.random.default_rng(seed)
    (m, k), (im, ik) = shape, instance_shape
    prototypes = rng.integers(0, k, (10, m))
    index = ImageIndex(m, k, "/pictures", instance=(im, ik))
    for start in range(0, n, 100_000):
        size = min(100_000, n - start)
        codes = prototypes[rng.integers(0, 10, size)]
        changed = rng.random(codes.shape) < noise
        codes[changed] = rng.integers(0, k, int(changed.sum()))
        paths = [f"p/{i}.jpg" for i in range(start, start + size)]
        index.add(codes, paths, instance_codes=rng.integers(0, ik, (size, im)))
    return index, prototypes


def queries(
    prototypes,
    count: int,
    seed: int,
    block_size: int,
    instance_shape: tuple[int, int] = INSTANCE_SHAPE,
) -> tuple[np.ndarray, np.ndarray]:
    """Class queries near a prototype each (of blocks of `block_size`), and
    instance queries of `instance_shape`."""
    rng = np.random.default_rng(seed)
    (m, k), (im, ik) = (prototypes.shape[1], block_size), instance_shape
    wanted = np.maximum(rng.normal(size=(count, m * k)), 0).astype(np.float32)
    chosen = prototypes[rng.integers(0, len(prototypes), count)]
    np.put_along_axis(wanted, chosen + np.arange(m) * k, 3.0, axis=1)
    return wanted, rng.normal(size=(count, im * ik)).astype(np.float32)


def rate(search, batch: int, total: int) -> float:
    """Queries per second of `search(rows)` over `total` queries in batches."""
    start = time.perf_counter()
    for first in range(0, total, batch):
        search(slice(first, first + batch))
    return total / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pictures", type=int, default=1_000_000)
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--scanners",
        default="auto",
        help="comma-separated scanners to force, both codes alike (default: the "
        "best this CPU runs); e.g. native-avx2,native-portable",
    )
    parser.add_argument(
        "--class-shape",
        default=",".join(map(str, CLASS_SHAPE)),
        help="the class codes' M,K (default: %(default)s, subic train's)",
    )
    parser.add_argument(
        "--instance-shape",
        default=",".join(map(str, INSTANCE_SHAPE)),
        help="the instance codes' M,K (default: %(default)s, the shipped code's)",
    )
    parser.add_argument("--quick", action="store_true", help="20,000 pictures")
    parser.add_argument("--output", default="benchmarks/results/two_codes.json")
    args = parser.parse_args(argv)
    n = 20_000 if args.quick else args.pictures
    shape = tuple(int(value) for value in args.class_shape.split(","))
    instance_shape = tuple(int(value) for value in args.instance_shape.split(","))
    built, prototypes = synthetic(n, args.noise, 0, shape, instance_shape)
    class_queries, instance_queries = queries(
        prototypes, 1000, 1, shape[1], instance_shape
    )
    distinct = len(np.unique(built.get_codes(), axis=0))
    common.log(f"{n} pictures, {distinct} distinct class codes")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "pictures.subic")
        built.save(path)
        rows = []
        for scanner in args.scanners.split(","):
            index = ImageIndex.load(path, scanner=scanner)
            rows += timings(index, class_queries, instance_queries, args.rounds)
    result = {
        **common.run_metadata("two_codes", "numpy", "faiss"),
        "settings": {
            "pictures": n,
            "class_shape": shape,
            "instance_shape": instance_shape,
            "noise": args.noise,
            "distinct_class_codes": distinct,
            "rounds": args.rounds,
        },
        "rows": rows,
    }
    common.write_json(args.output, result)
    return result


def timings(index, class_queries, instance_queries, rounds: int) -> list[dict]:
    """Queries per second of each search of `index`, interleaved, best of
    `rounds`."""
    scans = {
        "instance scan": lambda k: (
            lambda rows: index.instance.codes.search(instance_queries[rows], k)
        ),
        "class scan": lambda k: lambda rows: index.search(class_queries[rows], k),
        "whole answer": lambda k: (
            lambda rows: index.search(
                class_queries[rows], k, instance_queries=instance_queries[rows]
            )
        ),
    }
    rows = []
    for k in (10, 100):
        for batch, total in ((1, 100), (100, 1000), (1000, 1000)):
            best = dict.fromkeys(scans, 0.0)
            for _ in range(rounds):  # interleaved: the best of each
                for name, make in scans.items():
                    best[name] = max(best[name], rate(make(k), batch, total))
            row = {
                "scanner": index.scanner,
                "k": k,
                "batch": batch,
                "queries_per_second": best,
                "answer_over_instance_scan": best["instance scan"]
                / best["whole answer"],
            }
            rows.append(row)
            common.log(
                f"{index.scanner} k={k} batch={batch}: "
                + ", ".join(f"{name} {value:,.0f} q/s" for name, value in best.items())
                + f"; the whole answer takes {row['answer_over_instance_scan']:.2f}x "
                "the instance scan's time"
            )
    return rows


if __name__ == "__main__":
    main()
