"""`subic train --images DIR` at its defaults on a folder of mixed photos.

A folder of 626 pictures as a user's might be, written once into
`--workdir`: 400 CIFAR-10 training PNGs (40 in each of its 10 class
folders), and three folders of large pictures made from smooth random
fields with sensor noise, each a class of its own:

- `photos`: 100 JPEGs of 1600 × 1200, Fashion-MNIST pictures enlarged;
- `samples`: 27 PNGs of 512 × 512;
- `wallpapers`: 14 WebP of 4096 × 4096, 35 JPEGs of 3840 × 2160, 30 RGBA
  PNGs of 1920 × 1080 (alpha ramps) and 20 PNGs of 2560 × 1440.

Then `subic train --images DIR --output-dir RUN` (every other option at
its default) and `subic evaluate RUN/best.keras --images DIR`; the wall
time of each, the validation accuracy and the folder's mAP are recorded.

    python -m benchmarks.photo_folder --data-dir DATA [--workdir DIR]
        [--pretrain-epochs P] [--label NAME]

`--pretrain-epochs` (not a default then) times a shorter run, as the
per-epoch cost of an older release was measured.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import add_data_dir, log, run_metadata, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "photo_folder.json")
LARGE = {  # class folder: [(count, (width, height), format, mode)]
    "photos": [(100, (1600, 1200), "JPEG", "RGB")],
    "samples": [(27, (512, 512), "PNG", "RGB")],
    "wallpapers": [
        (14, (4096, 4096), "WEBP", "RGB"),
        (35, (3840, 2160), "JPEG", "RGB"),
        (30, (1920, 1080), "PNG", "RGBA"),
        (20, (2560, 1440), "PNG", "RGB"),
    ],
}


def _large_picture(rng, size, mode, base=None):
    """A smooth random field (or `base` enlarged) with sensor noise."""
    from PIL import Image

    width, height = size
    if base is None:
        base = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    picture = Image.fromarray(base).convert("RGB").resize(size, Image.BICUBIC)
    noise = rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    pixels = np.clip(np.asarray(picture, np.float32) + noise, 0, 255)
    picture = Image.fromarray(pixels.astype(np.uint8))
    if mode == "RGBA":
        ramp = np.linspace(96, 255, width, dtype=np.float32)
        alpha = np.broadcast_to(ramp, (height, width)).astype(np.uint8)
        picture.putalpha(Image.fromarray(alpha))
    return picture


def write_photo_folder(data_dir: str, workdir: str) -> str:
    """The benchmark's folder (written once, reused from `workdir`)."""
    from subic_keras.config import CLASS_NAMES
    from subic_keras.data import datasets

    root = os.path.join(workdir, "photos-626")
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    log(f"writing 626 pictures to {root}")
    (x, y), _ = datasets.load_images("cifar10", data_dir, None)
    rng = np.random.default_rng(0)
    from PIL import Image

    for label, name in enumerate(CLASS_NAMES["cifar10"]):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i, position in enumerate(np.flatnonzero(y == label)[:40]):
            Image.fromarray(x[position]).save(os.path.join(root, name, f"{i:03d}.png"))
    (clothes, _), _ = datasets.load_images("fashion_mnist", data_dir, None)
    for name, parts in LARGE.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        count = 0
        for number, size, kind, mode in parts:
            for _ in range(number):
                base = None
                if name == "photos":
                    base = np.repeat(clothes[count], 3, axis=-1)
                picture = _large_picture(rng, size, mode, base)
                suffix = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[kind]
                buffer = io.BytesIO()
                picture.save(buffer, kind, **({"quality": 85} if kind != "PNG" else {}))
                path = os.path.join(root, name, f"{count:03d}.{suffix}")
                with open(path, "wb") as handle:
                    handle.write(buffer.getvalue())
                count += 1
    open(done, "w").close()
    return root


def _subic(*args: str, log_path: str) -> float:
    """Runs `subic ARGS`, its output to `log_path`; the wall seconds."""
    print("$ subic " + " ".join(args), flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as handle:
        subprocess.run(
            [sys.executable, "-m", "subic_keras.cli", *args],
            check=True,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(parser, "CIFAR-10 (binary) and Fashion-MNIST (IDX)")
    parser.add_argument("--workdir", default="/tmp/subic-photo-folder")
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--label", default="defaults")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    folder = write_photo_folder(args.data_dir, args.workdir)
    run_dir = os.path.join(args.workdir, f"run-{args.label}")
    budget = []
    if args.pretrain_epochs is not None:
        budget = ["--pretrain-epochs", str(args.pretrain_epochs)]
    train = os.path.join(args.workdir, f"train-{args.label}.log")
    train_seconds = _subic(
        "train",
        "--images",
        folder,
        *budget,
        "--output-dir",
        run_dir,
        "--overwrite",
        log_path=train,
    )
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    evaluation = os.path.join(run_dir, "eval.json")
    evaluate_seconds = _subic(
        "evaluate",
        os.path.join(run_dir, "best.keras"),
        "--images",
        folder,
        "--output",
        evaluation,
        log_path=os.path.join(args.workdir, f"evaluate-{args.label}.log"),
    )
    with open(evaluation) as handle:
        scored = json.load(handle)
    with open(train) as handle:
        lines = handle.read().splitlines()
    pretraining = summary.get("pretrain") or {}
    result = {
        **run_metadata("photo_folder", "tensorflow", "keras", "PIL"),
        "label": args.label,
        "pictures": 626,
        "pretrain_epochs": summary["recipe"]["pretrain_epochs"],
        "epochs": summary["recipe"]["epochs"],
        "train_seconds": round(train_seconds, 1),
        "evaluate_seconds": round(evaluate_seconds, 1),
        "validation_accuracy": pretraining.get("best_validation_accuracy"),
        "validation_map": summary.get("validation_map"),
        "map": scored["map"],
        "skipped_files": len(summary["skipped_files"]),
        "longest_output_line": max(map(len, lines), default=0),
        "train_output_tail": lines[-8:],
    }
    log(
        f"{args.label}: trained in {result['train_seconds']} s "
        f"({result['pretrain_epochs']} pre-training epochs), "
        f"validation accuracy {result['validation_accuracy']}, "
        f"mAP {result['map']:.3f}, "
        f"{result['skipped_files']} files skipped"
    )
    previous = {}
    if os.path.exists(args.output):
        with open(args.output) as handle:
            previous = json.load(handle)
    previous[args.label] = result
    write_json(args.output, previous)
    return result


if __name__ == "__main__":
    main()
