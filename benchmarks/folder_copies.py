"""Copy marks that hold in a folder the code never saw: rules chosen on it.

Writes a folder of a dataset's test pictures as PNG files (Fashion-MNIST,
CIFAR-10 or scikit-learn's digits), with planted copies beside some of them
(exact copies, and altered ones: a JPEG of a doubled picture, a 2-pixel
crop, a brighter copy), then, through the library's own calls:

- `index_folder` with the shipped instance code, and `choose_copy_rules`:
  the copy rules chosen on the folder's own pictures, as
  `subic index build` chooses them (the line it prints is recorded);
- queries: altered copies (`alterations.alter_batch`, another seed than
  the rules') of indexed pictures not used by the planted copies, and of as
  many pictures of the dataset's training split (not indexed); the
  answers' copy marks (`copies.mark`, the folder's margin) against the
  truth: precision, and coverage (the share of altered copies of indexed
  pictures whose original is marked), and recall@1;
- the same marks with the rule the model chose on its training data, as
  indexes were marked before rules were chosen per folder;
- `duplicates` with no flags: planted exact and altered copies listed,
  and the share of wrong pairs.

Example:

    python -m benchmarks.folder_copies --dataset fashion_mnist --pictures 10000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from benchmarks import common
from subic_keras.data import datasets, images
from subic_keras.instance import alterations, copies, folder_rules
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_encoder


def planted_folder(pictures: np.ndarray, labels, root: str, count: int) -> set:
    """`pictures` as PNGs in class folders, with `count` exact and `count`
    altered copies beside the first `2 · count`; the planted pairs."""
    from PIL import Image, ImageEnhance

    paths = images.write_image_folder(pictures, labels, root)
    planted = set()
    for number in range(2 * count):
        source = paths[number]
        picture = Image.open(os.path.join(root, source)).convert("RGB")
        name = os.path.join(os.path.dirname(source), f"copy_{number:05d}")
        if number < count:  # exact: the same pixels in another file
            name += ".png"
        else:
            name += ".jpg"
            if number % 3 == 0:
                picture = picture.resize(
                    (2 * picture.width, 2 * picture.height), Image.BICUBIC
                )
            elif number % 3 == 1:
                picture = picture.crop((2, 2, picture.width - 2, picture.height - 2))
            else:
                picture = ImageEnhance.Brightness(picture).enhance(1.2)
        options = {"quality": 90} if name.endswith(".jpg") else {}
        picture.save(os.path.join(root, name), **options)
        planted.add((frozenset({source, name}), number < count))
    return planted


def marks(index, code, queries, truth, margin) -> dict:
    """The copy marks of the answers to `queries` (uint8 pictures) against
    `truth` (each query's original path, None: not indexed)."""
    k = 10
    instance = code.query(queries)
    answers = index.answer(instance, k)
    copies.mark(answers, instance, code.block_size, margin)
    marked = correct = covered = first = 0
    held = sum(path is not None for path in truth)
    for rows, path in zip(answers, truth):
        marked += sum(row["copy"] for row in rows)
        correct += sum(row["copy"] and row["path"] == path for row in rows)
        covered += any(row["copy"] and row["path"] == path for row in rows)
        first += bool(rows) and rows[0]["path"] == path
    return {
        "marked": marked,
        "precision": correct / marked if marked else None,
        "coverage": covered / max(1, held),
        "recall_at_1": first / max(1, held),
    }


def run(args) -> dict:
    loader = {
        "fashion_mnist": datasets.load_fashion_mnist,
        "cifar10": datasets.load_cifar10,
    }[args.dataset]
    (x_train, _), (x_test, y_test) = loader(args.data_dir)
    code = load_encoder("instance")
    shape = retrieval.input_shape(code)
    result: dict = {"dataset": args.dataset, "pictures": args.pictures}
    with tempfile.TemporaryDirectory() as root:
        common.log(f"writing {args.pictures} pictures and planted copies")
        planted = planted_folder(
            x_test[: args.pictures], y_test[: args.pictures], root, args.planted
        )
        started = time.perf_counter()
        index, _ = retrieval.index_folder(code, root)
        result["index_seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        rules = retrieval.choose_copy_rules(index, code)
        result["rules_seconds"] = time.perf_counter() - started
        assert rules is not None
        result["rules"] = rules
        result["rules_line"] = folder_rules.rules_line(rules)
        common.log(result["rules_line"])

        # Queries: indexed pictures past the planted ones, and pictures the
        # folder lacks, decoded as the index decodes them, then altered.
        paths = [f"{y}/{y}_{i:05d}.png" for i, y in enumerate(y_test[: args.pictures])]
        chosen = np.random.default_rng(7).choice(
            np.arange(2 * args.planted, args.pictures), args.queries, replace=False
        )
        wanted = [paths[i] for i in chosen]
        decoded = next(images.image_batches(root, wanted, shape, len(wanted)))
        outside = next(
            images.image_batches(
                *_as_folder(x_train[: args.queries], tempfile.mkdtemp()), shape,
                args.queries,
            )
        )  # fmt: skip
        pictures = np.concatenate([decoded.pixels, outside.pixels])
        queries = alterations.alter_batch(pictures, seed=1)
        truth = [*decoded.paths, *([None] * len(outside.paths))]
        result["folder_rule"] = marks(
            index, code, queries, truth, copies.copy_margin_for(index, code)
        )
        result["model_rule"] = marks(index, code, queries, truth, code.copy_margin)
        common.log(f"folder rule {result['folder_rule']}")
        common.log(f"model rule {result['model_rule']}")

        groups = index.duplicates()
        pairs = {frozenset({a, b}) for g in groups for a in g for b in g if a < b}
        exact = {pair for pair, same in planted if same}
        altered = {pair for pair, same in planted if not same}
        result["duplicates"] = {
            "groups": len(groups),
            "pairs": len(pairs),
            "exact_listed": len(pairs & exact) / len(exact),
            "altered_listed": len(pairs & altered) / len(altered),
            "wrong_share": len(pairs - exact - altered) / max(1, len(pairs)),
        }
        common.log(f"duplicates {result['duplicates']}")
    return result


def _as_folder(pictures: np.ndarray, root: str) -> tuple[str, list[str]]:
    paths = images.write_image_folder(pictures, np.zeros(len(pictures), int), root)
    return root, paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    common.add_data_dir(parser, "cifar-10-batches-bin/ and fashion-mnist/")
    parser.add_argument("--pictures", type=int, default=10_000)
    parser.add_argument("--planted", type=int, default=50)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    result = {
        **common.run_metadata("folder_copies", "tensorflow", "keras"),
        **run(args),
    }
    name = args.output or os.path.join(
        "benchmarks", "results", f"folder_copies_{args.dataset}.json"
    )
    common.write_json(name, result)


if __name__ == "__main__":
    main()
