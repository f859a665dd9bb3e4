"""Training speed of `subic train` against a plain classifier and a bare `fit`.

Three ways of training the DSH CIFAR-10 CNN, timed in one process and
interleaved in rounds so that machine load affects all alike:

- `subic_train`: the SuBiC stage of `subic_keras.training.train`, the code
  behind `subic train`, as it runs: its `tf.data` pipeline with
  augmentation, SuBiC's loss and five code metrics, the entropy warm-up,
  Keras validation, validation retrieval mAP with both queries, best-epoch
  selection and TensorBoard logs;
- `plain_classifier`: the pre-training stage of the same call: the same
  backbone, pipeline, validation and logs, with one softmax layer and
  cross-entropy;
- `bare_fit`: that classifier fitted on in-memory float tensors, with no
  augmentation, validation or callbacks.

Each round runs `train` for 2 + 2 epochs on `--images` CIFAR-10 training
images (10% held out for validation, as `subic train` does) and 2 bare
epochs; the second epoch of each is timed (the first traces the graphs).
The best round per kind is compared (load only slows a round down, as with
`timeit`). Rates count training images per second of the training steps;
seconds per CIFAR-10 epoch scale the measured step and validation times to
45,000 training and 5,000 validation images.

    python -m benchmarks.train_overhead --data-dir DIR
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from benchmarks.common import command, machine, write_json
from subic_keras.data import datasets
from subic_keras.models import backbones
from subic_keras.training import TrainConfig, standardization, train

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "train_overhead.json")
CIFAR_FIT, CIFAR_VALIDATION = 45_000, 5_000


class EpochTimer(keras.callbacks.Callback):
    """Per epoch: seconds of training steps and of the epoch-end work after
    them (validation and the callbacks listed before this one)."""

    def __init__(self):
        super().__init__()
        self.epochs: list[dict] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._steps_done = time.perf_counter()

    def on_test_begin(self, logs=None):
        if hasattr(self, "_start"):
            self._steps_done = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        if self._steps_done == self._start:  # no validation ran
            self._steps_done = end
        self.epochs.append(
            {
                "steps": self._steps_done - self._start,
                "epoch_end": end - self._steps_done,
            }
        )


def subic_train_round(args, workdir: str) -> dict:
    timer = EpochTimer()
    config = TrainConfig(
        dataset="cifar10",
        data_dir=args.data_dir,
        max_train_images=args.images,
        pretrain_epochs=2,
        epochs=2,
        output_dir=os.path.join(workdir, "run"),
        # A cold cache: the pre-training runs every round.
        cache_dir=tempfile.mkdtemp(dir=workdir),
    )
    summary = train(config, verbose=0, callbacks=[timer])
    keras.backend.clear_session()
    pretrain, subic = timer.epochs[1], timer.epochs[3]
    return {
        "num_fit": summary["num_train"],
        "num_validation": summary["num_validation"],
        "plain_classifier": pretrain,
        "subic_train": subic,
    }


def bare_fit_round(x: np.ndarray, y: np.ndarray, batch_size: int) -> dict:
    keras.utils.set_random_seed(0)
    inputs = keras.Input(x.shape[1:])
    features = backbones.dsh_cnn(input_shape=x.shape[1:])(standardization(x)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(features))
    model.compile(
        keras.optimizers.Adam(1e-3),
        "sparse_categorical_crossentropy",
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    timer = EpochTimer()
    model.fit(
        x.astype(np.float32) / 255,
        y,
        batch_size=batch_size,
        epochs=2,
        verbose=0,
        callbacks=[timer],
    )
    keras.backend.clear_session()
    return timer.epochs[1]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10's directory")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    batch_size = TrainConfig().batch_size

    (x, y), _ = datasets.load_cifar10(args.data_dir, max_per_split=args.images)
    fit_idx, _ = datasets.train_validation_split(y, 0.1, seed=0)
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for number in range(args.rounds):
            measured = subic_train_round(args, workdir)
            measured["bare_fit"] = bare_fit_round(x[fit_idx], y[fit_idx], batch_size)
            rounds.append(measured)
            print(
                f"round {number + 1}: "
                + ", ".join(
                    f"{kind} {measured['num_fit'] / measured[kind]['steps']:.0f} "
                    "images/s"
                    for kind in ("subic_train", "plain_classifier", "bare_fit")
                ),
                flush=True,
            )
    num_fit, num_val = rounds[0]["num_fit"], rounds[0]["num_validation"]
    kinds = ("subic_train", "plain_classifier", "bare_fit")
    rates = {kind: [num_fit / r[kind]["steps"] for r in rounds] for kind in kinds}
    best = {kind: max(values) for kind, values in rates.items()}
    epoch_seconds = {}
    for kind in kinds:
        fastest = min(rounds, key=lambda r, kind=kind: r[kind]["steps"])[kind]
        epoch_seconds[kind] = round(
            fastest["steps"] * CIFAR_FIT / num_fit
            + fastest["epoch_end"] * CIFAR_VALIDATION / num_val,
            1,
        )
    ratio = best["subic_train"] / best["plain_classifier"]
    result = {
        "command": command("train_overhead"),
        "backbone": "dsh_cnn",
        "dataset": "cifar10",
        "batch_size": batch_size,
        "bits": 48,
        "num_fit": num_fit,
        "num_validation": num_val,
        "rounds": rounds,
        "images_per_second": rates,
        "best_images_per_second": best,
        "seconds_per_cifar10_epoch": epoch_seconds,
        "subic_train_over_plain_classifier": ratio,
        "definitions": {
            "images_per_second": "training images / seconds of the training "
            "steps of one epoch (after a tracing epoch)",
            "seconds_per_cifar10_epoch": "the fastest round's step time scaled "
            "to 45,000 images plus its epoch-end time (validation, retrieval "
            "mAP, logs) scaled to 5,000 validation images",
        },
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "machine": machine(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"best images/s: subic train {best['subic_train']:.0f}, plain classifier "
        f"{best['plain_classifier']:.0f} (ratio {ratio:.3f}), bare fit "
        f"{best['bare_fit']:.0f}; seconds per CIFAR-10 epoch: "
        + ", ".join(f"{kind} {value}" for kind, value in epoch_seconds.items())
        + f" ({result['machine']['cpu']})"
    )
    write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
