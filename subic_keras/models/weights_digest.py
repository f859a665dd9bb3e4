"""The digest of a `.keras` file's weights, read without TensorFlow.

An index records the model that wrote its codes (`retrieval.model_record`):
a digest computed by Keras from the loaded model, and this one, computed
from the file's `model.weights.h5` alone, so that the command line can tell
a model that is not the index's before TensorFlow loads (a second or more).
Only the layers' variables count, not the optimizer's: a model saved with
and without its optimizer state has one weights digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import numpy as np

# The largest weights file read for the digest (larger: no digest, and the
# model is checked once loaded, as before).
MAX_WEIGHTS_BYTES = 1 << 30


def weights_digest(path: str | os.PathLike) -> str | None:
    """SHA-256 of the layers' variables in a `.keras` file, each named by
    its path in `model.weights.h5`, in name order; None for a file that is
    not a readable `.keras` archive of at most `MAX_WEIGHTS_BYTES` weights.

    Example:

    >>> inputs = keras.Input((3,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    >>> model.save("a.keras")
    >>> model.compile("adam", "mse")
    >>> model.save("b.keras")                 # with the optimizer's state
    >>> weights_digest("a.keras") == weights_digest("b.keras")
    True
    """
    try:
        with zipfile.ZipFile(os.fspath(path)) as archive:
            info = archive.getinfo("model.weights.h5")
            if info.file_size > MAX_WEIGHTS_BYTES:
                return None
            data = archive.read(info)
        import h5py  # Keras's own reader of the file: no TensorFlow

        digest = hashlib.sha256()

        def add(name: str, item) -> None:
            if isinstance(item, h5py.Dataset):
                value = np.ascontiguousarray(item[()])
                digest.update(f"{name} {value.dtype} {value.shape}".encode())
                digest.update(value.tobytes())

        with h5py.File(io.BytesIO(data), "r") as weights:
            if "layers" not in weights:
                return None
            weights["layers"].visititems(add)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, RuntimeError):
        return None
    return digest.hexdigest()


def block_shape(path: str | os.PathLike) -> tuple[int, int] | None:
    """`(M, K)` of the `BlockSoftmax` layer a `.keras` file's configuration
    holds, read without TensorFlow; None where it holds none (or one is
    not found).

    Example:

    >>> subic = build_subic(backbones.dsh_cnn(), 4, 16, 10)
    >>> subic.train_model.save("m.keras")
    >>> block_shape("m.keras")
    (4, 16)
    """
    try:
        with zipfile.ZipFile(os.fspath(path)) as archive:
            info = archive.getinfo("config.json")
            if info.file_size > 64 << 20:
                return None
            config = json.loads(archive.read(info))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    found: list[tuple[int, int]] = []
    stack = [config]
    while stack:  # (iterative: a crafted file's nesting is no recursion)
        item = stack.pop()
        if isinstance(item, dict):
            layer = item.get("config")
            if item.get("class_name") == "BlockSoftmax" and isinstance(layer, dict):
                blocks, size = layer.get("num_blocks"), layer.get("block_size")
                if isinstance(blocks, int) and isinstance(size, int):
                    found.append((blocks, size))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    shapes = set(found)
    return shapes.pop() if len(shapes) == 1 else None
