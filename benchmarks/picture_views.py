"""Database-side and query-side views with the instance code that ships.

A 32 × 32 code sees a crop at another offset as another picture. Two ways
to meet crops without training (`subic_keras.instance.picture_views`):

- database-side views: each database picture indexed with crops of itself
  (1 view: the picture alone; 2: and its centre crop keeping 0.8 of each
  side; 6: and its four corner crops of 0.8), answers by picture;
- query-side views: each query searched as it is (1) and with its centre
  crop (2), each picture's best copy margin kept;
- gated: the picture and its 5 crops, a crop's margin lowered by a gate
  chosen on 2,000 altered copies of the database's own pictures (not the
  queries' originals; no labels), `picture_views.choose_gate`.

Queries and databases as `benchmarks/near_duplicates.py`: 1,000 altered
copies of CIFAR-10 test pictures among the 10,000 test pictures and all
60,000; and, never trained on, 1,000 copies of Fashion-MNIST test pictures
(grey, as RGB, resized to 32 × 32) among its 10,000 and all 70,000.
Reported: recall@1 and @10 by alteration family, and the search time per
query at the largest size (one thread's scan, answers merged by picture).

Example:

    python -m benchmarks.picture_views
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import common
from benchmarks.mobilenet_instance import resized
from benchmarks.near_duplicates import query_sets
from subic_keras.data import datasets
from subic_keras.instance import alterations, near_duplicates, picture_views
from subic_keras.instance import instance_code as instance
from subic_keras.search import SubicIndex
from subic_keras.search.copy_rules import copy_margins

DATABASE_VIEWS = (1, 2, 6)
QUERY_VIEWS = (1, 2)
K = 10
GATE_COPIES = 2000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_data_dir(parser, "CIFAR-10's cifar-10-batches-bin/ and fashion-mnist/")
    parser.add_argument("--model", default=None, help="an instance code (.keras)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="database cap")
    parser.add_argument("--output", default="benchmarks/results/picture_views.json")
    return parser.parse_args(argv)


def view_search(code, indexes, views: int, sets: dict, chosen, query_views) -> dict:
    """recall@1 and @10 of each query set, for each database size and each
    number of query views, against `indexes[name]` (codes of `views` views
    of each picture, picture `i`'s at ids `i * views` onwards)."""
    boxes = picture_views.crop_boxes()
    out: dict = {}
    for set_name, queries in sets.items():
        every = picture_views.picture_views(queries, boxes[: max(query_views)])
        queried = code.query(every).reshape(len(queries), max(query_views), -1)
        row = {}
        for name, index in indexes.items():
            for used in query_views:
                key = f"{name}, {used} query view{'s' * (used > 1)}"
                ids, seconds = _answers(code, index, queried[:, :used], views)
                row[key] = near_duplicates.recall_at(ids, chosen)
                row[key]["ms_per_query"] = round(1e3 * seconds / len(queries), 3)
        out[set_name] = row
    return out


def _answers(code, index, queried, views: int):
    """The `K` best pictures of each query (`(n, V, M·K)` views), by their
    best copy margin over the query's views and the pictures' views."""
    start = time.perf_counter()
    n, used = queried.shape[:2]
    flat = queried.reshape(n * used, -1)
    scores, ids = index.search(flat, min(K * views, len(index)))
    margins = copy_margins(flat, scores, code.block_size)
    owners = np.where(ids >= 0, ids // views, -1)
    _, found = picture_views.by_picture(
        margins.reshape(n, -1), owners.reshape(n, -1), K
    )
    return found, time.perf_counter() - start


def run_database(code, database, sets, chosen, sizes) -> dict:
    """Every database-view count on one database (its views encoded once)."""
    if code.model.input_shape[1:] != database.shape[1:]:
        database = code.own_pictures(database)
    sets = {
        name: code.own_pictures(queries)
        if code.model.input_shape[1:] != queries.shape[1:]
        else queries
        for name, queries in sets.items()
    }
    codes = picture_views.encode_views(code, database[: max(sizes.values())])
    results: dict = {}
    for views in DATABASE_VIEWS:
        indexes = {}
        for name, size in sizes.items():
            indexes[name] = SubicIndex(code.num_blocks, code.block_size)
            indexes[name].add(codes[:size, :views].reshape(-1, code.num_blocks))
        results[f"{views} database views"] = view_search(
            code, indexes, views, sets, chosen, QUERY_VIEWS
        )
        for set_name in ("whole family", "crop"):
            common.log(
                f"  {views} views, {set_name}: "
                + "; ".join(
                    f"{k} {v['recall@1']:.3f}"
                    for k, v in results[f"{views} database views"][set_name].items()
                )
            )
    results["gated"] = gated_search(code, database, codes, sets, chosen, sizes)
    return results


def gated_search(code, database, codes, sets, chosen, sizes) -> dict:
    """recall@1 and @10 with the pictures and their crops searched apart
    (`picture_views.ViewIndex`), under the gate each database size chooses
    on its own pictures."""
    out: dict = {"gates": {}}
    rng = np.random.default_rng(7)
    for name, size in sizes.items():
        index = picture_views.ViewIndex(code.num_blocks, code.block_size)
        index.add(codes[:size])
        others = np.setdiff1d(np.arange(size), chosen)
        drawn = np.sort(rng.choice(others, min(GATE_COPIES, len(others)), False))
        copies = alterations.alter_batch(database[drawn], seed=11)
        gate = index.choose_gate(code.query(copies), drawn)
        out["gates"][name] = {"gate": gate, "recall@1 of own copies": index.gates_tried}
        common.log(f"  gate at {name}: {gate}")
        for set_name, queries in sets.items():
            start = time.perf_counter()
            _, ids = index.search(code.query(queries), K)
            seconds = time.perf_counter() - start
            row = out.setdefault(set_name, {})
            row[name] = near_duplicates.recall_at(ids, chosen)
            row[name]["ms_per_query"] = round(1e3 * seconds / len(queries), 3)
    for set_name in ("whole family", "crop"):
        common.log(
            f"  gated, {set_name}: "
            + "; ".join(f"{k} {v['recall@1']:.3f}" for k, v in out[set_name].items())
        )
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    code = (
        instance.pretrained()
        if args.model is None
        else instance.InstanceSubic.load(args.model)
    )
    code.show_progress = False
    (x_train, _), (x_test, _) = datasets.load_cifar10(args.data_dir)
    (f_train, _), (f_test, _) = datasets.load_fashion_mnist(args.data_dir)
    f_train, f_test = (
        resized(np.repeat(x[..., None], 3, -1), 32) for x in (f_train, f_test)
    )
    rng = np.random.default_rng(args.seed)
    chosen = np.sort(rng.choice(len(x_test), args.queries, replace=False))
    cap = args.limit or 10**9
    searches = {
        "cifar10": (np.concatenate([x_test, x_train]), x_test, args.seed + 1,
                    {"10k": min(cap, 10_000), "60k": min(cap, 60_000)}),
        "fashion_mnist": (np.concatenate([f_test, f_train]), f_test, args.seed + 4,
                          {"10k": min(cap, 10_000), "70k": min(cap, 70_000)}),
    }  # fmt: skip
    results = {}
    for name, (database, tests, seed, sizes) in searches.items():
        common.log(f"{name}")
        sets = query_sets(tests[chosen], seed)
        results[name] = run_database(code, database, sets, chosen, sizes)
    output = {
        **common.run_metadata("picture_views", "tensorflow", "keras"),
        "settings": {
            "queries": args.queries,
            "view_side": picture_views.VIEW_SIDE,
            "database_views": DATABASE_VIEWS,
            "query_views": QUERY_VIEWS,
            "model": args.model or "instance (shipped)",
        },
        "results": results,
    }
    common.write_json(args.output, output)
    common.log(f"wrote {args.output}")
    return output


if __name__ == "__main__":
    main()
