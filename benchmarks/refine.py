"""Ties ordered by the picture: codes only against codes refined by looks.

SuBiC's codes rank a database with `M` additions per item (paper Sec. 3.3);
`subic_keras.search.looks` orders the codes' best results by what the
pictures look like (near copies of the query first, then equal scores by
look). This measures, for a trained CIFAR-10 model (48 bits, `subic train
--dataset cifar10 --bits 48`):

1. *choice*, on the validation split of the training set (5,000 pictures,
   never trained on): which look, among the library's (`looks.look`,
   queries by their views `looks.query_look`), the same from the query's
   own look alone (one view), the soft block probabilities `b̃` (int8) and
   the backbone's feature (random projection to 64 dimensions, int8), with
   which near-copy threshold, shortlist and stand-out margin, finds the
   original of an altered copy most often (recall@1) without lowering the
   category mAP of the paper's protocol on that split;
2. *near duplicates*, on the test set: every one of the 10,000 test
   pictures is in the database; 1,000 of them, altered
   (`subic_keras.near_duplicates.alter`: crop of 60–90 % of the area, JPEG
   quality 30–70, brightness ±20 %, mirror, a random mix), are the queries;
   recall@1 and recall@10 of the original, codes only against refined with
   the library's defaults, and how often the codes alone hold it among
   their best 10 to 3,000 and in the tie groups of their top 10 (what
   ordering ties alone could find);
3. *categories*: the paper protocol's strict mAP (1,000 test queries, 100
   per class, against the other 9,000 test pictures; equal scores ranked
   pessimistically), codes only against refined (a strict order);
4. *cost*: search time on 1,000,000 trained-like codes (the model's codes of
   the 60,000 CIFAR-10 pictures, drawn with replacement: tie groups of
   hundreds) with their pictures' looks, refined against codes only, in
   batches of 1,000 queries and one query at a time, with the scanner
   "auto" picks and with each native kernel of this CPU forced (the
   refinement's dot products follow the kernel's CPU level:
   `native.dots_for`); bytes per item.

    python -m benchmarks.refine --model runs/cifar48/best.keras --data-dir data

Writes `benchmarks/results/refine.json` with the command, CPU and versions.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import keras
import numpy as np

from benchmarks import common
from subic_keras import datasets, evaluation, near_duplicates, protocols
from subic_keras.export import load_subic
from subic_keras.models import FC0
from subic_keras.search import SubicIndex, looks, native

RESULTS = os.path.join(os.path.dirname(__file__), "results", "refine.json")
NEAR_COPY_CHOICES = (0.95, 0.97, 2.0)  # 2.0: no near copies
SHORTLIST_CHOICES = (1000, 2000, 3000)
# The margin of the one candidate that stands out (2.0: no such rule).
STANDOUT_CHOICES = (0.02, 0.05, 2.0)
# How often the codes' best this many hold the original.
BEST_SIZES = (10, 100, 300, 1000, 2000, 3000)


def setting_key(name: str, near_copy, shortlist, standout) -> str:
    key = f"{name} near={near_copy} shortlist={shortlist}"
    return key if standout > 1 else f"{key} standout={standout}"


def current() -> tuple:
    """The library's settings."""
    return looks.NEAR_COPY, looks.SHORTLIST, looks.STANDOUT


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a 48-bit CIFAR-10 model")
    common.add_data_dir(parser, "cifar-10-batches-bin/")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--cost-items", type=int, default=1_000_000)
    parser.add_argument("--singles", type=int, default=100)
    parser.add_argument("--output", default=RESULTS)
    return parser.parse_args(argv)


# The library's look (`looks.look`, queries by their views), the same look
# from one view of the query (no crop or mirror assumed), the soft block
# probabilities and the backbone's feature (same description both sides).
CANDIDATES = ("look", "look_one_view", "block_probs", "backbone_64")


def descriptors(subic, pictures: np.ndarray, names=CANDIDATES, queries=False) -> dict:
    """The candidate looks `names` of `pictures` (module docstring), of
    items or, with `queries`, of queries."""
    model = subic.train_model
    make = {
        "look": lambda: (looks.query_look if queries else looks.look)(pictures),
        "look_one_view": lambda: (
            looks.query_look(pictures)[:, 0] if queries else looks.look(pictures)
        ),
        "block_probs": lambda: looks.int8_looks(
            model.predict(pictures, batch_size=500, verbose=0)["block_probs"]
        ),
        "backbone_64": lambda: looks.int8_looks(
            keras.Model(model.inputs, model.get_layer(FC0).input).predict(
                pictures, batch_size=500, verbose=0
            ),
            dims=64,
        ),
    }
    return {name: make[name]() for name in names}


def settings_of(name: str, settings: list) -> list:
    """The library's look is tried with every setting, the others with the
    library's (they were far behind with any)."""
    return settings if name == "look" else [current()]


def index_of(
    codes: np.ndarray, item_looks: np.ndarray | None, scanner: str = "auto"
) -> SubicIndex:
    size = 0 if item_looks is None else item_looks.shape[1]
    index = SubicIndex(8, 64, looks=size, scanner=scanner)
    index.add(codes, looks=item_looks)
    return index


def ranked_map(index, queries, query_looks, query_labels, database_labels) -> float:
    """Strict mAP of the index's ranking of the whole database (ids are
    database positions): codes only ranks equal scores pessimistically,
    refined is a strict order."""
    n = len(index)
    scores, ids = index.search(queries, n, looks=query_looks)
    if query_looks is None:
        matrix = np.empty_like(scores)
        np.put_along_axis(matrix, ids, scores, axis=1)
    else:  # the refined order, as scores without ties
        matrix = np.empty(scores.shape, np.float32)
        np.put_along_axis(matrix, ids, -np.arange(n, dtype=np.float32)[None], axis=1)
    return evaluation.mean_average_precision(matrix, query_labels, database_labels)


def near_duplicate_task(subic, pictures, candidates, count, seed, settings):
    """Recall of the originals of `count` altered pictures among `pictures`
    (the database), codes only and refined by each candidate and setting."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(pictures), count, replace=False))
    altered, applied = near_duplicates.alter(pictures[chosen], seed=seed)
    codes = subic.encode(pictures)
    queries = subic.query(altered)
    # The library's too, for the bounds below.
    query_candidates = descriptors(subic, altered, {*candidates, "look"}, queries=True)
    results = {}
    plain = index_of(codes, None)
    _, codes_only = plain.search(queries, 10)
    results["codes_only"] = near_duplicates.recall_at(codes_only, chosen)
    for name, item_looks in candidates.items():
        index = index_of(codes, item_looks)
        for setting in settings_of(name, settings):
            near_copy, shortlist, standout = setting
            with looks.settings(
                near_copy=near_copy, shortlist=shortlist, standout=standout
            ):
                _, ids = index.search(queries, 10, looks=query_candidates[name])
            key = setting_key(name, *setting)
            results[key] = near_duplicates.recall_at(ids, chosen)
            if setting == current():
                results[key]["by_alteration"] = by_alteration(ids, chosen, applied)
    results["codes_only"]["by_alteration"] = by_alteration(codes_only, chosen, applied)
    # What bounds the refined figure: the look alone over the whole
    # database, and how often the codes' shortlist holds the original.
    alone = looks.similarity(query_candidates["look"], looks.look(pictures))
    results["look_alone_whole_database"] = near_duplicates.recall_at(
        np.argsort(-alone, axis=1, kind="stable")[:, :10], chosen
    )
    scores, shortlisted = plain.search(queries, max(SHORTLIST_CHOICES))
    held = shortlisted == chosen[:, None]
    results["original_in_codes_shortlist"] = float(
        held[:, : looks.SHORTLIST].any(axis=1).mean()
    )
    results["original_in_codes_best"] = {
        str(size): float(held[:, :size].any(axis=1).mean()) for size in BEST_SIZES
    }
    # What ordering ties alone could find: the original's score reaches the
    # 10th (an altered copy's code moves away from its original's).
    reached = held & (scores >= scores[:, 9:10])
    results["original_in_tie_groups_of_the_top_10"] = float(reached.any(axis=1).mean())
    return results


def by_alteration(ids, originals, applied) -> dict:
    """recall@1 of the queries each alteration was applied to."""
    out = {}
    for name in near_duplicates.ALTERATIONS:
        rows = np.array([name in a for a in applied])
        out[name] = near_duplicates.recall_at(ids[rows], originals[rows], ks=(1,))
        out[name]["queries"] = int(rows.sum())
    return out


def category_task(subic, pictures, labels, candidates, settings):
    """The paper protocol's strict mAP on `pictures`, codes only and refined."""
    query_idx, database_idx = protocols.protocol_split("paper", labels, seed=0)
    codes = subic.encode(pictures[database_idx])
    queries = subic.query(pictures[query_idx])
    ql, dl = labels[query_idx], labels[database_idx]
    results = {"codes_only": ranked_map(index_of(codes, None), queries, None, ql, dl)}
    query_candidates = descriptors(
        subic, pictures[query_idx], list(candidates), queries=True
    )
    for name, item_looks in candidates.items():
        index = index_of(codes, item_looks[database_idx])
        for setting in settings_of(name, settings):
            near_copy, shortlist, standout = setting
            with looks.settings(
                near_copy=near_copy, shortlist=shortlist, standout=standout
            ):
                value = ranked_map(index, queries, query_candidates[name], ql, dl)
            results[setting_key(name, *setting)] = value
    return results


def choose(near: dict, categories: dict) -> str:
    """The setting with the best recall@1 among those whose category mAP is
    not below codes only's."""
    allowed = [
        key
        for key in categories
        if key != "codes_only" and categories[key] >= categories["codes_only"]
    ]
    return max(allowed, key=lambda key: (near[key]["recall@1"], categories[key]))


def timed(function, *args, repetitions: int = 3, **kwargs) -> float:
    """The best of `repetitions` timings of `function(*args, **kwargs)`."""
    best = np.inf
    for _ in range(repetitions):
        start = time.perf_counter()
        function(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best


def cost_task(subic, all_pictures, test_pictures, count, singles, seed=0):
    """Search time with and without refinement on `count` trained-like codes,
    with the scanner "auto" picks (the top-level figures) and with each
    native kernel this CPU runs, forced (`kernels`)."""
    rng = np.random.default_rng(seed)
    codes = subic.encode(all_pictures)
    all_looks = looks.look(all_pictures)
    drawn = rng.integers(0, len(codes), count)
    picked = rng.choice(len(test_pictures), 1000, replace=False)
    queries = subic.query(test_pictures[picked])
    query_looks = looks.query_look(test_pictures[picked])
    _, counts = np.unique(codes[drawn], axis=0, return_counts=True)
    plain = index_of(codes[drawn], None)
    scores, _ = plain.search(queries, looks.SHORTLIST)
    out: dict = {
        "items": count,
        # Those whose 10th result ties with the shortlist's last: their tie
        # group is ordered whole (up to looks.MAX_CANDIDATES).
        "queries_ordering_a_whole_tie_group": float(
            (scores[:, 9] == scores[:, -1]).mean()
        ),
        "distinct_codes": len(counts),
        "largest_tie_group": int(counts.max()),
        "median_tie_group_of_an_item": float(np.median(np.repeat(counts, counts))),
        "kernels": {},
    }
    natives = [f"native-{kernel}" for kernel in native.kernels()]
    for scanner in ["auto", *natives]:
        plain = index_of(codes[drawn], None, scanner)
        refined = index_of(codes[drawn], all_looks[drawn], scanner)
        start = time.perf_counter()
        refined.search(queries[:1], 10, looks=query_looks[:1])  # sorts the codes once
        entry = {
            "scanner": refined.scanner,
            "refinement_dots": native.dots_for(refined.scanner),
            "bytes_per_item": {"codes_only": plain.bytes_per_item,
                               "refined": refined.bytes_per_item},
            "first_refined_search_s": time.perf_counter() - start,
        }  # fmt: skip
        for k in (10, 100):
            batch_plain = timed(plain.search, queries, k)
            batch_refined = timed(refined.search, queries, k, looks=query_looks)
            single_plain, single_refined = [], []
            for i in range(singles):
                q, ql = queries[i : i + 1], query_looks[i : i + 1]
                single_plain.append(timed(plain.search, q, k, repetitions=1))
                single_refined.append(
                    timed(refined.search, q, k, looks=ql, repetitions=1)
                )
            entry[f"k={k}"] = {
                "batch_1000_s": {"codes_only": batch_plain, "refined": batch_refined},
                "batch_ratio": batch_refined / batch_plain,
                "single_p50_ms": {
                    "codes_only": 1000 * float(np.median(single_plain)),
                    "refined": 1000 * float(np.median(single_refined)),
                },
                "single_ratio": float(
                    np.median(single_refined) / np.median(single_plain)
                ),
            }
        common.log(
            f"cost with {refined.scanner}: batch {entry['k=10']['batch_ratio']:.1f}x, "
            f"single {entry['k=10']['single_ratio']:.1f}x"
        )
        if scanner == "auto":
            out.update(entry)
        else:
            out["kernels"][scanner] = entry
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    subic = load_subic(args.model)
    (x_train, y_train), (x_test, y_test) = datasets.load_cifar10(args.data_dir)
    _, validation = protocols.train_validation_split(y_train, 0.1, seed=0)
    x_val, y_val = x_train[validation], y_train[validation]
    settings = list(
        itertools.product(NEAR_COPY_CHOICES, SHORTLIST_CHOICES, STANDOUT_CHOICES)
    )

    common.log("choice on the validation split")
    candidates = descriptors(subic, x_val)
    near_val = near_duplicate_task(subic, x_val, candidates, args.queries, 1, settings)
    categories_val = category_task(subic, x_val, y_val, candidates, settings)
    chosen = choose(near_val, categories_val)
    default = setting_key("look", *current())
    common.log(f"chosen on validation: {chosen}; the library's default: {default}")

    common.log("near duplicates and categories on the test set")
    test_looks = {"look": looks.look(x_test)}
    defaults = [current()]
    near_test = near_duplicate_task(
        subic, x_test, test_looks, args.queries, 0, defaults
    )
    categories_test = category_task(subic, x_test, y_test, test_looks, defaults)

    common.log("cost on trained-like codes")
    cost = cost_task(
        subic,
        np.concatenate([x_train, x_test]),
        x_test,
        args.cost_items,
        args.singles,
    )
    result = {
        **common.run_metadata("refine", "numpy", "tensorflow", "keras"),
        "model": os.path.basename(args.model),
        "look": {"default": default, "bytes": looks.LOOK_SIZE},
        "validation": {
            "near_duplicates": near_val,
            "category_map": categories_val,
            "chosen": chosen,
            "default_is_chosen": chosen == default,
        },
        "test": {"near_duplicates": near_test, "category_map": categories_test},
        "cost": cost,
    }
    common.write_json(args.output, result)
    refined = near_test[default]
    print(
        f"near duplicates (test): recall@1 {near_test['codes_only']['recall@1']:.3f} "
        f"codes only, {refined['recall@1']:.3f} refined; recall@10 "
        f"{near_test['codes_only']['recall@10']:.3f} / {refined['recall@10']:.3f}"
    )
    print(
        "bounds: the look alone over the whole database, recall@1 "
        f"{near_test['look_alone_whole_database']['recall@1']:.3f}; the "
        f"original in the codes' best {looks.SHORTLIST}: "
        f"{near_test['original_in_codes_shortlist']:.3f}; in the tie groups of "
        f"their top 10: {near_test['original_in_tie_groups_of_the_top_10']:.3f}"
    )
    print(
        f"strict mAP (paper protocol, test): {categories_test['codes_only']:.4f} "
        f"codes only, {categories_test[default]:.4f} refined"
    )
    k10 = cost["k=10"]
    print(
        f"cost on {cost['items']:,} codes, k = 10: batch {k10['batch_ratio']:.2f}x, "
        f"single query {k10['single_ratio']:.2f}x; "
        f"{cost['bytes_per_item']['refined']} bytes per item refined, "
        f"{cost['bytes_per_item']['codes_only']} codes only"
    )
    for name, entry in cost["kernels"].items():
        print(
            f"  {name} forced: batch {entry['k=10']['batch_ratio']:.2f}x, single "
            f"query {entry['k=10']['single_ratio']:.2f}x"
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
