"""The small SuBiC models and the reference argmax that the export tests
share (tests/serving/test_export.py, test_litert_export.py and
tests/cli/test_cli_export.py)."""

from __future__ import annotations

import keras
import numpy as np

from subic_keras import build_subic
from subic_keras.training import standardization

M, K = 4, 16


def reference_codes(z: np.ndarray, num_blocks: int) -> np.ndarray:
    """Per-block argmax in NumPy, whose `argmax` returns the first maximum."""
    return np.argmax(z.reshape(len(z), num_blocks, -1), axis=-1).astype(np.int32)


def tiny_subic(shape=(8, 8, 3), num_classes=3) -> object:
    x = np.random.default_rng(0).integers(0, 256, (32, *shape), dtype=np.uint8)
    backbone = keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Conv2D(4, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
        ]
    )
    return build_subic(
        backbone,
        2,
        4,
        num_classes,
        input_shape=shape,
        preprocessing=standardization(x),
        optimizer=None,
    )
