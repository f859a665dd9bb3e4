"""Training of the hashing baselines with SuBiC's recipe, like for like.

`train_hashing` fits a `HashingNetwork` (DSH, DLBHC) the way
`subic_keras.trainers.recipe.train_subic` fits SuBiC's second stage: the same input
pipeline and augmentation, Adam with the learning rate divided by 10 after
75% of the steps, and the epoch with the best validation retrieval mAP
(Hamming ranking, pessimistic ties) kept. A comparison of the methods then
differs only in the method. Pre-train the backbone first with
`subic_keras.trainers.recipe.pretrain_backbone` to match the recipe's stage 1.
"""

from __future__ import annotations

import time

import keras

from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.trainers.callbacks import BestWeights, RetrievalValidation
from subic_keras.trainers.recipe import Recipe, check_data


def train_hashing(
    network: HashingNetwork,
    images,
    labels,
    validation: tuple,
    *,
    recipe: Recipe | None = None,
    seed: int = 0,
    callbacks=(),
    verbose: int | str = 0,
) -> dict:
    """Fits a hashing baseline in place and keeps its best validation epoch.

    Example:

    >>> from subic_keras.baselines import build_dsh
    >>> dsh = build_dsh(backbones.dsh_cnn(), bits=48)
    >>> summary = train_hashing(dsh, images[:40], labels[:40],
    ...                         (images[40:], labels[40:]), recipe=Recipe(epochs=1))
    >>> bits = dsh.encode(images / 255)
    >>> bits.shape, summary["epochs_run"]
    ((64, 48), 1)

    Args:
        network: a built `HashingNetwork` (`build_dsh`, `build_dlbhc`),
            whose `train_model` is compiled here.
        images, labels: the training inputs (uint8 images or float inputs)
            and their class ids, or a stream of `(image, label)` pairs and
            `labels=None` (`subic_keras.data.streams`).
        validation: `(images, labels)` held out for model selection (>= 20),
            or a stream of `(image, label)` pairs.
        recipe: `epochs`, `learning_rate`, `batch_size` and `augment` are
            used (the SuBiC stage's budget and schedule); `None` means
            `Recipe()`, the validated defaults.
        seed: seed of the data order and augmentation.
        callbacks: more Keras callbacks for `fit`.
        verbose: `fit`'s verbosity; the default 0 prints nothing, `"auto"`
            shows Keras's progress bar as `model.fit` does.

    Returns:
        A JSON-ready summary: `best_epoch` (1-based; `None` if no epoch had
        finite values), `best_validation_map`, `validation_map_per_epoch`,
        `epochs_run` and `train_seconds`.

    Raises:
        TypeError: if `network` is not a `HashingNetwork`.
        ValueError: for inputs `RetrievalValidation` or `fit_dataset` reject.
    """
    if not isinstance(network, HashingNetwork):
        raise TypeError(
            f"network must be a HashingNetwork, received {type(network).__name__}"
        )
    recipe = Recipe() if recipe is None else recipe
    start = time.time()
    training, held_out, _, _ = check_data(images, labels, validation, classifies=False)
    validator = RetrievalValidation(
        network, held_out.images, held_out.fit_labels, queries=None
    )
    selector = BestWeights("val_map", mode="max")
    network.compile(training.optimizer(recipe, recipe.epochs))
    history = network.train_model.fit(
        training.training_batches(recipe, seed),
        epochs=recipe.epochs,
        callbacks=[validator, selector, keras.callbacks.TerminateOnNaN(), *callbacks],
        verbose=verbose,
        shuffle=False,
    )
    best = selector.best_epoch
    return {
        "best_epoch": None if best is None else best + 1,
        "best_validation_map": None if best is None else float(selector.best),
        "validation_map_per_epoch": [
            float(v) for v in history.history.get("val_map", [])
        ],
        "epochs_run": len(history.history.get("loss", [])),
        "train_seconds": round(time.time() - start, 1),
    }
