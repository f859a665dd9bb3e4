"""SuBiC's training recipe: pre-train the backbone as a classifier, then SuBiC.

The recipe behind our CIFAR-10 numbers (the paper's Table 2 set-up) and the
defaults of `subic train`:

1. **Pre-training** (`pretrain_backbone`): the backbone plus one softmax
   layer is trained as a plain classifier with cross-entropy, and the epoch
   with the best validation accuracy is kept. It is cached by everything
   it depends on (backbone architecture and initial weights, preprocessing,
   data, budget, seed), and resumes after an interruption.
2. **SuBiC** (`train_subic`): SuBiC's head (`build_subic`: FC0, block
   softmax, FC1) on the pre-trained backbone, trained end to end with the
   loss of Eq. 8, the entropy weights ramped in over the first third of
   the epochs (`callbacks.EntropyWarmup`); after every epoch the codes are
   scored by retrieval mAP on the validation split
   (`callbacks.RetrievalValidation`) and the best epoch is kept
   (`callbacks.BestWeights`). The query, the paper's `z*` (Sec. 3.3) or the
   class-posterior `W₁ s*`, is then chosen by validation mAP and saved with
   the model (`Subic.default_query`).

Every stage is a plain `model.fit` with callbacks, so a Keras user can run
either stage with their own training code.

How the defaults (`Recipe`) were chosen, all on a validation split of the
training set (never the test set), with the DSH CNN on CIFAR-10:

- `pretrain_epochs=100`: twice the earlier 50 raised the validation mAP
  on each of 3 seeds (0.7105 / 0.7098 / 0.7225 to 0.7405 / 0.7250 /
  0.7473, 8 blocks of 64) and the test mAP from 0.7340 ± 0.0008 to 0.7469
  ± 0.0047 (`benchmarks/results/train_recipe_p50.json`,
  `train_recipe_k64.json`); 30 epochs had been 0.032 below 50. On classes
  held out of training, at the reduced budget of that benchmark (split 0,
  48 bits), 16 pre-training epochs instead of 8 left SuBiC's mAP where it
  was (0.4041 against 0.4046, `unseen_classes_p16.json`) and raised the
  standard protocol's (0.6325 against 0.5605).
- `epochs=5`: SuBiC's own stage settles within a few epochs once the
  backbone is trained; 10 epochs on the same backbone (`subic train
  --dataset cifar10 --block-size 64 --epochs 10`, seed 0) ended at a
  validation mAP of 0.7280, below 5 epochs' 0.7405.
- `gamma=mu=0.3`: the best of a sweep over {0.03, 0.1, 0.3} after
  pre-training (an earlier sweep over {0.1, 0.3, 1, 3} found the weak end
  best); the paper uses `γ = μ = 1` from scratch (Sec. 4), which on our
  machines saturates the blocks before the classifier learns.
- `warmup_fraction=1/3`: with full weights from the first step the blocks
  saturate to one-hot within an epoch and training stalls.
- `learning_rate=1e-3` (Adam, ×0.1 after 75% of the steps): 3e-4 was worse.
- `batch_size=200`: the paper's (Sec. 4).
- `augment=True`: random flips and shifts of up to 4 pixels; turn it off
  for inputs that are not natural images (features, 8×8 digits).

With these defaults and `subic train`'s code (`TrainConfig`: 12 blocks of
`K = 16`, 48 bits), CIFAR-10's strict mAP (paper protocol, Sec. 4.1, with
pessimistic ties) is 0.7555 ± 0.0042 at 48 bits over 3 seeds
(`benchmarks/results/train_recipe.json`), above the paper's 0.686 (Table
2). Blocks of 16 were chosen over 8 blocks of 64 on the same pre-trained
backbones: validation mAP 0.7394 / 0.7403 / 0.7495 against 0.7405 /
0.7250 / 0.7473 (higher on two seeds of three, and by 0.0055 on average),
test mAP 0.7555 against 0.7469; on classes held out of training (three
splits, reduced budget) 0.424 against 0.411, where DSH reaches 0.386, a
classifier's one-hot prediction 0.303, PQ and OPQ of the same backbone's
features 0.418 and 0.422 (Sablayrolles et al., ICASSP 2017). With these
defaults' whole budget (split 0, `benchmarks/results/unseen_classes_full.json`)
SuBiC's `z` reaches 0.416 on held-out classes at 48 bits, ahead of DSH
(0.387), OPQ (0.387), PQ (0.384) and the one-hot prediction (0.287), and
0.409 at 24 bits (OPQ 0.389). Blocks of 16 cost no more to search: at
48 bits, every native kernel scans 12 blocks of 16 at least as fast as 8
blocks of 64 ("Search speed at 12 blocks of 16" in
`benchmarks/results/RESULTS.md`, and docs/search.md).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings

import keras
import numpy as np

from subic_keras._validation import check_block_shape
from subic_keras.config import QUERY_KINDS
from subic_keras.config import Recipe as Recipe
from subic_keras.models.building import build_subic
from subic_keras.models.subic import Subic
from subic_keras.trainers.callbacks import (
    BestWeights,
    EntropyWarmup,
    RetrievalValidation,
)
from subic_keras.trainers.pretraining import _fresh_copy
from subic_keras.trainers.pretraining import pretrain_backbone as pretrain_backbone
from subic_keras.trainers.training_data import check_data as check_data
from subic_keras.trainers.training_data import fit_dataset as fit_dataset
from subic_keras.trainers.training_data import (
    learning_rate_schedule as learning_rate_schedule,
)
from subic_keras.trainers.training_data import stage_optimizer as stage_optimizer

# The validation pictures that model selection needs (`train_subic`).
MIN_VALIDATION = 20


def train_subic(
    backbone: keras.layers.Layer,
    num_blocks: int,
    block_size: int,
    images,
    labels,
    validation: tuple,
    *,
    num_classes: int | None = None,
    recipe: Recipe = Recipe(),
    seed: int = 0,
    preprocessing: keras.layers.Layer | None = None,
    input_shape: tuple[int, ...] | None = None,
    cache_dir: str | None = None,
    pretrain_callbacks=(),
    callbacks=(),
    verbose: int | str = 0,
) -> tuple[Subic, dict]:
    """Trains SuBiC with the two-stage recipe (module docstring).

    Stage 1 (`pretrain_backbone`, skipped when `recipe.pretrain_epochs` is
    0) trains `backbone` in place. Stage 2 re-seeds the random generators
    with `seed`, copies the backbone's architecture with fresh layers and
    the pre-trained weights (so the head's initial weights do not depend on
    whether stage 1 ran or came from the cache), builds SuBiC on it
    (`build_subic` with `recipe.gamma`, `recipe.mu`) and fits it with the
    entropy warm-up, keeping the epoch with the best validation mAP of the
    paper's query `z*`. The query kind with the higher validation mAP at that
    epoch becomes the model's `default_query`.

    Example:

    >>> subic, summary = train_subic(
    ...     backbones.dsh_cnn(), 8, 64, images[:40], labels[:40],
    ...     (images[40:], labels[40:]), recipe=Recipe(pretrain_epochs=1, epochs=1))
    >>> codes = subic.encode(images / 255)
    >>> queries = subic.query(images / 255)   # the kind chosen on validation
    >>> codes.shape, queries.shape, summary["query"] in QUERY_KINDS
    ((64, 8), (64, 512), True)

    `Recipe()`'s budgets are the validated defaults for CIFAR-10-sized data;
    the small ones above only keep the example short.

    Args:
        backbone: a Keras model mapping inputs to feature vectors: any of
            `subic_keras.models.backbones` or your own.
        num_blocks, block_size: `M` and `K`; codes have `M·log2 K` bits.
        images, labels: the training inputs (uint8 images, or float inputs
            such as features) and their class ids; or a stream of
            `(image, label)` pairs, batched or not, and `labels=None`
            (`subic_keras.data.streams`: read in its own order, so shuffle it).
        validation: `(images, labels)` held out from training, for model
            selection (at least 20), or a stream of `(image, label)` pairs.
        num_classes: number of classes; from the labels if `None`.
        recipe: the budgets and weights (`Recipe()`: our validated defaults);
            `batch_size` batches unbatched streams.
        seed: seed of the initial weights, data order and augmentation.
        preprocessing: a layer applied to the inputs before the backbone,
            saved with the model (e.g. `keras.layers.Normalization`).
        input_shape: the input shape, if the backbone does not define one.
        cache_dir: cache of the pre-training (`pretrain_backbone`).
        pretrain_callbacks, callbacks: more Keras callbacks for the two
            stages' `fit`.
        verbose: `fit`'s verbosity; the default 0 prints nothing, `"auto"`
            shows Keras's progress bar as `model.fit` does.

    Returns:
        `(subic, summary)`: the trained `Subic` (best validation epoch,
        query chosen) and a JSON-ready summary of both stages.
    """
    start = time.time()
    num_blocks, block_size = check_block_shape(num_blocks, block_size)
    training, held_out, num_classes, input_shape = check_data(
        images, labels, validation, num_classes, input_shape
    )
    _check_held_out(held_out)
    pretraining = None
    if recipe.pretrain_epochs:
        pretraining = pretrain_backbone(
            backbone,
            images,
            labels,
            validation,
            num_classes=num_classes,
            recipe=recipe,
            seed=seed,
            preprocessing=preprocessing,
            input_shape=input_shape,
            cache_dir=cache_dir,
            callbacks=pretrain_callbacks,
            verbose=verbose,
        )

    stage_start = time.time()
    subic = _subic_on_copy(
        backbone, num_blocks, block_size, num_classes, recipe, seed,
        preprocessing, input_shape,
    )  # fmt: skip
    history, selector = _fit(
        subic, training, held_out, recipe, seed, callbacks, verbose
    )
    summary = _summary(subic, history, selector, recipe, seed, num_classes)
    summary["pretrain"] = pretraining
    summary["subic_train_seconds"] = round(time.time() - stage_start, 1)
    summary["train_seconds"] = round(time.time() - start, 1)
    warning = learned_little(summary, held_out.labels)
    if warning is not None:
        summary["warning"] = warning
        warnings.warn(warning, LearnedLittleWarning, stacklevel=2)
    return subic, summary


def _check_held_out(held_out) -> None:
    if len(held_out) < MIN_VALIDATION:
        raise ValueError(
            f"validation must hold at least {MIN_VALIDATION} images for model "
            f"selection, received {len(held_out)} (hold out more: subic "
            "train's --validation-size, or more pictures)"
        )


def _subic_on_copy(
    backbone, num_blocks, block_size, num_classes, recipe, seed, preprocessing,
    input_shape,
) -> Subic:  # fmt: skip
    """SuBiC on a fresh copy of `backbone` with its weights, the random
    generators re-seeded: the head's initial weights do not depend on
    whether stage 1 ran or came from the cache."""
    keras.utils.set_random_seed(seed)
    fresh = _fresh_copy(backbone)
    fresh.set_weights(backbone.get_weights())
    return build_subic(
        fresh,
        num_blocks,
        block_size,
        num_classes,
        gamma=recipe.gamma,
        mu=recipe.mu,
        input_shape=input_shape,
        preprocessing=_fresh_copy(preprocessing),
        optimizer=None,
    )


def _fit(subic, training, held_out, recipe, seed, callbacks, verbose):
    """Stage 2's `fit`, with the entropy warm-up, keeping the epoch of the
    best validation mAP of the paper's query: `(history, selector)`."""
    subic.compile(training.optimizer(recipe, recipe.epochs))
    validator = RetrievalValidation(
        subic, held_out.images, held_out.fit_labels, queries=QUERY_KINDS
    )
    selector = BestWeights(f"val_map_{QUERY_KINDS[0]}", mode="max")
    history = subic.train_model.fit(
        training.training_batches(recipe, seed),
        validation_data=held_out.validation_batches(seed),
        epochs=recipe.epochs,
        callbacks=[
            EntropyWarmup(recipe.warmup_epochs),
            validator,
            selector,
            keras.callbacks.TerminateOnNaN(),
            *callbacks,
        ],
        verbose=verbose,
        shuffle=False,
    )
    return history, selector


def _summary(subic, history, selector, recipe, seed, num_classes) -> dict:
    """Stage 2's summary; sets `subic.default_query`, the query kind with the
    higher validation mAP at the best epoch."""
    losses = history.history.get("loss", [])
    summary = {
        "pretrain": None,
        "recipe": dataclasses.asdict(recipe),
        "seed": seed,
        "num_blocks": subic.num_blocks,
        "block_size": subic.block_size,
        "bits": subic.num_blocks * int(math.log2(subic.block_size)),
        "num_classes": num_classes,
        "epochs_run": len(losses),
        # TerminateOnNaN ends the epoch it stops in with a NaN loss.
        "stopped_on_nan": bool(losses) and not math.isfinite(losses[-1]),
        "best_epoch": None,
        "query": None,
    }
    if selector.best_epoch is not None:
        at_best = {kind: selector.best_logs[f"val_map_{kind}"] for kind in QUERY_KINDS}
        subic.default_query = max(QUERY_KINDS, key=lambda kind: at_best[kind])
        summary.update(
            best_epoch=selector.best_epoch + 1,
            validation_map=at_best,
            query=subic.default_query,
        )
    summary["validation_map_per_epoch"] = {
        kind: [float(v) for v in history.history.get(f"val_map_{kind}", [])]
        for kind in QUERY_KINDS
    }
    return summary


class LearnedLittleWarning(UserWarning):
    """A training whose model does barely better than chance."""


# How close to chance a trained model may come before it is said to have
# learned little: a few points of accuracy or of mAP.
CHANCE_MARGIN = 0.05


def learned_little(summary: dict, labels) -> str | None:
    """The warning a training near chance level deserves, or None.

    Chance is the accuracy of always answering the largest validation
    class, and the mAP of a random ranking (the mean share of a query's
    class among the validation items). The pre-training's best validation
    accuracy, or SuBiC's best validation mAP, within `CHANCE_MARGIN` of
    them means the network learned little.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not len(labels):
        return None
    shares = np.bincount(labels.astype(np.int64)) / len(labels)
    chance_accuracy, random_map = float(shares.max()), float((shares**2).sum())
    figures = []
    pretraining = summary.get("pretrain") or {}
    accuracy = pretraining.get("best_validation_accuracy")
    if accuracy is not None and accuracy <= chance_accuracy + CHANCE_MARGIN:
        figures.append(
            f"validation accuracy {accuracy:.4f} against {chance_accuracy:.4f} "
            f"for chance ({len(shares)} classes)"
        )
    maps = summary.get("validation_map") or {}
    if maps and max(maps.values()) <= random_map + CHANCE_MARGIN:
        figures.append(
            f"validation mAP {max(maps.values()):.4f} against {random_map:.4f} "
            "for a random ranking"
        )
    if not figures:
        return None
    return (
        "the model learned little: "
        + ", ".join(figures)
        + f". Likely causes: too few pictures for a network trained from "
        f"scratch ({len(labels)} validated here), no pretrained weights "
        "(`--weights imagenet` or a weights file for a keras.applications "
        "backbone), or a learning rate too high or too low"
    )
