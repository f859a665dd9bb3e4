"""Parity of SuBiC's exported encoders with Keras: SavedModel, float and int8 LiteRT.

On CIFAR-10 test images, compares the codes and queries `z` of the Keras
encoder with those of the TF Serving SavedModel (float images and PNG bytes),
the float32 LiteRT file and the int8 LiteRT file, and measures the retrieval
mAP of the int8 codes and queries against the float model's (asymmetric
search, `random` protocol: `--queries-per-class` queries per class, the other
images as the database; mAP over the full ranking, ties counted in
expectation).

An instance code (`--model instance`, the one that ships, or its `.keras`
file) has no classes: its `query` is FC0's outputs, and its search is measured as
copies found first (recall@1) of `--copies` test pictures altered by the
whole family (`subic_keras.instance.alterations`), among all `--num-images`
(default 10,000) test pictures.

    python -m benchmarks.export_parity --model RUN/best.keras --data-dir DIR
    python -m benchmarks.export_parity --model instance --data-dir DIR
    python -m benchmarks.export_parity --quick   # an untrained tiny model, seconds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from benchmarks import common
from subic_keras.data import datasets
from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.instance import alterations
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.pretrained import INSTANCE
from subic_keras.search import SubicIndex
from subic_keras.serving.export import (
    export_litert,
    export_saved_model,
    load_encoder,
    run_litert,
)
from subic_keras.training import TrainConfig, build_model

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "export_parity.json")
QUICK_RESULTS = os.path.join(HERE, "results", "export_parity_quick.json")
INSTANCE_RESULTS = os.path.join(HERE, "results", "export_parity_instance.json")
# A code block counts as a near-tie when the two competing entries of the
# Keras z differ by at most this much.
NEAR_TIE = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default=None, help="a trained SuBiC .keras model (CIFAR-10)"
    )
    common.add_data_dir(parser, "CIFAR-10's binary or python batches")
    parser.add_argument("--num-images", type=int, default=None, help="test images")
    parser.add_argument("--num-representative", type=int, default=None)
    parser.add_argument("--queries-per-class", type=int, default=None)
    parser.add_argument(
        "--copies", type=int, default=1000, help="an instance code's altered queries"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="the JSON report")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="untrained tiny model (M=2, K=16), 100 images: a smoke test",
    )
    args = parser.parse_args(argv)
    if args.model is None and not args.quick:
        parser.error("--model is required (or --quick)")
    args.instance = args.model == INSTANCE or _is_instance_file(args.model)
    defaults = (100, 50, 2) if args.quick else (1000, 200, 10)
    args.num_images = args.num_images or (10_000 if args.instance else defaults[0])
    args.num_representative = args.num_representative or defaults[1]
    args.queries_per_class = args.queries_per_class or defaults[2]
    results = INSTANCE_RESULTS if args.instance else RESULTS
    args.output = args.output or (QUICK_RESULTS if args.quick else results)
    return args


def _is_instance_file(model: str | None) -> bool:
    return model is not None and isinstance(load_encoder(model), InstanceSubic)


def block_parity(codes, z, ref_codes, ref_z, quantized: bool = False) -> dict:
    """How far codes and `z` are from the Keras reference."""
    equal = codes == ref_codes
    num_blocks = ref_codes.shape[1]
    blocks = ref_z.reshape(len(ref_z), num_blocks, -1)
    rows, cols = np.nonzero(~equal)
    # Gap, in the Keras z, between the entry Keras chose and the exported one.
    gaps = (
        blocks[rows, cols, ref_codes[rows, cols]]
        - blocks[rows, cols, codes[rows, cols]]
    )
    diff = np.abs(z - ref_z)
    row = {
        "block_agreement": float(equal.mean()),
        "images_with_all_blocks_equal": float(equal.all(axis=1).mean()),
        "mismatched_blocks": int((~equal).sum()),
        "mismatches_at_near_ties": int((gaps <= NEAR_TIE).sum()),
        "max_keras_gap_at_mismatch": float(gaps.max()) if gaps.size else 0.0,
        "max_abs_z_diff": float(diff.max()),
        # float32 rounds z to a relative 6e-8; a different summation order
        # moves large entries by several of their units in the last place.
        "max_abs_z_diff_over_max_abs_z": float(diff.max() / np.abs(ref_z).max()),
        "mean_abs_z_diff": float(diff.mean()),
        "relative_z_error": float(np.linalg.norm(z - ref_z) / np.linalg.norm(ref_z)),
        "max_abs_keras_z": float(np.abs(ref_z).max()),
    }
    if quantized:
        # The dequantised z takes the values scale * q: its spacing is the step.
        levels = np.unique(z)
        step = float(np.diff(levels).min())
        clip = float(levels.max())
        row.update(
            {
                "quantization_step": step,
                "mismatches_within_one_step": int((gaps <= step).sum()),
                "calibrated_z_max": clip,
                "z_entries_above_calibrated_max": float((ref_z > clip + step).mean()),
            }
        )
    return row


def saved_model_outputs(path: str, images: np.ndarray, batch: int = 256) -> dict:
    """Codes and z from the SavedModel, from float images and from PNG bytes."""
    served = tf.saved_model.load(path)
    floats = images.astype(np.float32) / np.float32(255.0)
    pngs = np.array([tf.io.encode_png(image).numpy() for image in images])
    out = {"float": [], "png": []}
    for start in range(0, len(images), batch):
        part = slice(start, start + batch)
        out["float"].append(
            served.signatures["serving_default"](images=tf.constant(floats[part]))
        )
        out["png"].append(
            served.signatures["encode_images"](image_bytes=tf.constant(pngs[part]))
        )
    return {
        kind: {
            name: np.concatenate([o[name].numpy() for o in outs])
            for name in ("codes", "query")
        }
        for kind, outs in out.items()
    }


def retrieval_map(query_z, database_codes, labels, split, num_blocks, block_size):
    queries, database = split
    scores = evaluation.asymmetric_scores(
        query_z[queries], database_codes[database], num_blocks, block_size
    )
    return evaluation.mean_average_precision(
        scores, labels[queries], labels[database], ties="expected"
    )


def copy_recall(queries, database_codes, num_blocks, block_size) -> float:
    """How often a copy's original (the item of its row) is found first."""
    index = SubicIndex(num_blocks, block_size)
    index.add(database_codes)
    _, found = index.search(queries, k=1)
    return float((found[:, 0] == np.arange(len(queries))).mean())


def quick_model(x_train: np.ndarray):
    """An untrained small SuBiC on CIFAR-shaped images (only for --quick)."""
    keras.utils.set_random_seed(0)
    config = TrainConfig(dataset="cifar10", num_blocks=2, block_size=16)
    return build_model(config, x_train, num_classes=10)


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    (x_train, _), (x_test, y_test) = datasets.load_cifar10(
        args.data_dir, max_per_split=max(args.num_images, args.num_representative)
    )
    x_test, y_test = x_test[: args.num_images], y_test[: args.num_images]
    representative = x_train[: args.num_representative]
    subic = quick_model(x_train) if args.model is None else load_encoder(args.model)
    m, k = subic.num_blocks, subic.block_size
    floats = x_test.astype(np.float32) / np.float32(255.0)
    ref_codes = subic.encode(floats)
    ref_z = subic.query(floats)

    with tempfile.TemporaryDirectory() as work:
        saved = export_saved_model(subic, os.path.join(work, "serving"))
        lite = export_litert(subic, os.path.join(work, "subic.tflite"))
        lite8 = export_litert(
            subic,
            os.path.join(work, "subic_int8.tflite"),
            "int8",
            representative_images=representative,
        )
        served = saved_model_outputs(saved, x_test)
        float_lite = run_litert(lite, x_test)
        int8_lite = run_litert(lite8, x_test)

        copy_queries = None
        if args.instance:
            copies = alterations.alter_batch(x_test[: args.copies], seed=args.seed)
            copy_queries = {
                "keras_float": subic.query(copies),
                "litert_float32": run_litert(lite, copies)["query"],
                "litert_int8": run_litert(lite8, copies)["query"],
            }

    split, maps = _retrieval_maps(
        args, y_test, ref_codes, ref_z, float_lite, int8_lite, copy_queries, m, k
    )
    results, targets = _parity(served, float_lite, int8_lite, ref_codes, ref_z)
    report = {
        "command": common.command("export_parity")
        if argv is None
        else " ".join(["python", "-m", "benchmarks.export_parity", *argv]),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "versions": _versions(),
        "machine": common.machine(),
        "settings": {
            "model": args.model or "untrained (--quick)",
            "model_summary": _summary_beside(args.model),
            "num_blocks": m,
            "block_size": k,
            "bits": int(m * np.log2(k)),
            "dataset": "cifar10 test set, first num_images images",
            "num_images": len(x_test),
            "num_representative": len(representative),
            "representative": "first num_representative CIFAR-10 training images",
            "protocol": (
                f"copies of the first {args.copies} test pictures altered by the "
                f"whole family (seed {args.seed}), searched among all {len(x_test)}"
                if split is None
                else f"random, {args.queries_per_class} queries per class (seed "
                f"{args.seed}): {len(split[0])} queries, {len(split[1])} database"
            ),
            "map": (
                "recall@1: the copy's original found first (asymmetric search, "
                "ties to the lowest id)"
                if split is None
                else "mAP over the full ranking, asymmetric scores, ties='expected'"
            ),
            "near_tie": f"Keras z gap <= {NEAR_TIE} between the two chosen entries",
            "quick": args.quick,
        },
        "results": results,
        "retrieval_map": maps,
        "targets": targets,
        "elapsed_seconds": round(time.perf_counter() - started, 1),
    }
    _print(report)
    with common.atomic_output(args.output) as tmp, open(tmp, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.output}")
    return report


def _retrieval_maps(
    args, y_test, ref_codes, ref_z, float_lite, int8_lite, copy_queries, m, k
) -> tuple:
    """`(split, maps)`: recall@1 of the copies (an instance code; split None)
    or mAP by the random protocol, for Keras and each LiteRT model."""
    if copy_queries is not None:
        maps = {
            name: copy_recall(queries, database, m, k)
            for name, queries, database in (
                ("keras_float", copy_queries["keras_float"], ref_codes),
                ("litert_float32", copy_queries["litert_float32"], float_lite["codes"]),
                ("litert_int8", copy_queries["litert_int8"], int8_lite["codes"]),
                ("int8_queries_float_database", copy_queries["litert_int8"], ref_codes),
            )
        }
        return None, maps
    split = evaluation.protocol_split(
        "random", y_test, seed=args.seed, queries_per_class=args.queries_per_class
    )
    maps = {
        "keras_float": retrieval_map(ref_z, ref_codes, y_test, split, m, k),
        "litert_float32": retrieval_map(
            float_lite["query"], float_lite["codes"], y_test, split, m, k
        ),
        "litert_int8": retrieval_map(
            int8_lite["query"], int8_lite["codes"], y_test, split, m, k
        ),
        "int8_queries_float_database": retrieval_map(
            int8_lite["query"], ref_codes, y_test, split, m, k
        ),
    }
    return split, maps


def _parity(served, float_lite, int8_lite, ref_codes, ref_z) -> tuple[dict, dict]:
    """Each export's agreement with Keras, and the targets it is held to."""
    results = {
        "saved_model_float_images": block_parity(
            served["float"]["codes"], served["float"]["query"], ref_codes, ref_z
        ),
        "saved_model_png_bytes": block_parity(
            served["png"]["codes"], served["png"]["query"], ref_codes, ref_z
        ),
        "litert_float32": block_parity(
            float_lite["codes"], float_lite["query"], ref_codes, ref_z
        ),
        "litert_int8": block_parity(
            int8_lite["codes"], int8_lite["query"], ref_codes, ref_z, quantized=True
        ),
    }
    saved, lite = results["saved_model_float_images"], results["litert_float32"]
    targets = {
        "saved_model block agreement >= 0.999": saved["block_agreement"] >= 0.999,
        "saved_model max |z diff| <= 1e-4": saved["max_abs_z_diff"] <= 1e-4,
        "litert_float32 block agreement >= 0.999": lite["block_agreement"] >= 0.999,
        "litert_float32 max |z diff| <= 1e-4": lite["max_abs_z_diff"] <= 1e-4,
    }
    # Both kinds' queries are FC0's outputs, which reach the hundreds.
    targets["litert_float32 max |z diff| / max |z| <= 1e-6"] = (
        lite["max_abs_z_diff_over_max_abs_z"] <= 1e-6
    )
    return results, targets


def _summary_beside(model: str | None):
    """The training summary `subic train` wrote beside the model, if any."""
    if model is None:
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(model)), "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        summary = json.load(handle)
    return {key: summary.get(key) for key in ("config", "best_epoch", "test")}


def _versions() -> dict:
    import importlib.metadata

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "ai_edge_litert": importlib.metadata.version("ai-edge-litert"),
    }


def _print(report: dict) -> None:
    print(
        f"{'artifact':<26}{'blocks equal':>14}{'near-tie':>10}{'max|dz|':>12}"
        f"{'/max|z|':>12}"
    )
    for name, row in report["results"].items():
        near = f"{row['mismatches_at_near_ties']}/{row['mismatched_blocks']}"
        print(
            f"{name:<26}{row['block_agreement']:>14.6f}{near:>10}"
            f"{row['max_abs_z_diff']:>12.2e}{row['max_abs_z_diff_over_max_abs_z']:>12.2e}"
        )
    measure = "recall@1" if report["settings"]["map"].startswith("recall") else "mAP"
    for name, value in report["retrieval_map"].items():
        print(f"{measure} {name:<30}{value:.4f}")
    for target, met in report["targets"].items():
        print(f"{target}: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
