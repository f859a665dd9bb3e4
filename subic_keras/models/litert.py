"""LiteRT files, run on CPU: the interpreter, and the encoder that
`export.export_litert` writes run on pictures (`run_litert`)."""

from __future__ import annotations

import os

import numpy as np

from subic_keras._validation import check_finite, check_int
from subic_keras.data.pixels import PIXEL_LEVELS


def interpreter_class():
    """LiteRT's interpreter, or TensorFlow's where `ai-edge-litert` is absent."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - ai-edge-litert is a dependency
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter


def run_litert(
    path: str,
    images: np.ndarray,
    batch_size: int = 256,
    num_threads: int | None = None,
) -> dict[str, np.ndarray]:
    """Encodes images with a LiteRT file written by `export_litert`.

    Example:

    >>> from subic_keras.serving.export import export_litert
    >>> path = export_litert(build_subic(backbones.dsh_cnn(), 8, 64, 10),
    ...                      "subic.tflite")
    >>> outputs = run_litert(path, images)   # uint8 RGB `(64, 32, 32, 3)`
    >>> outputs["codes"].shape, outputs["query"].shape
    ((64, 8), (64, 512))

    Args:
        path: the `.tflite` file.
        images: `(n, H, W, C)`, uint8 in `[0, 255]` or float in `[0, 1]`.
        batch_size: images per interpreter call.
        num_threads: the interpreter's CPU threads (its default when None).

    Returns:
        `{"codes": int32 (n, M), "query": float32 (n, M·K), "class_query":
        float32 (n, M·K)}` (no `class_query` from files exported before it
        existed).
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    images = np.asarray(images)
    if images.dtype == np.uint8:
        images = PIXEL_LEVELS[images]
    elif images.dtype.kind != "f":
        raise TypeError(f"images must be uint8 or float, received dtype {images.dtype}")
    images = images.astype(np.float32, copy=False)
    Interpreter = interpreter_class()
    interpreter = Interpreter(model_path=os.fspath(path), num_threads=num_threads)
    runner = interpreter.get_signature_runner("serving_default")
    expected = tuple(int(d) for d in runner.get_input_details()["images"]["shape"][1:])
    if images.shape[1:] != expected or images.ndim != 4:
        raise ValueError(
            f"images must have shape (n, {', '.join(map(str, expected))}) for "
            f"{os.fspath(path)!r}, received {images.shape}"
        )
    check_finite("images", images)
    if not len(images):
        return {
            name: np.zeros((0, *details["shape"][1:]), details["dtype"])
            for name, details in runner.get_output_details().items()
        }
    outputs = [
        runner(images=images[start : start + batch_size])
        for start in range(0, len(images), batch_size)
    ]
    return {
        name: np.concatenate([out[name] for out in outputs])
        for name in ("codes", "query", "class_query")
        if name in outputs[0]
    }
