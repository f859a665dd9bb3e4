"""One cached model of the CIFAR-10 benchmark: data, training, scoring.

`run_entry` trains one (method, bits, seed, budget, hyper-parameters)
configuration with the library (`subic_keras.trainers.recipe`,
`subic_keras.baselines.train_hashing`), scores it with
`subic_keras.evaluation.scoring.evaluate` and caches the result as one JSON file;
`benchmarks.cifar10_retrieval` chooses the configurations and
`benchmarks.cifar10_report` aggregates the cache.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import keras
import numpy as np

from benchmarks import common
from benchmarks.cifar10_report import CLASS_QUERY, SELECTION_METRIC, SUBIC_BLOCK_SIZES
from subic_keras.baselines import build_dlbhc, build_dsh, train_hashing
from subic_keras.data import datasets
from subic_keras.evaluation import scoring
from subic_keras.models import backbones
from subic_keras.models.subic import Subic
from subic_keras.trainers import recipe
from subic_keras.training import standardization

# The Adam rate of the classifier pre-training, as in every method's stage.
PRETRAIN_LEARNING_RATE = 1e-3


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
    raise ValueError(f"method must be 'dsh' or 'dlbhc', received {method!r}")


# ---------------------------------------------------------------------------
# Retrieval metrics.


def retrieval_metrics(
    scorer, images, labels, protocol: str, seed: int = 0, extras: bool = True, **args
) -> dict:
    """mAP etc. of any method (`subic_keras.evaluation.scoring.Scorer`) on a protocol.

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
    """Test accuracy of the codes' classifier and, for SuBiC, code statistics."""
    if method in SUBIC_BLOCK_SIZES:
        return network.code_statistics(images, labels)
    if method == "dlbhc":
        probs = network.train_model.predict(
            datasets.as_model_inputs(images), batch_size=256, verbose=0
        )
        return {"test_accuracy": float(np.mean(probs.argmax(-1) == labels))}
    return {}


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
            learning_rate=PRETRAIN_LEARNING_RATE,
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
    common.write_json(record_path, record)
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


def read_cached_entry(
    path: str,
    key: str,
    kind: str,
    method: str,
    data: Data,
    scale: Scale,
    models_dir: str,
) -> dict:
    """The cached entry at `path`, given the class-posterior query's results
    where it was cached before that query existed."""
    entry = common.read_json(path)
    print(f"[cached] {key}", flush=True)
    model_path = os.path.join(models_dir, entry.get("model_file", ""))
    if (
        kind == "table"
        and method in SUBIC_BLOCK_SIZES
        and "test_class_query" not in entry
        and os.path.isfile(model_path)
    ):
        network = Subic.from_train_model(
            keras.saving.load_model(model_path, compile=False)
        )
        add_class_query_results(network, entry, data, scale)
        common.write_json(path, entry)
        print(f"[rescored] {key} with the class-posterior query", flush=True)
        keras.backend.clear_session()
    return entry


def evaluate_on_test(
    network, entry: dict, data: Data, scale: Scale, models_dir: str
) -> None:
    """A table entry's test protocols, class-posterior query and code
    diagnostics, into `entry`; its model saved beside the cache."""
    start = time.time()
    method = entry["method"]
    entry["test"] = {}
    for name, protocol, args in scale.protocols:
        result = retrieval_metrics(network, data.x_test, data.y_test, protocol, **args)
        result["protocol_args"] = args
        entry["test"][name] = result
    if method in SUBIC_BLOCK_SIZES:
        add_class_query_results(network, entry, data, scale)
    entry["diagnostics"] = code_diagnostics(network, method, data.x_test, data.y_test)
    entry["eval_seconds"] = round(time.time() - start, 1)
    os.makedirs(models_dir, exist_ok=True)
    with common.atomic_output(
        os.path.join(models_dir, entry["key"] + ".keras"), suffix=".keras"
    ) as tmp:
        network.train_model.save(tmp)
    entry["model_file"] = entry["key"] + ".keras"


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
        return read_cached_entry(path, key, kind, method, data, scale, models_dir)
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
            "quick": scale.train_images is not None,
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
        evaluate_on_test(network, entry, data, scale, models_dir)
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
    common.write_json(path, entry)
    print(f"[done] {key}: {summary} ({train_seconds:.0f} s training)", flush=True)
    keras.backend.clear_session()
    return entry


def load_entries(cache_dir: str) -> list[dict]:
    return common.ResultCache(cache_dir).entries()
