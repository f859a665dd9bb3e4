"""Leave one family out: does the instance code find copies altered otherwise
than it was trained on?

For each group of `subic_keras.instance.alterations.HELD_OUT` (rotation; crop with
aspect and border; noise with blur, rescale and JPEG; colour with
greyscale; overlay), an instance code is trained on copies altered by every
other family (`alterations.without`), and one more, the reference, on the
whole family, all at the same budget. Each searches for the originals of
1,000 CIFAR-10 test pictures altered by each held-out family alone and by
the held-out group mixed (two to four of its families where it has that
many), among CIFAR-10's 10,000 test pictures and among those with the
50,000 training pictures added (60,000), by FC0's outputs
(`InstanceSubic.query`) and the same scan as `benchmarks/near_duplicates.py`.

Reported: recall@1 and recall@10 of the code that never saw the family
beside the reference that did: their difference is what the family costs
when it is new. The models are cached under `--cache-dir`, beside
`near_duplicates`'s.

The reference alone, also on copies altered by the whole family, here of
a CNN twice as wide (`backbones.dsh_cnn(width=2)`):

    python -m benchmarks.held_out_families --epochs 4 --held-out --width 2

Example:

    python -m benchmarks.held_out_families --epochs 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import common
from benchmarks.near_duplicates import (
    DATABASES,
    code_arguments,
    database_indexes,
    trained,
)
from subic_keras.data import datasets
from subic_keras.instance import alterations, near_duplicates

REFERENCE = "none (reference)"
# Copies altered by two to four families of the whole family, as in
# `benchmarks/near_duplicates.py` (the reference is scored on them too).
WHOLE = "whole family"


def parse_args(argv=None) -> argparse.Namespace:
    # 64-bit codes (M = 16): the study's results were measured on them.
    parser = code_arguments(__doc__, epochs=4, num_blocks=16)
    parser.add_argument(
        "--held-out",
        nargs="*",
        default=list(alterations.HELD_OUT),
        choices=list(alterations.HELD_OUT),
        help="the groups held out in turn (default: all of them; none: the "
        "reference only)",
    )
    parser.add_argument(
        "--output",
        default="benchmarks/results/held_out_families.json",
        help="where the JSON goes (default: %(default)s)",
    )
    return parser.parse_args(argv)


def query_sets(pictures: np.ndarray, group: str, seed: int) -> dict[str, np.ndarray]:
    """Copies of `pictures` altered by each family of `group` alone, and by
    the group mixed where it has more than one family."""
    families = alterations.HELD_OUT[group]
    sets = {
        name: alterations.alter_batch(pictures, seed, families=[name], mixture=(1, 1))
        for name in families
    }
    if len(families) > 1:
        mixture = (2, min(len(families), alterations.MIXTURE[1]))
        sets[f"{group} group mixed"] = alterations.alter_batch(
            pictures, seed, families=families, mixture=mixture
        )
    return sets


def recalls(code, database: np.ndarray, sets: dict, chosen: np.ndarray) -> dict:
    """Recall@1 and @10 of `code` on each query set at each database size."""
    indexes = database_indexes(code, code.encode(database))
    out: dict = {}
    for name, queries in sets.items():
        queried = code.query(queries)
        for db_name, index in indexes.items():
            _, ids = index.search(queried, 10)
            out.setdefault(name, {})[db_name] = near_duplicates.recall_at(ids, chosen)
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    (x_train, _), (x_test, _) = datasets.load_cifar10(args.data_dir)
    pictures = x_train[: args.train_pictures]
    database = np.concatenate([x_test, x_train])
    rng = np.random.default_rng(args.seed)
    chosen = np.sort(rng.choice(len(x_test), args.queries, replace=False))
    sets = {
        group: query_sets(x_test[chosen], group, args.seed + 1)
        for group in alterations.HELD_OUT
    }
    every_set = {name: q for group in sets.values() for name, q in group.items()}
    every_set[WHOLE] = alterations.alter_batch(x_test[chosen], args.seed + 1)
    reference, reference_seconds = trained(args, pictures)
    reference_recalls = recalls(reference, database, every_set, chosen)
    results: dict = {}
    seconds: dict = {REFERENCE: reference_seconds}
    for group in args.held_out:
        families = alterations.without(group)
        common.log(f"held out: {group} (trained on {', '.join(families)})")
        code, seconds[group] = trained(args, pictures, families)
        found = recalls(code, database, sets[group], chosen)
        for name in sets[group]:
            row = {
                f"{who} {db_name}": value
                for db_name in DATABASES
                for who, value in (
                    ("held out", found[name][db_name]),
                    ("reference", reference_recalls[name][db_name]),
                )
            }
            results[name] = {"held out group": group, **row}
            common.log(
                f"{name}: "
                + "; ".join(f"{k} {v['recall@1']:.3f}" for k, v in row.items())
            )
    output = {
        **common.run_metadata("held_out_families", "tensorflow", "keras"),
        "settings": {
            "epochs": args.epochs,
            "train_pictures": len(pictures),
            "batch_size": args.batch_size,
            "queries": args.queries,
            "num_blocks": args.num_blocks,
            "block_size": args.block_size,
            "bits": reference.bits,
            "schedule": "cosine",
            "width": args.width,
            "held_out": {g: list(alterations.HELD_OUT[g]) for g in args.held_out},
        },
        "reference": reference_recalls,
        "train_seconds": {
            k: None if v is None else round(v, 1) for k, v in seconds.items()
        },
        "results": results,
        "elapsed_seconds": round(time.perf_counter() - start, 1),
    }
    common.write_json(args.output, output)
    common.log(f"wrote {args.output}")
    return output


if __name__ == "__main__":
    main()
