"""Cross-domain category retrieval at 64 bits (the paper's Table 3), offline.

The paper trains SuBiC on ImageNet VGG-M-128 features and searches VOC2007,
Caltech-101 and ImageNet. Offline, this benchmark keeps the idea (train the
codes on one labelled domain, search another): features of a frozen ImageNet
MobileNet v1 (1,024-d, cached on disk); training on CIFAR-10's training
features, a stratified validation split of them held out for every
model-selection choice; test on Fashion-MNIST (cross-domain; grey images
replicated to RGB) and CIFAR-10 (in-domain), each by the paper's protocol:
100 queries per class, the rest (9,000) as database.

Methods, all at 64 bits (8 blocks / sub-quantizers of 8 bits): SuBiC 2-layer
(FC0/FC1 on the standardised features) and 3-layer (a trained 1024 -> 128
ReLU layer under them, the analogue of VGG-128's last layer), trained by
`subic_keras.trainers.recipe.train_subic` without pre-training; PQ, OPQ (the paper's
CKM) and LSQ, searched asymmetrically; DSH-64 (Hamming), trained by
`subic_keras.baselines.train_hashing`; the uncompressed features. Every
method is scored by `subic_keras.evaluation.scoring.evaluate`: non-interpolated mAP over
the full ranking, pessimistic ties (relevant items after irrelevant ones of
equal score).

Figures 3 and 4: the 2-layer SuBiC is retrained for each `γ/μ` in
{0.1, 0.5, 1, 2, 5} with `μ = 1`; Fig. 3 plots the sorted, averaged first
block `b̃_1` and the sorted support histogram of `b_1`, Fig. 4 the test mAP
against `γ/μ`. Every (method, seed) result is cached as JSON under
`--cache-dir`, keyed by its settings: a rerun computes only what changed.

Example (`DIR` or `$SUBIC_DATA_DIR` holds `cifar-10-batches-bin/`,
`fashion-mnist/` and the MobileNet extractor):

    python -m benchmarks.cross_domain --data-dir DIR       # full, ~30-60 min
    python -m benchmarks.cross_domain --data-dir DIR --quick --output-dir /tmp/xd
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks import cross_domain_report as report_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# faiss's OpenMP threads spin while waiting, starving TensorFlow on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL_FILE = "mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"
METHODS = tuple(report_lib.METHOD_TITLES)
# Bumped when a method's computation changes, so stale cached results are
# never reused. 2: every method trains and scores through the library.
RESULT_VERSION = 2
EXTRACT_CHUNK = 10000  # images whose features are extracted and cached at once


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that defines a run; hashed into the cache keys."""

    num_train: int | None  # CIFAR-10 training images (None: all 50,000)
    num_test: int | None  # images per test set (None: all 10,000)
    validation_size: int
    test_queries_per_class: int | None  # None: the paper protocol (100/class)
    num_blocks: int = 8
    block_size: int = 256
    batch_size: int = 200
    standardize: bool = True
    # SuBiC 2-layer.
    subic2_learning_rate: float = 1e-3
    subic2_epochs: int = 12
    subic2_warmup_epochs: float = 5.0
    # γ/μ = 0.1: the sweep's best CIFAR-10 validation mAP with the library's
    # recipe (the report's `gamma_selection`).
    subic2_gamma: float = 0.1
    subic2_mu: float = 1.0
    # SuBiC 3-layer.
    subic3_hidden: int = 128
    subic3_learning_rate: float = 1e-3
    subic3_epochs: int = 12
    subic3_warmup_epochs: float = 5.0
    # Validation mAP (query z*) 0.794 with γ/μ = 0.1 against 0.748 with 5.
    subic3_gamma: float = 0.1
    subic3_mu: float = 1.0
    # DSH-64.
    dsh_learning_rate: float = 1e-3
    dsh_epochs: int = 15
    # Quantizers.
    pq_iterations: int = 25
    opq_rotation_iterations: int = 20
    lsq_iterations: int = 10
    lsq_encode_ils_iterations: int = 16
    lsq_train_ils_iterations: int = 8
    lsq_train_size: int | None = 10000  # training subset for LSQ (slow)
    # Figures 3 and 4: γ values with μ fixed to `sweep_mu`.
    sweep_gammas: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0)
    sweep_mu: float = 1.0
    fig3_entries: int = 20

    @property
    def bits(self) -> int:
        return self.num_blocks * int(math.log2(self.block_size))


FULL = Settings(
    num_train=None,
    num_test=None,
    validation_size=5000,
    test_queries_per_class=None,
)
# Small enough to extract, train and plot in well under a minute; K = 16 so
# that the quantizers' 16 codewords can be fitted on 100 training vectors.
QUICK = dataclasses.replace(
    FULL,
    num_train=120,
    num_test=100,
    validation_size=20,
    test_queries_per_class=2,
    block_size=16,
    subic2_epochs=3,
    subic2_warmup_epochs=1.0,
    subic3_epochs=3,
    subic3_warmup_epochs=1.0,
    dsh_epochs=2,
    pq_iterations=2,
    opq_rotation_iterations=2,
    lsq_iterations=1,
    lsq_encode_ils_iterations=1,
    lsq_train_ils_iterations=1,
    lsq_train_size=None,
    sweep_gammas=(0.5, 2.0),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    common.add_data_dir(
        parser,
        f"cifar-10-batches-bin/, fashion-mnist/ and {MODEL_FILE}",
    )
    parser.add_argument(
        "--cache-dir",
        default=str(REPO / "benchmarks" / "cache"),
        help="features and per-(method, seed) results (default: benchmarks/cache)",
    )
    parser.add_argument(
        "--output-dir",
        default=str(REPO / "benchmarks" / "results"),
        help="where cross_domain.json/.md and the figures go "
        "(default: benchmarks/results)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny smoke run (120 training and 100 test images per set, "
        "K = 16, a few steps); its cache goes to <cache-dir>/quick",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="seeds (default: 0)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=None,
        help="methods of the table (default: all; with --quick all but opq, "
        "which needs more training vectors than feature dimensions)",
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="skip the γ/μ sweep and figures"
    )
    parser.add_argument(
        "--sweep-gammas",
        type=float,
        nargs="+",
        default=None,
        help="γ values of the sweep, μ = 1 (default: 0.1 0.5 1 2 5; with --quick "
        "0.5 2)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="threads of the LiteRT feature extractor (default: 2)",
    )
    args = parser.parse_args(argv)
    if args.methods is None:
        args.methods = [m for m in METHODS if not (args.quick and m == "opq")]
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be >= 0, received {args.seeds}")
    if args.sweep_gammas is not None and min(args.sweep_gammas) <= 0:
        parser.error(f"--sweep-gammas must be > 0, received {args.sweep_gammas}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, received {args.threads}")
    return args


@dataclasses.dataclass
class Data:
    x_train: np.ndarray  # CIFAR-10 training features, training part
    y_train: np.ndarray
    x_val: np.ndarray  # CIFAR-10 training features, validation part
    y_val: np.ndarray
    tests: dict  # name -> (features, labels)
    fingerprint: str  # identifies the features and splits


def load_data(args, settings: Settings, cache_dir: Path) -> Data:
    """Features of every set (cached on disk) and the validation split."""
    from subic_keras.data import datasets
    from subic_keras.models.backbones import LiteRTFeatureExtractor

    data_dir = Path(args.data_dir)
    (x_train, y_train), (x_cifar, y_cifar) = datasets.load_cifar10(
        data_dir / "cifar-10-batches-bin",
        max_per_split=max(settings.num_train or 50000, settings.num_test or 10000),
    )
    x_train, y_train = x_train[: settings.num_train], y_train[: settings.num_train]
    x_cifar, y_cifar = x_cifar[: settings.num_test], y_cifar[: settings.num_test]
    _, (x_fashion, y_fashion) = datasets.load_fashion_mnist(
        data_dir / "fashion-mnist", max_per_split=settings.num_test
    )
    extractor = LiteRTFeatureExtractor(data_dir / MODEL_FILE, num_threads=args.threads)
    features = {}
    for name, images in (
        ("fashion_mnist", datasets.to_rgb(x_fashion)),
        ("cifar10", x_cifar),
        ("cifar10_train", x_train),
    ):
        start = time.perf_counter()
        features[name] = extractor.extract(
            images,
            cache_dir=cache_dir / "features",
            progress=sys.stderr.isatty(),
            chunk_size=EXTRACT_CHUNK,  # an interrupted extraction resumes
        )
        seconds = time.perf_counter() - start
        common.log(f"features {name}: {features[name].shape} in {seconds:.1f} s")

    train_idx, val_idx = datasets.train_validation_split(
        y_train, settings.validation_size, seed=0
    )
    digest = hashlib.sha256()
    for array in (*features.values(), train_idx):
        digest.update(np.ascontiguousarray(array).tobytes())
    return Data(
        x_train=features["cifar10_train"][train_idx],
        y_train=y_train[train_idx],
        x_val=features["cifar10_train"][val_idx],
        y_val=y_train[val_idx],
        tests={
            "fashion_mnist": (features["fashion_mnist"], y_fashion),
            "cifar10": (features["cifar10"], y_cifar),
        },
        fingerprint=digest.hexdigest()[:16],
    )


def evaluate_tests(scorer, data: Data, settings: Settings) -> dict:
    """`scoring.evaluate` of `scorer` on both test sets."""
    from subic_keras.evaluation import scoring

    per_class = settings.test_queries_per_class
    protocol = (
        {"protocol": "paper"}
        if per_class is None
        else {"protocol": "random", "queries_per_class": per_class}
    )
    ks = (10, 100) if settings.num_test is None else (10,)
    results = {}
    for name, (features, labels) in data.tests.items():
        start = time.perf_counter()
        results[name] = scoring.evaluate(
            scorer, features, labels, **protocol, seed=0, ks=ks, extras=False
        )
        results[name]["search_seconds"] = time.perf_counter() - start
    return results


def run_uncompressed(metric: str, data: Data, settings: Settings, seed: int):
    from subic_keras.baselines import Uncompressed

    return {"test": evaluate_tests(Uncompressed(metric), data, settings)}


def quantizer(kind: str, settings: Settings):
    """The unfitted PQ, OPQ or LSQ of `settings`, and its hyper-parameters."""
    from subic_keras import baselines

    nbits = int(math.log2(settings.block_size))
    params = {"num_iterations": settings.pq_iterations}
    if kind == "pq":
        return baselines.ProductQuantizer(settings.num_blocks, nbits, **params), params
    if kind == "opq":
        params["num_rotation_iterations"] = settings.opq_rotation_iterations
        return (
            baselines.OptimizedProductQuantizer(settings.num_blocks, nbits, **params),
            params,
        )
    params = {
        "num_iterations": settings.lsq_iterations,
        "encode_ils_iterations": settings.lsq_encode_ils_iterations,
        "train_ils_iterations": settings.lsq_train_ils_iterations,
    }
    return baselines.LocalSearchQuantizer(settings.num_blocks, nbits, **params), params


def run_quantizer(kind: str, data: Data, settings: Settings, seed: int):
    method, params = quantizer(kind, settings)
    fit_x = data.x_train
    if kind == "lsq" and (settings.lsq_train_size or len(fit_x)) < len(fit_x):
        subset = np.random.default_rng(seed).choice(
            len(fit_x), settings.lsq_train_size, replace=False
        )
        fit_x = fit_x[np.sort(subset)]
    params.update(train_size=len(fit_x), num_codebooks=settings.num_blocks)
    start = time.perf_counter()
    method.fit(fit_x, seed=seed)
    fit_seconds = time.perf_counter() - start
    reconstruction = method.decode(method.encode(data.x_val)) - data.x_val
    return {
        "test": evaluate_tests(method, data, settings),
        "hyperparameters": params,
        "fit_seconds": fit_seconds,
        "validation_reconstruction_mse": float(
            np.mean(np.square(reconstruction).sum(axis=1))
        ),
        "features": "raw (not standardised)",
    }


def standardize(data: Data, settings: Settings):
    """Standardisation with the training features' statistics, or `None`."""
    import keras

    if not settings.standardize:
        return None
    return keras.layers.Normalization(
        mean=data.x_train.mean(axis=0),
        variance=data.x_train.var(axis=0),
        name="standardize",
    )


def subic_recipe(variant: str, settings: Settings, gamma: float | None):
    """The `Recipe` of a 2-layer or 3-layer SuBiC (γ overridden by a sweep)."""
    from subic_keras.trainers.recipe import Recipe

    prefix = "subic2" if variant == "2-layer" else "subic3"
    epochs = getattr(settings, f"{prefix}_epochs")
    return Recipe(
        pretrain_epochs=0,
        epochs=epochs,
        gamma=getattr(settings, f"{prefix}_gamma") if gamma is None else gamma,
        mu=getattr(settings, f"{prefix}_mu") if gamma is None else settings.sweep_mu,
        warmup_fraction=getattr(settings, f"{prefix}_warmup_epochs") / epochs,
        learning_rate=getattr(settings, f"{prefix}_learning_rate"),
        batch_size=settings.batch_size,
        augment=False,
    )


def run_subic(
    variant: str, data: Data, settings: Settings, seed: int, gamma=None
) -> dict:
    """Trains a 2-layer or 3-layer SuBiC with the library's recipe."""
    from subic_keras.models import backbones
    from subic_keras.trainers.recipe import train_subic

    dim = data.x_train.shape[1]
    if variant == "2-layer":
        backbone = backbones.feature_input(dim)
    else:
        backbone = backbones.mlp_backbone((dim,), settings.subic3_hidden, depth=1)
    recipe = subic_recipe(variant, settings, gamma)
    subic, summary = train_subic(
        backbone,
        settings.num_blocks,
        settings.block_size,
        data.x_train,
        data.y_train,
        (data.x_val, data.y_val),
        recipe=recipe,
        seed=seed,
        preprocessing=standardize(data, settings),
    )
    validation = summary.get("validation_map") or {}
    # The table scores the paper's query `z*` (Eq. 9), as its Table 3; the class
    # query (the recipe's in-domain choice) carries the training classes.
    return {
        "hyperparameters": {
            **summary["recipe"],
            "warmup_epochs": recipe.warmup_epochs,
            "standardize_features": settings.standardize,
            "hidden_units": None if variant == "2-layer" else settings.subic3_hidden,
            "chosen_epoch": summary["best_epoch"],
            "query": "fc0",
            "query_chosen_on_validation": summary["query"],
        },
        "validation_map": validation.get("fc0"),
        "validation_map_class_query": validation.get("class_posterior"),
        "train_seconds": summary["train_seconds"],
        "history": summary["validation_map_per_epoch"],
        "test": evaluate_tests(subic.with_query("fc0"), data, settings),
        "test_class_query": evaluate_tests(
            subic.with_query("class_posterior"), data, settings
        ),
        "code_statistics": {
            name: subic.code_statistics(features)
            for name, (features, _) in data.tests.items()
        },
    }


def run_dsh(data: Data, settings: Settings, seed: int) -> dict:
    import keras

    from subic_keras.baselines import build_dsh, train_hashing
    from subic_keras.models import backbones
    from subic_keras.trainers.recipe import Recipe

    keras.utils.set_random_seed(seed)
    dsh = build_dsh(
        backbones.feature_input(data.x_train.shape[1]),
        settings.bits,
        preprocessing=standardize(data, settings),
        optimizer=None,
    )
    recipe = Recipe(
        pretrain_epochs=0,
        epochs=settings.dsh_epochs,
        learning_rate=settings.dsh_learning_rate,
        batch_size=settings.batch_size,
        augment=False,
    )
    summary = train_hashing(
        dsh,
        data.x_train,
        data.y_train,
        (data.x_val, data.y_val),
        recipe=recipe,
        seed=seed,
    )
    return {
        "hyperparameters": {
            "bits": settings.bits,
            "margin": dsh.margin,
            "alpha": dsh.alpha,
            "learning_rate": settings.dsh_learning_rate,
            "batch_size": settings.batch_size,
            "max_epochs": settings.dsh_epochs,
            "chosen_epoch": summary["best_epoch"],
            "standardize_features": settings.standardize,
            "head": "linear 1024 -> 64 on the features",
        },
        "validation_map": summary["best_validation_map"],
        "train_seconds": summary["train_seconds"],
        "history": summary["validation_map_per_epoch"],
        "test": evaluate_tests(dsh, data, settings),
    }


def method_settings(name: str, settings: Settings) -> dict:
    """The settings a method depends on (its cache key)."""
    fields = dataclasses.asdict(settings)
    shared = ("num_blocks", "block_size", "batch_size", "standardize")
    key = {k: fields[k] for k in (*shared, "validation_size", "test_queries_per_class")}
    if name.startswith(("subic", "sweep")):
        key["queries"] = "fc0 table, class_posterior beside it"
    if name.startswith(("subic_2layer", "sweep")):
        prefix = "subic2_"
    elif name.startswith("subic_3layer"):
        prefix = "subic3_"
    elif name in ("pq", "opq", "lsq"):
        prefix = (name, "pq_")
    else:
        prefix = name + "_"
    key.update({k: v for k, v in fields.items() if k.startswith(prefix)})
    if name.startswith("sweep"):
        # A sweep point sets γ and μ itself.
        del key["subic2_gamma"], key["subic2_mu"]
        key["sweep_mu"] = settings.sweep_mu
    return key


def cached(cache: common.ResultCache, name: str, seed: int, key: dict, compute):
    """`compute()`'s result, read from or written to `cache`."""
    versioned = {**key, "version": RESULT_VERSION}
    entry = common.settings_key(f"{name}_seed{seed}", versioned)
    result = cache.compute(entry, compute, label=f"{name} seed {seed}")
    maps = [f"{n} {r['map']:.4f}" for n, r in result["test"].items()]
    common.log(f"{name} seed {seed}: test mAP {', '.join(maps)}")
    return result


def run_method(name: str, data: Data, settings: Settings, seed: int) -> dict:
    if name.startswith("uncompressed_"):
        return run_uncompressed(name.split("_", 1)[1], data, settings, seed)
    if name in ("pq", "opq", "lsq"):
        return run_quantizer(name, data, settings, seed)
    if name == "dsh":
        return run_dsh(data, settings, seed)
    return run_subic(
        "2-layer" if name == "subic_2layer" else "3-layer", data, settings, seed
    )


def run_sweep(data: Data, settings: Settings, seed: int, cache, key_base) -> dict:
    """2-layer SuBiC for each γ (μ fixed), with Fig. 3's code statistics."""
    points = []
    for gamma in settings.sweep_gammas:
        name = f"sweep_gamma{gamma:g}"
        key = {**key_base, "method": "sweep", "gamma": gamma}
        shares_table_model = (gamma, settings.sweep_mu) == (
            settings.subic2_gamma,
            settings.subic2_mu,
        )
        if shares_table_model:
            # The table's 2-layer model is this point: share its cached result.
            name, key = "subic_2layer", {**key_base, "method": "subic_2layer"}
        result = cached(
            cache,
            name,
            seed,
            {**key, **method_settings(name, settings)},
            lambda gamma=gamma: run_subic("2-layer", data, settings, seed, gamma),
        )
        points.append(
            {
                "gamma": gamma,
                "mu": settings.sweep_mu,
                "gamma_over_mu": gamma / settings.sweep_mu,
                "shares_table_model": shares_table_model,
                **result,
            }
        )
    return {
        "seed": seed,
        "variant": "2-layer",
        "fixed": f"mu = {settings.sweep_mu:g}, gamma varied",
        "points": points,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.sweep_gammas is not None:
        settings = dataclasses.replace(settings, sweep_gammas=tuple(args.sweep_gammas))
    cache_dir = Path(args.cache_dir) / ("quick" if args.quick else "")
    cache = common.ResultCache(str(cache_dir / "results"))
    output_dir = Path(args.output_dir)
    started = time.perf_counter()

    data = load_data(args, settings, cache_dir)
    key_base = {"data": data.fingerprint, "quick": args.quick}
    methods = {}
    for name in args.methods:
        per_seed = {
            str(seed): cached(
                cache,
                name,
                seed,
                {**key_base, "method": name, **method_settings(name, settings)},
                lambda name=name, seed=seed: run_method(name, data, settings, seed),
            )
            for seed in args.seeds
        }
        methods[name] = {
            "per_seed": per_seed,
            "summary": report_lib.summarize(per_seed),
        }
    sweep = None
    if not args.no_figures:
        sweep = run_sweep(data, settings, args.seeds[0], cache, key_base)
    report = report_lib.report(args, settings, data, methods, sweep)
    report.update(common.run_metadata("cross_domain", *report_lib.PACKAGES))
    report["wall_seconds"] = time.perf_counter() - started
    if sweep is not None:
        report["figures"] = report_lib.write_figures(
            sweep, settings, output_dir, methods
        )
    report_lib.write_outputs(report, output_dir)
    common.log(f"wrote cross_domain.json and cross_domain.md to {output_dir}")
    return report


if __name__ == "__main__":
    main()
