"""CIFAR-10 category retrieval (the paper's Table 2): SuBiC against DSH and DLBHC.

Every method is the DSH CIFAR-10 CNN (`backbones.dsh_cnn`) trained from
scratch with the same input standardisation (a `Normalization` layer with the
fitting images' channel statistics), the same augmentation (random flip and
shift of up to 4 pixels), batch size, Adam schedule (×0.1 after 75% of the
steps) and epoch budget; only the head and the loss differ:

- `subic`: K = 64, M = bits / 6 (12-48 bits: M = 2, 4, 6, 8), searched
  asymmetrically through `SubicIndex` (`retrieval.protocol_scores`);
- `subic16`: K = 16, M = bits / 4 (M = 3, 6, 9, 12), faiss's fast-scan path;
- `dsh`: DSH's pairwise loss over all pairs of a batch, codes `sign(u)`;
- `dlbhc`: a sigmoid latent layer before the classifier, codes `> 0.5`;
  DSH and DLBHC are searched by Hamming distance.

Each SuBiC model is scored twice on the same index: with the paper's query
`z*` (rows `subic`, `subic16`) and with the class-posterior query `W₁ s*`
(`Subic.query(kind="class_posterior")`, rows `subic_cq`, `subic16_cq`);
both are also scored on the validation split. Epochs and hyper-parameters
are selected with the paper's query. Entries cached before the second query
existed are scored from their saved model on the next run that meets them.

Two-stage training (`--pretrain-epochs P`, used for the current table): the
CNN is first trained for P epochs as a plain softmax classifier on the same
fitting images (once per seed, cached), and every method then starts its
CNN from those weights and trains for `--epochs`. The CNN is still trained
from scratch on CIFAR-10 only; the stage buys accuracy per CPU-minute, which
bounds every method's mAP. With `P = 0` every model starts from random
weights.

Model selection never sees the test set: 10% of the training images
(stratified, seed 0) are held out, and after every epoch the model is scored
by retrieval mAP on them (one tenth of the validation images as queries, the
rest as database); the epoch with the best validation mAP is kept. SuBiC's
hyper-parameters are the best setting of a small validation sweep at one
bit-rate (`--sweep`, cached like the models) where one was run, and otherwise
the default recipe (γ = μ = 1 ramped in over the first third of training);
the results say which. DSH and DLBHC use their papers' settings.

Test protocols: "paper" (1,000 queries, 100 per class, drawn with seed 0; the
other 9,000 test images are the database) and "dsh" (all 10,000 test images
query the whole test set, themselves included). mAP is over the full ranking,
non-interpolated, with pessimistic ties (inside a group of equal scores the
relevant items rank last).

Each trained model is one JSON file in `--cache-dir` (reruns skip it), and
its `.keras` goes to `--models-dir`; `cifar10_retrieval.json` and `.md`
aggregate every cached entry.

    python -m benchmarks.cifar10_retrieval --sweep --pretrain-epochs 50 \\
        --epochs 5 --sweep-epochs 5 --seeds 0 --bits 12,24,36,48 --methods subic,dsh
    python -m benchmarks.cifar10_retrieval --quick --output-dir /tmp/q \\
        --cache-dir /tmp/q/cache --models-dir /tmp/q/models
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# faiss's OpenMP threads spin while waiting; on a shared machine that starves
# TensorFlow.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import keras
import numpy as np

from benchmarks import common
from benchmarks.cifar10_report import (
    CLASS_QUERY,
    SELECTION_METRIC,
    SUBIC_BLOCK_SIZES,
    build_result,
    fig5,
    markdown,
)
from subic_keras import backbones, datasets, recipe, scoring
from subic_keras.baselines import build_dlbhc, build_dsh, train_hashing
from subic_keras.models import Subic
from subic_keras.training import standardization

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ("subic", "subic16", "dsh", "dlbhc")
# The default recipe, used when no sweep result is available: γ = μ = 1
# ramped in linearly over the first third of training. The warm-up is a fraction
# of the epochs so that a setting chosen on a short sweep transfers.
DEFAULT_HPARAMS = {
    "subic": {"gamma": 1.0, "mu": 1.0, "warmup_fraction": 1 / 3, "learning_rate": 1e-3},
    "dsh": {"alpha": 0.01, "margin": "2B", "learning_rate": 1e-3},
    "dlbhc": {"learning_rate": 1e-3},
}
# The validation sweep of SuBiC's entropy weights at one bit-rate. An
# earlier grid (γ = μ in {0.1, 0.3, 1, 3}, learning rates 1e-3 and 3e-4,
# after 30 epochs of pre-training) found the weak end best and 3e-4 worse;
# its cached entries stay in the results.
SWEEP_GRID = tuple(
    {"gamma": value, "mu": value, "warmup_fraction": 1 / 3, "learning_rate": 1e-3}
    for value in (0.03, 0.1, 0.3)
)


@dataclasses.dataclass(frozen=True)
class Scale:
    """How much data and which protocols a run uses."""

    train_images: int | None  # None: all 50,000
    test_images: int | None  # None: all 10,000
    validation_fraction: float
    batch_size: int
    protocols: tuple  # (name in the results, protocol name, protocol args)


FULL = Scale(
    None,
    None,
    0.1,
    200,
    (("paper", "paper", {}), ("dsh", "dsh", {})),
)
# The paper protocol needs 100 test images per class; a quick run queries
# 5 per class instead and says so.
QUICK = Scale(
    600,
    200,
    1 / 6,
    100,
    (("paper", "random", {"queries_per_class": 5}), ("dsh", "dsh", {})),
)


# ---------------------------------------------------------------------------
# Data and models.


@dataclasses.dataclass
class Data:
    x_fit: np.ndarray
    y_fit: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_data(data_dir: str, scale: Scale) -> Data:
    """CIFAR-10 as uint8 images, with the validation split held out (seed 0)."""
    limit = None
    if scale.train_images is not None and scale.test_images is not None:
        limit = max(scale.train_images, scale.test_images)
    (x_train, y_train), (x_test, y_test) = datasets.load_cifar10(
        data_dir, max_per_split=limit
    )
    if scale.train_images is not None:
        x_train, y_train = x_train[: scale.train_images], y_train[: scale.train_images]
    if scale.test_images is not None:
        x_test, y_test = x_test[: scale.test_images], y_test[: scale.test_images]
    fit, val = datasets.train_validation_split(
        y_train, scale.validation_fraction, seed=0
    )
    return Data(x_train[fit], y_train[fit], x_train[val], y_train[val], x_test, y_test)


def code_shape(method: str, bits: int) -> tuple[int, int]:
    """`(M, K)` of a SuBiC method at `bits` bits."""
    block_size = SUBIC_BLOCK_SIZES[method]
    per_block = int(math.log2(block_size))
    if bits % per_block:
        raise ValueError(
            f"bits must be a multiple of {per_block} for {method} (K={block_size}), "
            f"received {bits}"
        )
    return bits // per_block, block_size


def build(
    method: str,
    bits: int,
    hparams: dict,
    x_fit: np.ndarray,
    backbone_weights: str | None = None,
):
    """A hashing baseline's network, uncompiled, on the CNN every method shares.

    `backbone_weights` (a `.weights.h5` from `pretrain_backbone`) starts the
    CNN from a classifier trained on the same fitting images; otherwise it
    starts from random weights. SuBiC's networks are built by the library's
    recipe (`train_subic`).
    """
    backbone = backbones.dsh_cnn(input_shape=x_fit.shape[1:])
    if backbone_weights is not None:
        backbone.load_weights(backbone_weights)
    preprocessing = standardization(x_fit)
    shape = x_fit.shape[1:]
    if method == "dsh":
        margin = None if hparams["margin"] == "2B" else float(hparams["margin"])
        return build_dsh(
            backbone,
            bits,
            margin=margin,
            alpha=hparams["alpha"],
            input_shape=shape,
            preprocessing=preprocessing,
            optimizer=None,
        )
    if method == "dlbhc":
        return build_dlbhc(
            backbone,
            bits,
            10,
            input_shape=shape,
            preprocessing=preprocessing,
            optimizer=None,
        )
    raise ValueError(f"method must be one of {METHODS}, received {method!r}")


def hparams_for(method: str, chosen_subic: dict, pretrain_epochs: int = 0) -> dict:
    if method in SUBIC_BLOCK_SIZES:
        hparams = dict(chosen_subic)
    else:
        hparams = dict(DEFAULT_HPARAMS[method])
    hparams.pop("pretrain_epochs", None)
    if pretrain_epochs:
        hparams["pretrain_epochs"] = pretrain_epochs
    return hparams


# ---------------------------------------------------------------------------
# Retrieval metrics.


def retrieval_metrics(
    scorer, images, labels, protocol: str, seed: int = 0, extras: bool = True, **args
) -> dict:
    """mAP etc. of any method (`subic_keras.scoring.Scorer`) on a protocol.

    `map` is the strict definition of the tables (non-interpolated,
    pessimistic ties); `map_expected` averages exactly over random orders of
    tied items, and `map_21point` is the SuBiC authors' definition (21-point
    interpolated precision, ties in database order as a stable sort leaves
    them), reported so the paper's numbers can be read against ours;
    `extras=False` skips those two (model selection needs `map` only).
    """
    ks = tuple(k for k in (10, 100) if k <= len(images) // 2)
    return scoring.evaluate(
        scorer, images, labels, protocol, seed=seed, ks=ks, extras=extras, **args
    )


def code_diagnostics(network, method: str, images, labels) -> dict:
    """Test accuracy of the codes' classifier and, for SuBiC, block statistics.

    Reported only (never used for selection): they explain a mAP, e.g.
    saturated blocks (entropy near 0 bits, large `z`) that stop learning.
    """
    inputs = datasets.as_model_inputs(images)
    if method == "dsh":
        return {}
    if method == "dlbhc":
        probs = network.train_model.predict(inputs, batch_size=256, verbose=0)
        return {"test_accuracy": float(np.mean(probs.argmax(-1) == labels))}
    outputs = network.train_model.predict(inputs, batch_size=256, verbose=0)
    binary = network.classifier.predict(inputs, batch_size=256, verbose=0)
    m, k = network.num_blocks, network.block_size
    blocks = outputs["block_probs"].reshape(-1, m, k).astype(np.float64)
    entropy = -np.sum(blocks * np.log2(np.maximum(blocks, 1e-30)), axis=-1)
    codes = blocks.argmax(-1)
    z = network.query(inputs).reshape(-1, m, k)
    return {
        "test_accuracy_soft": float(
            np.mean(outputs["class_probs"].argmax(-1) == labels)
        ),
        "test_accuracy_binary": float(np.mean(binary.argmax(-1) == labels)),
        "mean_block_entropy_bits": float(entropy.mean()),
        "bins_used_per_block": [int(np.unique(codes[:, j]).size) for j in range(m)],
        "mean_max_z": float(z.max(-1).mean()),
    }


def validation_map(scorer, data: Data) -> float:
    num_queries = max(10, len(data.y_val) // 10)
    return retrieval_metrics(
        scorer, data.x_val, data.y_val, "random", extras=False, num_queries=num_queries
    )["map"]


def add_class_query_results(network, entry: dict, data: Data, scale: Scale) -> None:
    """Scores a SuBiC table model with the class-posterior query as well.

    Adds `entry["test_class_query"]` (every test protocol) and the validation
    mAP of the selected weights under that query, so the choice between the
    two queries can be read on validation data. Epochs were selected with
    the paper's query.
    """
    scorer = network.with_query(CLASS_QUERY)
    entry["selection"]["validation_map_class_query"] = validation_map(scorer, data)
    entry["test_class_query"] = {}
    for name, protocol, args in scale.protocols:
        result = retrieval_metrics(scorer, data.x_test, data.y_test, protocol, **args)
        result["protocol_args"] = args
        entry["test_class_query"][name] = result


def pretrain_backbone(
    data: Data,
    epochs: int,
    seed: int,
    scale: Scale,
    cache_dir: str,
    models_dir: str,
    command: str,
    verbose: bool,
) -> tuple[str, dict]:
    """Stage 1 (`--pretrain-epochs`): the CNN as a plain softmax classifier.

    The DSH CNN plus one `Dense(10)` softmax layer, trained by the library's
    `recipe.pretrain_backbone` with the same standardisation, augmentation,
    batch size and Adam schedule as the methods; the epoch with the best
    validation accuracy is kept. Every method then starts its CNN from these weights
    (same seed, same weights), so the comparison stays like for like. Cached
    per seed: the weights in `models_dir`, a JSON record in `cache_dir`.

    Returns:
        `(weights path, record)`.
    """
    key = entry_key("pretrain", "classifier", 0, seed, epochs, {}, scale)
    record_path = os.path.join(cache_dir, key + ".json")
    weights_path = os.path.join(models_dir, key + ".weights.h5")
    if os.path.isfile(record_path) and os.path.isfile(weights_path):
        print(f"[cached] {key}", flush=True)
        return weights_path, common.read_json(record_path)
    print(f"[pretrain] {key}", flush=True)
    keras.utils.set_random_seed(seed)
    backbone = backbones.dsh_cnn(input_shape=data.x_fit.shape[1:])
    result = recipe.pretrain_backbone(
        backbone,
        data.x_fit,
        data.y_fit,
        (data.x_val, data.y_val),
        num_classes=10,
        recipe=recipe.Recipe(
            pretrain_epochs=epochs,
            batch_size=scale.batch_size,
            learning_rate=DEFAULT_HPARAMS["subic"]["learning_rate"],
            augment=True,
        ),
        seed=seed,
        preprocessing=standardization(data.x_fit),
        verbose=2 if verbose else 0,
    )
    history = result["validation_accuracy_per_epoch"]
    best = result["best_validation_accuracy"]
    os.makedirs(models_dir, exist_ok=True)
    with common.atomic_output(weights_path, suffix=".weights.h5") as tmp:
        backbone.save_weights(tmp)
    record = {
        "key": key,
        "kind": "pretrain",
        "seed": seed,
        "epochs": epochs,
        "best_epoch": result["best_epoch"],
        "best_validation_accuracy": best,
        "validation_accuracy_per_epoch": history,
        "train_seconds": result["train_seconds"],
        "weights_file": os.path.basename(weights_path),
        "command": command,
        "versions": common.versions(),
        "machine": common.machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json(record_path, record)
    print(
        f"[done] {key}: validation accuracy {best:.4f} "
        f"({record['train_seconds']:.0f} s)",
        flush=True,
    )
    keras.backend.clear_session()
    return weights_path, record


def train(
    method: str,
    bits: int,
    hparams: dict,
    data: Data,
    epochs: int,
    seed: int,
    batch_size: int,
    verbose: bool,
    backbone_weights: str | None = None,
):
    """Trains one model; returns `(network, selection dict, seconds)`.

    SuBiC models are trained by the library's recipe (`recipe.train_subic`,
    stage 2; the pre-training is `pretrain_backbone`'s); DSH and DLBHC by
    `fit` with the same data, schedule and validation-mAP selection
    (`callbacks.BestWeights`).
    """
    if method in SUBIC_BLOCK_SIZES:
        return train_subic(
            method,
            bits,
            hparams,
            data,
            epochs,
            seed,
            batch_size,
            verbose,
            backbone_weights,
        )
    keras.utils.set_random_seed(seed)
    network = build(method, bits, hparams, data.x_fit, backbone_weights)
    summary = train_hashing(
        network,
        data.x_fit,
        data.y_fit,
        (data.x_val, data.y_val),
        recipe=_stage_recipe(hparams, epochs, batch_size),
        seed=seed,
        verbose=2 if verbose else 0,
    )
    if summary["best_epoch"] is None:
        raise RuntimeError(f"{method} {bits} bits: no finite epoch to select")
    selection = {
        "metric": SELECTION_METRIC,
        "best_epoch": summary["best_epoch"],
        "best_validation_map": summary["best_validation_map"],
        "validation_map_per_epoch": summary["validation_map_per_epoch"],
    }
    return network, selection, summary["train_seconds"]


def _stage_recipe(hparams: dict, epochs: int, batch_size: int) -> recipe.Recipe:
    """The recipe's second stage with this entry's budget and settings."""
    return recipe.Recipe(
        pretrain_epochs=0,
        epochs=epochs,
        gamma=hparams.get("gamma", recipe.Recipe.gamma),
        mu=hparams.get("mu", recipe.Recipe.mu),
        warmup_fraction=hparams.get("warmup_fraction", recipe.Recipe.warmup_fraction),
        learning_rate=hparams["learning_rate"],
        batch_size=batch_size,
        augment=True,
    )


def train_subic(
    method: str,
    bits: int,
    hparams: dict,
    data: Data,
    epochs: int,
    seed: int,
    batch_size: int,
    verbose: bool,
    backbone_weights: str | None,
):
    """A SuBiC model by `recipe.train_subic`; the same return as `train`."""
    start = time.time()
    keras.utils.set_random_seed(seed)
    backbone = backbones.dsh_cnn(input_shape=data.x_fit.shape[1:])
    if backbone_weights is not None:
        backbone.load_weights(backbone_weights)
    num_blocks, block_size = code_shape(method, bits)
    network, summary = recipe.train_subic(
        backbone,
        num_blocks,
        block_size,
        data.x_fit,
        data.y_fit,
        (data.x_val, data.y_val),
        num_classes=10,
        recipe=_stage_recipe(hparams, epochs, batch_size),
        seed=seed,
        preprocessing=standardization(data.x_fit),
        verbose=2 if verbose else 0,
    )
    if summary["best_epoch"] is None:
        raise RuntimeError(f"{method} {bits} bits: no finite epoch to select")
    # Scored with the paper's query, as every row of the table: the query
    # the recipe chose is recorded, and `_cq` rows score the other one.
    selection = {
        "metric": SELECTION_METRIC,
        "best_epoch": summary["best_epoch"],
        "best_validation_map": summary["validation_map"]["fc0"],
        "validation_map_per_epoch": summary["validation_map_per_epoch"]["fc0"],
        "query_chosen_on_validation": summary["query"],
    }
    network.default_query = "fc0"
    return network, selection, time.time() - start


# ---------------------------------------------------------------------------
# Cache entries.


def entry_key(kind, method, bits, seed, epochs, hparams, scale: Scale) -> str:
    settings = {
        "kind": kind,
        "hparams": hparams,
        "scale": dataclasses.asdict(scale),
        "protocol_seed": 0,
    }
    return common.settings_key(f"{kind}-{method}-{bits}b-s{seed}-e{epochs}", settings)


def write_json(path: str, obj) -> None:
    common.write_json(path, obj)


def run_entry(
    kind: str,
    method: str,
    bits: int,
    seed: int,
    epochs: int,
    hparams: dict,
    data: Data,
    scale: Scale,
    cache_dir: str,
    models_dir: str,
    command: str,
    verbose: bool,
) -> dict:
    """Trains and evaluates one configuration, or reads it from the cache.

    `kind` is `"table"` (evaluated on the test protocols, model saved) or
    `"sweep"` (validation only: the test set is never touched). With
    `hparams["pretrain_epochs"]`, the CNN starts from `pretrain_backbone`.
    """
    key = entry_key(kind, method, bits, seed, epochs, hparams, scale)
    path = os.path.join(cache_dir, key + ".json")
    if os.path.isfile(path):
        entry = common.read_json(path)
        print(f"[cached] {key}", flush=True)
        model_path = os.path.join(models_dir, entry.get("model_file", ""))
        if (
            kind == "table"
            and method in SUBIC_BLOCK_SIZES
            and "test_class_query" not in entry
            and os.path.isfile(model_path)
        ):
            # Entries cached before the class-posterior query existed.
            network = Subic.from_train_model(
                keras.saving.load_model(model_path, compile=False)
            )
            add_class_query_results(network, entry, data, scale)
            write_json(path, entry)
            print(f"[rescored] {key} with the class-posterior query", flush=True)
            keras.backend.clear_session()
        return entry
    weights, pretraining = None, None
    if hparams.get("pretrain_epochs"):
        weights, record = pretrain_backbone(
            data,
            hparams["pretrain_epochs"],
            seed,
            scale,
            cache_dir,
            models_dir,
            command,
            verbose,
        )
        pretraining = {
            name: record[name]
            for name in ("key", "epochs", "best_validation_accuracy", "train_seconds")
        }
    print(f"[train] {key} {hparams}", flush=True)
    network, selection, train_seconds = train(
        method, bits, hparams, data, epochs, seed, scale.batch_size, verbose, weights
    )
    entry = {
        "key": key,
        "kind": kind,
        "method": method,
        "bits": bits,
        "seed": seed,
        "epochs": epochs,
        "hparams": hparams,
        "batch_size": scale.batch_size,
        "optimizer": "Adam, learning rate ×0.1 after 75% of the steps",
        "augmentation": "random horizontal flip, random shift up to 4 pixels",
        "preprocessing": "per-channel standardisation (fitting images' statistics)",
        "data": {
            "num_fit": len(data.y_fit),
            "num_validation": len(data.y_val),
            "num_test": len(data.y_test),
            "quick": scale is QUICK,
        },
        "selection": selection,
        # Excludes the shared classifier pre-training, reported on its own.
        "train_seconds": round(train_seconds, 1),
    }
    if pretraining is not None:
        entry["pretraining"] = pretraining
    if method in SUBIC_BLOCK_SIZES:
        entry["num_blocks"], entry["block_size"] = code_shape(method, bits)
    if kind == "table":
        start = time.time()
        entry["test"] = {}
        for name, protocol, args in scale.protocols:
            result = retrieval_metrics(
                network, data.x_test, data.y_test, protocol, **args
            )
            result["protocol_args"] = args
            entry["test"][name] = result
        if method in SUBIC_BLOCK_SIZES:
            add_class_query_results(network, entry, data, scale)
        entry["diagnostics"] = code_diagnostics(
            network, method, data.x_test, data.y_test
        )
        entry["eval_seconds"] = round(time.time() - start, 1)
        os.makedirs(models_dir, exist_ok=True)
        model_path = os.path.join(models_dir, key + ".keras")
        with common.atomic_output(model_path, suffix=".keras") as tmp:
            network.train_model.save(tmp)
        entry["model_file"] = key + ".keras"
        summary = ", ".join(
            f"{name} mAP {entry['test'][name]['map']:.4f}" for name in entry["test"]
        )
    else:
        summary = f"validation mAP {selection['best_validation_map']:.4f}"
    entry.update(
        command=command,
        versions=common.versions(),
        machine=common.machine(),
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    write_json(path, entry)
    print(f"[done] {key}: {summary} ({train_seconds:.0f} s training)", flush=True)
    keras.backend.clear_session()
    return entry


def load_entries(cache_dir: str) -> list[dict]:
    return common.ResultCache(cache_dir).entries()


def sweep(args, data: Data, scale: Scale, command: str) -> tuple[dict, list[dict]]:
    """Trains each `SWEEP_GRID` setting at `args.sweep_bits`; picks the best."""
    entries = []
    for hparams in SWEEP_GRID:
        entries.append(
            run_entry(
                "sweep",
                "subic",
                args.sweep_bits,
                0,
                args.sweep_epochs,
                hparams_for("subic", hparams, args.pretrain_epochs),
                data,
                scale,
                args.cache_dir,
                args.models_dir,
                command,
                args.verbose,
            )
        )
    best = max(entries, key=lambda e: e["selection"]["best_validation_map"])
    return dict(best["hparams"]), entries


def chosen_subic_hparams(
    entries: list[dict], sweep_bits: int, sweep_epochs: int, pretrain_epochs: int = 0
):
    """The best cached sweep setting, or None when no sweep was run."""
    candidates = [
        e
        for e in entries
        if e.get("kind") == "sweep"
        and e["bits"] == sweep_bits
        and e["epochs"] == sweep_epochs
        and e["hparams"].get("pretrain_epochs", 0) == pretrain_epochs
    ]
    if not candidates:
        return None
    return dict(
        max(candidates, key=lambda e: e["selection"]["best_validation_map"])["hparams"]
    )


# ---------------------------------------------------------------------------
# Command line.


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected integers, received {text!r}"
        ) from error


def _method_list(text: str) -> list[str]:
    methods = [v.strip() for v in text.split(",") if v.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise argparse.ArgumentTypeError(
            f"methods must be among {METHODS}, received {text!r}"
        )
    return methods


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    parser.add_argument(
        "--data-dir",
        default=os.path.join("..", "shared", "data"),
        help="CIFAR-10 binary or python batches (default ../shared/data)",
    )
    parser.add_argument(
        "--methods",
        type=_method_list,
        default=list(METHODS),
        help="comma-separated, among subic,subic16,dsh,dlbhc",
    )
    parser.add_argument(
        "--bits", type=_int_list, default=[12, 24, 36, 48], help="comma-separated"
    )
    parser.add_argument(
        "--seeds", type=_int_list, default=[0], help="comma-separated training seeds"
    )
    parser.add_argument("--epochs", type=int, default=15, help="per model")
    parser.add_argument(
        "--pretrain-epochs",
        type=int,
        default=0,
        help="first train the CNN as a plain softmax classifier for this many "
        "epochs (once per seed, cached) and start every method from it; 0 (the "
        "default) trains every model from random weights",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny run: 600 training and 200 test images, 1 epoch, 12 and 24 bits",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="run (or read from the cache) the validation sweep of SuBiC's "
        "γ, μ and warm-up first, and use its best setting",
    )
    parser.add_argument("--sweep-bits", type=int, default=48)
    parser.add_argument("--sweep-epochs", type=int, default=4)
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(HERE, "results", "cifar10_cache"),
        help="one JSON per trained model (default benchmarks/results/cifar10_cache)",
    )
    parser.add_argument(
        "--models-dir",
        default=os.path.join(HERE, "cache", "models"),
        help="trained .keras models (default benchmarks/cache/models, not committed)",
    )
    parser.add_argument(
        "--output-dir",
        default=os.path.join(HERE, "results"),
        help="cifar10_retrieval.json/.md and fig5_top10.png (default "
        "benchmarks/results)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: aggregate the cache, write the JSON, Markdown, figure",
    )
    parser.add_argument("--no-figure", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print every epoch")
    args = parser.parse_args(argv)
    if args.quick:
        if "--bits" not in (argv if argv is not None else sys.argv):
            args.bits = [12, 24]
        args.epochs = 1
        args.sweep_epochs = 1
        args.sweep_bits = args.bits[-1]
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, received {args.epochs}")
    if args.pretrain_epochs < 0:
        parser.error(f"--pretrain-epochs must be >= 0, received {args.pretrain_epochs}")
    for method in args.methods:
        for bits in args.bits:
            if method in SUBIC_BLOCK_SIZES:
                try:
                    code_shape(method, bits)
                except ValueError as error:
                    parser.error(str(error))
    return args


def main(argv=None) -> dict:
    started = time.perf_counter()
    args = parse_args(argv)
    command = common.command("cifar10_retrieval")
    scale = QUICK if args.quick else FULL
    data = load_data(args.data_dir, scale)
    os.makedirs(args.cache_dir, exist_ok=True)
    if not args.report_only:
        chosen = chosen_subic_hparams(
            load_entries(args.cache_dir),
            args.sweep_bits,
            args.sweep_epochs,
            args.pretrain_epochs,
        )
        if args.sweep and any(m in SUBIC_BLOCK_SIZES for m in args.methods):
            chosen, _ = sweep(args, data, scale, command)
        if chosen is None:
            chosen = dict(DEFAULT_HPARAMS["subic"])
        print(f"SuBiC hyper-parameters: {chosen}", flush=True)
        for seed in args.seeds:
            for bits in args.bits:
                for method in args.methods:
                    run_entry(
                        "table",
                        method,
                        bits,
                        seed,
                        args.epochs,
                        hparams_for(method, chosen, args.pretrain_epochs),
                        data,
                        scale,
                        args.cache_dir,
                        args.models_dir,
                        command,
                        args.verbose,
                    )
    result = build_result(load_entries(args.cache_dir), command)
    os.makedirs(args.output_dir, exist_ok=True)
    figure = os.path.join(args.output_dir, "fig5_top10.png")
    if not args.no_figure and fig5(result, data, scale, args.models_dir, figure):
        result["figure"] = os.path.basename(figure)
    elif args.report_only and os.path.isfile(figure):
        # The models behind an earlier figure are not on this machine: the
        # cached entries it was drawn from are unchanged, so it still holds.
        result["figure"] = os.path.basename(figure)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(os.path.join(args.output_dir, "cifar10_retrieval.json"), result)
    common.write_text(
        os.path.join(args.output_dir, "cifar10_retrieval.md"), markdown(result)
    )
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
