"""Training throughput of SuBiC against the same backbone with a plain classifier.

Both models use the DSH CIFAR-10 CNN, the same batches and the same optimizer,
in one process; the runs are interleaved in rounds so that machine load affects
both alike, and each model's best round is compared (load only ever slows a
round down, as with `timeit`); medians are recorded too. SuBiC is measured as
`build_subic` compiles it (both entropy terms and the five code metrics) and
with its losses only.

    python benchmarks/train_overhead.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from subic_keras import backbones, build_subic, datasets
from subic_keras._io import atomic_path

RESULTS = os.path.join(os.path.dirname(__file__), "results", "train_overhead.json")


class _StepTimer(keras.callbacks.Callback):
    """Wall time of the steps after `skip` warm-up steps."""

    def __init__(self, skip: int):
        super().__init__()
        self.skip, self.start, self.end = skip, None, None

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.skip - 1:
            self.start = time.perf_counter()
        self.end = time.perf_counter()


def plain_classifier(num_classes: int) -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    features = backbones.dsh_cnn()(inputs)
    outputs = keras.layers.Dense(num_classes, activation="softmax")(features)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return model


def subic_model(num_blocks: int, block_size: int, with_metrics: bool) -> keras.Model:
    subic = build_subic(backbones.dsh_cnn(), num_blocks, block_size, 10, optimizer=None)
    metrics = subic.metrics() if with_metrics else None
    return subic.compile(keras.optimizers.Adam(1e-3), metrics=metrics)


def measure(model: keras.Model, data, steps: int, skip: int) -> float:
    """Images per second over `steps - skip` steps of one `fit` call."""
    timer = _StepTimer(skip)
    model.fit(
        data,
        steps_per_epoch=steps,
        epochs=1,
        verbose=0,
        callbacks=[timer],
        shuffle=False,  # a tf.data.Dataset: Keras ignores the flag, with a warning
    )
    return (steps - skip) * data.element_spec[0].shape[0] / (timer.end - timer.start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data"))
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--steps", type=int, default=25, help="steps per measurement")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--num-blocks", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)

    (x, y), _ = datasets.load_cifar10(args.data_dir, max_per_split=args.images)
    mean, std = datasets.channel_statistics(x)
    data = datasets.make_dataset(
        x,
        y,
        args.batch_size,
        shuffle=True,
        mean=mean,
        std=std,
        drop_remainder=True,
        repeat=True,
    )
    keras.utils.set_random_seed(0)
    models = {
        "plain_softmax": plain_classifier(10),
        "subic": subic_model(args.num_blocks, args.block_size, with_metrics=True),
        "subic_losses_only": subic_model(args.num_blocks, args.block_size, False),
    }
    for model in models.values():  # trace and warm up every train step first
        measure(model, data, args.warmup_steps + 2, args.warmup_steps)
    rates = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            rates[name].append(measure(model, data, args.steps, args.warmup_steps))
            print(f"{name:>18}: {rates[name][-1]:8.1f} images/s", flush=True)
    median = {name: float(np.median(values)) for name, values in rates.items()}
    best = {name: float(np.max(values)) for name, values in rates.items()}
    overhead = {
        name: 1.0 - best[name] / best["plain_softmax"]
        for name in ("subic", "subic_losses_only")
    }
    result = {
        "command": " ".join(["python", *sys.argv]),
        "backbone": "dsh_cnn",
        "dataset": "cifar10",
        "batch_size": args.batch_size,
        "bits": args.num_blocks * int(np.log2(args.block_size)),
        "num_blocks": args.num_blocks,
        "block_size": args.block_size,
        "rounds": args.rounds,
        "steps_per_measurement": args.steps - args.warmup_steps,
        "images_per_second": rates,
        "median_images_per_second": median,
        "best_images_per_second": best,
        "overhead_vs_plain_softmax": overhead,
        "overhead_definition": "1 - best SuBiC rate / best plain rate",
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"best images/s: plain {best['plain_softmax']:.1f}, SuBiC "
        f"{best['subic']:.1f} (overhead {100 * overhead['subic']:.1f}%), "
        f"SuBiC losses only {best['subic_losses_only']:.1f} "
        f"(overhead {100 * overhead['subic_losses_only']:.1f}%)"
    )
    with atomic_path(args.output) as tmp:
        with open(tmp, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
