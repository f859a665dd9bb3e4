"""Encoding speed of SuBiC's deployment formats: Keras, SavedModel, LiteRT.

Images per second at batch 1 and batch 256 for the Keras encoder
(`model.predict`, and a direct `model(x)` call), the TF Serving SavedModel
called in-process (`serving_default` on float images, `encode_images` on PNG
bytes), and the float32 and int8 LiteRT files; plus each artifact's size on
disk. Every encoder returns both the codes and the query `z`. Each
measurement repeats calls for at least `--seconds` after two warm-up calls.

    python -m benchmarks.encode_speed --model RUN/best.keras --data-dir DIR
    python -m benchmarks.encode_speed --quick   # an untrained model, seconds
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from benchmarks import common
from subic_keras.data import datasets
from subic_keras.serving.export import export_litert, export_saved_model, load_subic
from subic_keras.training import TrainConfig, build_model

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "encode_speed.json")
QUICK_RESULTS = os.path.join(HERE, "results", "encode_speed_quick.json")
BATCHES = (1, 256)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a SuBiC .keras model (default: an untrained 48-bit DSH-CNN SuBiC; "
        "speed does not depend on the weights)",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("SUBIC_DATA_DIR"),
        help="CIFAR-10 directory for the images and the int8 calibration "
        "(default: $SUBIC_DATA_DIR; random images when neither is given)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="per measurement")
    parser.add_argument(
        "--litert-threads",
        type=int,
        default=os.cpu_count(),
        help="LiteRT interpreter threads (default: all CPUs, as TensorFlow)",
    )
    parser.add_argument("--output", default=None, help="the JSON report")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="an untrained tiny model (M=2, K=16), batches 1 and 16, 0.05 s each",
    )
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (0.05 if args.quick else 2.0)
    args.output = args.output or (QUICK_RESULTS if args.quick else RESULTS)
    return args


def rate(call, images: np.ndarray, seconds: float) -> float:
    """Images per second of `call(images)`, repeated for `seconds`."""
    for _ in range(2):
        call(images)
    calls, start = 0, time.perf_counter()
    while True:
        call(images)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls * len(images) / elapsed


def litert_call(path: str, threads: int):
    """A LiteRT encoder; the input is resized on the first call only."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    runner = interpreter.get_signature_runner("serving_default")
    return lambda images: runner(images=images)


def directory_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    load_before = os.getloadavg()
    batches = (1, 16) if args.quick else BATCHES
    count = max(batches)
    if args.data_dir is not None:
        (x_train, _), (x_test, _) = datasets.load_cifar10(
            args.data_dir, max_per_split=max(count, 200)
        )
        source = "CIFAR-10 (first test images; first 200 training images calibrate)"
    else:
        rng = np.random.default_rng(0)
        x_train = rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8)
        x_test = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
        source = "random uint8 images (no data directory)"
    if args.model is None:
        keras.utils.set_random_seed(0)
        m, k = (2, 16) if args.quick else (8, 64)
        config = TrainConfig(dataset="cifar10", num_blocks=m, block_size=k)
        subic = build_model(config, x_train, num_classes=10)
    else:
        subic = load_subic(args.model)
    images = x_test[:count].astype(np.float32) / np.float32(255.0)
    pngs = np.array([tf.io.encode_png(image).numpy() for image in x_test[:count]])
    encoder = keras.Model(
        subic.train_model.inputs[0],
        {"codes": subic.encoder.outputs[0], "query": subic.query_encoder.outputs[0]},
    )

    with tempfile.TemporaryDirectory() as work:
        keras_path = os.path.join(work, "model.keras")
        subic.train_model.save(keras_path)
        saved = export_saved_model(subic, os.path.join(work, "serving"))
        lite = export_litert(subic, os.path.join(work, "subic.tflite"))
        lite8 = export_litert(
            subic,
            os.path.join(work, "subic_int8.tflite"),
            "int8",
            representative_images=x_train[:200],
        )
        sizes = {
            "keras_file": os.path.getsize(keras_path),
            "saved_model": directory_size(saved),
            "litert_float32": os.path.getsize(lite),
            "litert_int8": os.path.getsize(lite8),
        }
        served = tf.saved_model.load(saved)
        serve = served.signatures["serving_default"]
        encode_images = served.signatures["encode_images"]
        rows = []
        for batch in batches:
            x, data = images[:batch], pngs[:batch]
            calls = {
                "keras_predict": (
                    lambda v: encoder.predict(v, batch_size=256, verbose=0),
                    x,
                ),
                "keras_call": (lambda v: encoder(v, training=False), x),
                "saved_model": (lambda v: serve(images=tf.constant(v)), x),
                "saved_model_png_bytes": (
                    lambda v: encode_images(image_bytes=tf.constant(v)),
                    data,
                ),
                "litert_float32": (litert_call(lite, args.litert_threads), x),
                "litert_int8": (litert_call(lite8, args.litert_threads), x),
            }
            for name, (call, inputs) in calls.items():
                value = rate(call, inputs, args.seconds)
                rows.append(
                    {"method": name, "batch": batch, "images_per_second": value}
                )
                print(
                    f"{name:<24} batch {batch:>4}: {value:10.1f} images/s", flush=True
                )

    report = {
        "command": ["python", *sys.argv] if argv is None else ["python", *argv],
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "numpy": np.__version__,
            "ai_edge_litert": importlib.metadata.version("ai-edge-litert"),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "tensorflow_threads": "default (all CPUs)",
            "litert_threads": args.litert_threads,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "settings": {
            "model": args.model or "untrained (weights do not affect speed)",
            "num_blocks": subic.num_blocks,
            "block_size": subic.block_size,
            "input_shape": list(subic.train_model.inputs[0].shape[1:]),
            "images": source,
            "seconds_per_measurement": args.seconds,
            "batches": list(batches),
            "quick": args.quick,
        },
        "results": rows,
        "size_bytes": sizes,
        "elapsed_seconds": round(time.perf_counter() - started, 1),
    }
    for name, size in sizes.items():
        print(f"{name:<24} {size / 1024:10.1f} KiB")
    with common.atomic_output(args.output) as tmp, open(tmp, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
