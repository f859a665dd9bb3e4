"""Filtered search speed: filters inside the scan against search-then-filter.

`SubicIndex.search(queries, k, where=...)` passes the filter into the scan
(`subic_keras.search.scanners`): each native kernel skips the rows the
filter leaves out, or scans tiles gathered from the kept rows alone when
they are few; faiss's scanners scan the kept codes alone. This measures, on
1,000,000 codes (M = 8, K = 64: 48 bits) of trained-like repetition, with
ReLU queries and k = 100, in one run and one process:

- `unfiltered`: `search(q, k)`;
- `filtered`: `search(q, k, where=f"id < {share * n}")`, for filters
  keeping 100 %, 10 %, 1 % and 0.01 % of the items (ids are a random
  permutation of positions, so the kept items are scattered over the
  index); the filter is repeated, as a page's folder is, so its mask comes
  from the index's cache, and the time of evaluating it anew is reported
  apart (`filter_evaluation_ms`);
- `post_filter`: `search(q, k')` with `k' = k / share` (the `k` that keeps
  `k` results after filtering on average; at most every item), then the
  filter applied to the ids, as a user without filters would do;

for every scanner this CPU runs (each native kernel forced, faiss's), in
batches of 1,000 queries and one query at a time. Every filtered result is
checked against a float64 brute force over the kept items (ties included:
equal scores in insertion order for the native kernels, the same scores
for faiss's).

    python -m benchmarks.filter_speed            # ~10 min on 2 cores
    python -m benchmarks.filter_speed --quick    # a smaller run

Writes `benchmarks/results/filter_speed.json` with the command, CPU and
versions.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import common
from subic_keras.search import SubicIndex, filters, scanners
from subic_keras.search.items import IdColumns

RESULTS = os.path.join(os.path.dirname(__file__), "results", "filter_speed.json")
SHARES = (1.0, 0.1, 0.01, 0.0001)
K = 100
NUM_BLOCKS, BLOCK_SIZE = 8, 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-items", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="queries per batch")
    parser.add_argument("--singles", type=int, default=50, help="single queries")
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="100,000 codes, 1 rep")
    parser.add_argument("--output", default=RESULTS)
    return parser.parse_args(argv)


def trained_like_codes(rng, n: int) -> np.ndarray:
    """Codes that repeat as a trained model's do (a few distinct codes per
    hundred items, in clusters), in random order."""
    centres = rng.integers(0, BLOCK_SIZE, (max(1, n // 40), NUM_BLOCKS))
    codes = centres[rng.integers(0, len(centres), n)]
    # A fifth of the items move one block away from their centre.
    moved = rng.random(n) < 0.2
    blocks = rng.integers(0, NUM_BLOCKS, n)
    codes[moved, blocks[moved]] = rng.integers(0, BLOCK_SIZE, int(moved.sum()))
    return codes


def brute_force(codes, ids, queries, k):
    """Top `k` by float64 score, ties in insertion order."""
    columns = codes + np.arange(NUM_BLOCKS) * BLOCK_SIZE
    scores = queries.astype(np.float64)[:, columns].sum(axis=-1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def timed(search, queries, reps: int) -> float:
    """The best wall time of `reps` calls of `search(queries)`."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        search(queries)
        best = min(best, time.perf_counter() - start)
    return best


def single_latency(search, queries) -> float:
    """Median milliseconds of one query at a time."""
    times = []
    for query in queries:
        start = time.perf_counter()
        search(query[None])
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def post_filter(index, bound: int, k: int, share: float, n: int):
    """Search with a larger k, then filter the ids: the user's workaround."""
    wider = min(n, int(np.ceil(k / share)))

    def search(queries):
        scores, ids = index.search(queries, wider)
        keep = ids < bound
        return [(s[m][:k], i[m][:k]) for s, i, m in zip(scores, ids, keep)]

    return search, wider


def check(index, codes, ids, where, queries, exact_ties: bool) -> None:
    """The filtered search against a float64 brute force over the kept items."""
    kept = filters.parse(where).mask(IdColumns(ids))
    scores, found = index.search(queries, K, where=where)
    want_scores, want_ids = brute_force(codes[kept], ids[kept], queries, K)
    if exact_ties:  # the native scan: exact scores, ties in insertion order
        assert np.array_equal(scores, want_scores.astype(np.float32)), "scores"
        assert np.array_equal(found, want_ids), "ids differ"
    else:  # faiss sums in float32
        assert np.allclose(scores, want_scores, rtol=0, atol=1e-4), "scores"


def paired(first, second, queries, reps: int) -> tuple[float, float]:
    """Queries per second of two searches timed in alternation (ABBA), the
    best of `reps` each: both see the same state of a shared machine."""
    times: list[list[float]] = [[], []]
    for rep in range(reps):
        for i in (0, 1) if rep % 2 == 0 else (1, 0):
            search = (first, second)[i]
            start = time.perf_counter()
            search(queries)
            times[i].append(time.perf_counter() - start)
    return len(queries) / min(times[0]), len(queries) / min(times[1])


def measure(name, codes, ids, queries, bounds, args, reps) -> list[dict]:
    """Every filter on one scanner, against its unfiltered search."""
    n = len(codes)
    index = SubicIndex(NUM_BLOCKS, BLOCK_SIZE, name)
    index.add(codes, ids=ids)
    index.search(queries[:1], K)  # lays the codes out
    singles = queries[: args.singles]

    def unfiltered(q):
        return index.search(q, K)

    rows = []
    for share, bound in bounds.items():
        where = f"id < {bound}"
        check(index, codes, ids, where, queries[:20], name.startswith("native"))

        def filtered(q, where=where):
            return index.search(q, K, where=where)

        base_qps, qps = paired(unfiltered, filtered, queries, reps)
        base_single = single_latency(unfiltered, singles)
        single = single_latency(filtered, singles)
        after, wider = post_filter(index, bound, K, share, n)
        # k' results of each query are held at once: a batch that fits.
        post = queries[: max(1, min(len(queries) // 10, 10_000_000 // wider))]
        post_qps = len(post) / timed(after, post, reps)
        post_single = single_latency(after, singles)
        start = time.perf_counter()
        filters.parse(where).mask(IdColumns(ids))
        evaluation = 1000 * (time.perf_counter() - start)
        row = {
            "scanner": name,
            "share": share,
            "kept": bound,
            "unfiltered_qps": base_qps,
            "filtered_qps": qps,
            "post_filter_qps": post_qps,
            "post_filter_k": wider,
            "time_vs_unfiltered": base_qps / qps,
            "post_filter_time_vs_unfiltered": base_qps / post_qps,
            "unfiltered_single_ms": base_single,
            "filtered_single_ms": single,
            "post_filter_single_ms": post_single,
            "single_time_vs_unfiltered": single / base_single,
            "filter_evaluation_ms": evaluation,
            "exact": True,
        }
        rows.append(row)
        common.log(
            f"{name} {share:>7.2%}: {qps:>9,.0f} q/s against {base_qps:,.0f} "
            f"unfiltered ({row['time_vs_unfiltered']:.2f}x the time), single "
            f"{single:.2f} ms against {base_single:.2f}; search-then-filter "
            f"(k = {wider}) {post_qps:,.0f} q/s, single {post_single:.2f} ms"
        )
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    n = 100_000 if args.quick else args.num_items
    reps = 1 if args.quick else args.repetitions
    rng = np.random.default_rng(0)
    codes = trained_like_codes(rng, n)
    ids = rng.permutation(n).astype(np.int64)
    queries = np.maximum(rng.standard_normal((args.batch, NUM_BLOCKS * BLOCK_SIZE)), 0)
    queries = queries.astype(np.float32)
    # Each filter keeps the ids below a bound: that share of the items.
    bounds = {share: max(1, round(share * n)) for share in SHARES}
    rows = []
    for name in scanners.available(NUM_BLOCKS, BLOCK_SIZE):
        rows += measure(name, codes, ids, queries, bounds, args, reps)
    result = {
        **common.run_metadata("filter_speed", "numpy", "faiss"),
        "settings": {
            "num_items": n,
            "num_blocks": NUM_BLOCKS,
            "block_size": BLOCK_SIZE,
            "k": K,
            "batch": args.batch,
            "singles": args.singles,
            "repetitions": reps,
            "distinct_codes": len(np.unique(codes, axis=0)),
        },
        "rows": rows,
    }
    common.write_json(args.output, result)
    common.log(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
