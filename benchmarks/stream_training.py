"""Memory and speed of training SuBiC from a folder of pictures, against arrays.

One SuBiC epoch of the default 32×32 model (the DSH CNN with the recipe's
standardisation, M = 8, K = 64: 48 bits; augmentation on; 10% held out
for validation) is trained, each case in its own process so that its peak
resident memory is its own:

- `folder_5000`, `folder_50000`: CIFAR-10 training pictures written as PNG
  files in class folders (`images.write_image_folder`) and read back with
  `datasets.image_folder`, streamed through `train_subic`;
- `arrays_50000`: the same 50,000 pictures as in-memory uint8 arrays;
- `folder_5000_mobilenet_v3_small_224`: the 5,000 files resized to
  224×224 for `--backbone mobilenet_v3_small` (its own preprocessing in the
  model), the speed to expect of an ImageNet network on a CPU.

Two epochs run (the first traces the graphs); the second epoch's training
steps are timed (validation excluded), as training pictures per second.
Peak RSS is the process's `ru_maxrss` at the end, folder check and
validation included.

    python -m benchmarks.stream_training --data-dir DIR [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "stream_training.json")
CASES = {
    "folder_5000": ("folder", 5_000),
    "folder_50000": ("folder", 50_000),
    "arrays_50000": ("arrays", 50_000),
    # What to expect of an ImageNet network on a CPU (random weights: the
    # speed is the same).
    "folder_5000_mobilenet_v3_small_224": ("folder", 5_000),
}


def _cifar(data_dir: str, count: int):
    from subic_keras.data import datasets

    (x, y), _ = datasets.load_images("cifar10", data_dir, None)
    return x[:count], y[:count]


def write_folders(data_dir: str, workdir: str) -> dict[int, str]:
    """The PNG folders of each size (written once, reused from `workdir`)."""
    from benchmarks.common import log
    from subic_keras.config import CLASS_NAMES
    from subic_keras.data.images import write_image_folder

    folders = {}
    for kind, count in CASES.values():
        if kind != "folder":
            continue
        root = os.path.join(workdir, f"cifar10-png-{count}")
        done = os.path.join(root, ".complete")
        if not os.path.exists(done):
            log(f"writing {count} PNG files to {root}")
            x, y = _cifar(data_dir, count)
            write_image_folder(x, y, root, CLASS_NAMES["cifar10"])
            open(done, "w").close()
        folders[count] = root
    return folders


def run_case(case: str, source: str, epochs: int) -> dict:
    """One case, in this process: trains and reports speed and peak memory."""
    import keras

    from benchmarks.train_overhead import EpochTimer
    from subic_keras.data import datasets
    from subic_keras.models import backbones
    from subic_keras.trainers.recipe import Recipe, train_subic
    from subic_keras.training import standardization

    kind, count = CASES[case]
    size = 224 if case.endswith("_224") else 32
    start = time.perf_counter()
    if kind == "folder":
        folder = datasets.image_folder(source, size, validation_split=0.1, seed=0)
        training, labels, validation = folder.training, None, folder.validation
        num_train = len(folder.training_paths)
    else:
        x, y = _cifar(source, count)
        fit_idx, val_idx = datasets.train_validation_split(y, 0.1, seed=0)
        training, labels = x[fit_idx], y[fit_idx]
        validation = (x[val_idx], y[val_idx])
        num_train = len(fit_idx)
    if size == 224:
        backbone = backbones.keras_application(
            "MobileNetV3Small", (size, size, 3), weights=None
        )
        preprocessing = keras.layers.Rescaling(255.0)
    else:
        backbone = backbones.dsh_cnn(input_shape=(size, size, 3))
        preprocessing = standardization(training)
    prepare_seconds = time.perf_counter() - start
    keras.utils.set_random_seed(0)
    timer = EpochTimer()
    train_subic(
        backbone,
        8,
        64,
        training,
        labels,
        validation,
        num_classes=10,
        recipe=Recipe(pretrain_epochs=0, epochs=epochs),
        preprocessing=preprocessing,
        callbacks=[timer],
    )
    steps = timer.epochs[-1]["steps"]
    return {
        "backbone": f"{backbone.name} at {size}x{size}",
        "num_train": num_train,
        "prepare_seconds": round(prepare_seconds, 2),
        "epoch_steps_seconds": round(steps, 2),
        "images_per_second": round(num_train / steps, 1),
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def main() -> None:
    from benchmarks.common import add_data_dir, log, run_metadata, write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(parser, "CIFAR-10")
    parser.add_argument(
        "--workdir",
        default=None,
        help="where the PNG folders are written and kept (default: a new "
        "temporary folder)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # a worker process
        print(json.dumps(run_case(args.case, args.source, args.epochs)))
        return
    workdir = args.workdir or tempfile.mkdtemp(prefix="stream-training-")
    folders = write_folders(args.data_dir, workdir)
    results = {}
    for case, (kind, count) in CASES.items():
        source = folders[count] if kind == "folder" else args.data_dir
        log(f"{case}: training {args.epochs} epochs")
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.stream_training", "--case", case]
            + ["--source", source, "--epochs", str(args.epochs)]
            + (["--data-dir", args.data_dir] if args.data_dir else []),
            check=True,
            capture_output=True,
            text=True,
            cwd=os.path.dirname(HERE),
        )
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])
        log(f"{case}: {results[case]}")
    ratios = {
        "rss_50000_over_5000": round(
            results["folder_50000"]["peak_rss_kb"]
            / results["folder_5000"]["peak_rss_kb"],
            3,
        ),
        "speed_folder_over_arrays": round(
            results["folder_50000"]["images_per_second"]
            / results["arrays_50000"]["images_per_second"],
            3,
        ),
    }
    for name, value in ratios.items():
        print(f"{name}: {value}")
    write_json(
        RESULTS,
        {
            **run_metadata("stream_training"),
            "model": "M=8, K=64 (48 bits), augmentation on; the DSH CNN with "
            "standardisation unless the case says otherwise",
            "epochs": args.epochs,
            "cases": results,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
