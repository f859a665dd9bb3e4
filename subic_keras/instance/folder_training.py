"""`train_on_folder`: an instance code fine-tuned on a folder's pictures,
without labels, resumable, and measured before and after on the folder's
own altered copies; `folder_pictures` decodes them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import keras
import numpy as np

from subic_keras._validation import check_int, check_non_negative
from subic_keras.instance.instance_code import InstanceSubic, train_instance
from subic_keras.models.losses import InstanceContrastiveLoss
from subic_keras.trainers.resuming import EpochCheckpoints, run_key


def folder_pictures(
    root: str | os.PathLike, shape: Sequence[int], batch_size: int = 256
) -> tuple[np.ndarray, list]:
    """Every picture under `root` decoded to `shape` (uint8), in path order,
    and the files skipped (`images.image_batches`, within its decode budget)."""
    from subic_keras.data import images
    from subic_keras.data.paths import find_files

    paths, skipped = find_files(root)
    parts = [np.zeros((0, *shape), np.uint8)]
    for batch in images.image_batches(root, paths, shape, batch_size):
        parts.append(batch.pixels)
        skipped += batch.skipped
    return np.concatenate(parts), skipped


def train_on_folder(
    code: InstanceSubic,
    root: str | os.PathLike,
    *,
    epochs: int = 5,
    learning_rate: float = 1e-4,
    batch_size: int = 256,
    seed: int = 0,
    verbose: int | str = "auto",
    checkpoint: str | os.PathLike | None = None,
) -> dict:
    """Fine-tunes an instance code on a folder's pictures, without labels,
    then chooses its copy rules on them (`copies.calibrate`), measuring
    how much better it finds copies of pictures it was not trained on.

    The folder may have any layout: no classes are read. Every picture is
    decoded once to the model's input and held in memory (32 × 32 pictures:
    3 KB each), then trained on as `train_instance` does, at a tenth of the
    rate the code was first trained at, and calibrated: a fifth of the
    pictures (at most 1,000) are copied, and so many others are held out of
    the calibration's database.

    Args:
        code: the instance code to start from (`pretrained()` for the one
            that ships); changed in place and recompiled.
        root: the folder.
        epochs, batch_size, seed: `train_instance`'s.
        learning_rate: Adam's, falling to zero over the epochs.
        verbose: `fit`'s.
        checkpoint: a path stem where every epoch's model is saved
            (`trainers.resuming.EpochCheckpoints`): run again with the same
            code, folder and settings, the training goes on from the last
            epoch that finished; removed at the end.

    Returns:
        `{"pictures", "skipped", "calibration", "loss", "recall",
        "resumed_at"}`: the pictures decoded, the files skipped (with
        reasons), `calibrate`'s result, the last epoch's loss, recall@1 of
        altered copies of a tenth of the pictures (at most 1,000), held out
        of the training, among the whole folder (`"before"` and `"after"`
        the fine-tune), and the epochs done before this run (0 unless
        resumed).

    Raises:
        ValueError: for a folder of fewer than 10 pictures.
    """
    shape = tuple(code.model.input_shape[1:])
    pictures, skipped = folder_pictures(root, shape)
    if len(pictures) < 10:
        raise ValueError(
            f"the folder holds {len(pictures)} pictures that decode; an instance "
            "code is trained on 10 or more"
        )
    check_non_negative("learning_rate", learning_rate)
    from subic_keras.instance import copies
    from subic_keras.instance.folder_rules import copy_recall

    # A tenth of the pictures (at most 1,000) held out of the training: their
    # altered copies, searched among the whole folder before and after.
    order = np.random.default_rng(seed).permutation(len(pictures))
    held = np.sort(order[: min(1000, len(pictures) // 10)])
    trained = np.sort(order[len(held) :])
    batch_size = min(check_int("batch_size", batch_size, minimum=2), len(trained))
    settings = {
        "epochs": epochs,
        "lr": learning_rate,
        "batch": batch_size,
        "seed": seed,
    }
    checkpoints = None
    done: int = 0
    recall: dict = {}
    if checkpoint is not None:
        key = run_key(code.model, pictures, settings)
        checkpoints = EpochCheckpoints(checkpoint, key)
        done, model, recall = checkpoints.resume(code.model)
        code.model, code._query_model = model, None
    if not done:
        recall = {"before": copy_recall(code, pictures, held, seed=seed + 2)}
        if checkpoints is not None:
            checkpoints.remember(**recall)
        code.model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=InstanceContrastiveLoss(code.num_blocks, code.block_size),
        )
    history = train_instance(
        code,
        pictures[trained],
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        verbose=verbose,
        callbacks=[] if checkpoints is None else [checkpoints],
        # A run stopped after its last epoch, before its end: that epoch again.
        initial_epoch=min(done, epochs - 1),
    )
    if checkpoints is not None:
        checkpoints.finish()
    recall["after"] = copy_recall(code, pictures, held, seed=seed + 2)
    recall["held_out"] = len(held)

    calibration = copies.calibrate(
        code, pictures, queries=min(1000, len(pictures) // 5), seed=seed + 1
    )
    return {
        "pictures": len(pictures),
        "skipped": skipped,
        "calibration": calibration,
        "loss": float(history.history["loss"][-1]),
        "recall": recall,
        "resumed_at": done,
    }
