"""An instance code on MobileNet v1 (ImageNet weights rebuilt from the LiteRT
extractor, `subic_keras.models.mobilenet`) fine-tuned on altered copies,
against the instance code that ships (the DSH CNN on 32 × 32 pictures).

Pictures are CIFAR-10's, decoded at `--size` (bilinear) before anything is
altered: the copies are made at that size, for both codes (the shipped code
reads them resized to its 32 × 32, `InstanceSubic.own_pictures`).

- training: the first `--train-pictures` training pictures (default 45,000),
  `train_instance` as the shipped code is trained (InfoNCE over the batch,
  SuBiC's entropies, cosine schedule), GeM pooling;
- validation (what a choice is made on): 1,000 copies of the last 5,000
  training pictures, never trained on, among those 5,000 and the 45,000;
- test: 1,000 copies of test pictures among the 10,000 test pictures and
  among all 60,000, as `benchmarks/near_duplicates.py`;
- a second dataset, never trained on: 1,000 copies of Fashion-MNIST test
  pictures (grey, as RGB) among its 10,000 test pictures and all 70,000.

Reported: recall@1 by alteration family, distinct codes, training time.

Example:

    python -m benchmarks.mobilenet_instance --epochs 12
"""

from __future__ import annotations

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from benchmarks import common
from benchmarks.near_duplicates import EXTRACTOR, cached, query_sets, train_and_cache
from subic_keras.data import datasets
from subic_keras.instance import instance_code as instance
from subic_keras.instance import near_duplicates
from subic_keras.models.mobilenet import mobilenet_v1_from_litert
from subic_keras.search import SubicIndex

VALIDATION = 5_000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_data_dir(parser, "CIFAR-10's cifar-10-batches-bin/ and mobilenet/")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=11)
    parser.add_argument("--train-pictures", type=int, default=45_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--cache-dir", default="benchmarks/cache/mobilenet_instance")
    parser.add_argument(
        "--output", default="benchmarks/results/mobilenet_instance.json"
    )
    return parser.parse_args(argv)


def resized(pictures: np.ndarray, size: int) -> np.ndarray:
    """uint8 pictures decoded at `size` × `size` (bilinear)."""
    parts = []
    for start in range(0, len(pictures), 5000):
        batch = tf.image.resize(
            tf.cast(pictures[start : start + 5000], tf.float32), (size, size)
        )
        parts.append(np.clip(np.round(batch.numpy()), 0, 255).astype(np.uint8))
    return np.concatenate(parts)


def trained(args, pictures: np.ndarray) -> tuple[instance.InstanceSubic, float | None]:
    settings = {
        k: getattr(args, k)
        for k in ("epochs", "size", "blocks", "batch_size", "learning_rate", "seed")
    }
    settings["train_pictures"] = len(pictures)
    path = os.path.join(
        args.cache_dir, common.settings_key("mobilenet", settings) + ".keras"
    )
    if os.path.isfile(path):
        return cached(path)
    backbone = mobilenet_v1_from_litert(
        os.path.join(args.data_dir, EXTRACTOR),
        (args.size, args.size, 3),
        blocks=args.blocks,
    )
    code = instance.build_instance_subic(
        backbone, optimizer=keras.optimizers.Adam(args.learning_rate)
    )
    return code, train_and_cache(code, pictures, path, args)


def recalls(code, database: np.ndarray, sets: dict, chosen, sizes: dict) -> dict:
    """recall@1 and @10 of each query set among the first `size` pictures."""
    if code.model.input_shape[1:] != database.shape[1:]:
        database = code.own_pictures(database)
    codes = code.encode(database)
    out: dict = {
        "distinct_codes": {
            name: len(np.unique(codes[:size], axis=0)) for name, size in sizes.items()
        }
    }
    for set_name, queries in sets.items():
        if code.model.input_shape[1:] != queries.shape[1:]:
            queries = code.own_pictures(queries)
        queried = code.query(queries)
        row = {}
        for name, size in sizes.items():
            index = SubicIndex(code.num_blocks, code.block_size)
            index.add(codes[:size])
            _, ids = index.search(queried, 10)
            row[name] = near_duplicates.recall_at(ids, chosen)
        out[set_name] = row
        common.log(
            f"  {set_name}: "
            + "; ".join(f"{k} {v['recall@1']:.3f}" for k, v in row.items())
        )
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    (x_train, _), (x_test, _) = datasets.load_cifar10(args.data_dir)
    x_train, x_test = resized(x_train, args.size), resized(x_test, args.size)
    train = x_train[: min(args.train_pictures, len(x_train) - VALIDATION)]
    code, seconds = trained(args, train)
    common.log(f"trained in {seconds} s")
    if args.train_only:
        return {}
    rng = np.random.default_rng(args.seed)
    held = x_train[-VALIDATION:]
    val_chosen = np.sort(rng.choice(VALIDATION, args.queries, replace=False))
    val_sets = query_sets(held[val_chosen], args.seed + 3)
    test_chosen = np.sort(rng.choice(len(x_test), args.queries, replace=False))
    test_sets = query_sets(x_test[test_chosen], args.seed + 1)
    (f_train, _), (f_test, _) = datasets.load_fashion_mnist(args.data_dir)
    f_train, f_test = (
        resized(np.repeat(x[..., None], 3, -1), args.size) for x in (f_train, f_test)
    )
    f_sets = query_sets(f_test[test_chosen], args.seed + 4)
    codes = {"mobilenet": code, "shipped": instance.pretrained()}
    # Each search: its name, database, query sets, originals and sizes.
    searches = [
        ("validation", np.concatenate([held, train]), val_sets, val_chosen,
         {"5k": VALIDATION, "50k": VALIDATION + len(train)}),
        ("test", np.concatenate([x_test, x_train]), test_sets, test_chosen,
         {"10k": 10_000, "60k": 60_000}),
        ("fashion", np.concatenate([f_test, f_train]), f_sets, test_chosen,
         {"10k": 10_000, "70k": 70_000}),
    ]  # fmt: skip
    results: dict = {}
    for name, each in codes.items():
        results[name] = {}
        for part, database, sets, chosen, sizes in searches:
            common.log(f"{name}: {part}")
            results[name][part] = recalls(each, database, sets, chosen, sizes)
    output = {
        **common.run_metadata("mobilenet_instance", "tensorflow", "keras"),
        "settings": {
            k: getattr(args, k)
            for k in ("epochs", "size", "blocks", "batch_size", "learning_rate")
        }
        | {"train_pictures": len(train), "queries": args.queries},
        "train_seconds": seconds,
        "results": results,
    }
    common.write_json(args.output, output)
    common.log(f"wrote {args.output}")
    return output


if __name__ == "__main__":
    main()
