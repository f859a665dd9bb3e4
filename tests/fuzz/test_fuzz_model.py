"""Fuzz cases of pictures through a model (the Python API and the TF Serving
signatures, checked inside the graph) and of the command line: a user's
mistake is one line, exit status 2, no traceback."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fuzzing import INDEX_ERROR, SCALE, SHAPE, Case, Cases, K, M, run_case

from subic_keras.cli import main

CASES = Cases()
case = CASES.add


# Images through the model: one convention ---------------------------------


def _encode_check(result, world, images):
    expected = world["subic"].encode(images.astype(np.float32) / 255)
    np.testing.assert_array_equal(result, expected)


for _seed in range(20 * SCALE):
    _images = np.random.default_rng(_seed).integers(
        0, 256, (int(_seed % 5) + 1, *SHAPE), dtype=np.uint8
    )
    case(
        f"encode-uint8-{_seed}",
        check=lambda result, world, x=_images: _encode_check(result, world, x),
    )(lambda world, x=_images: world["subic"].encode(x))

_BAD_IMAGES = [
    (lambda r: r.random((2, 8, 8, 1)), ValueError, "shape (n, 8, 8, 3)"),
    (lambda r: r.random((2, 8, 8)), ValueError, "shape (n, 8, 8, 3)"),
    (lambda r: r.random((2, 9, 8, 3)), ValueError, "shape (n, 8, 8, 3)"),
    (lambda r: r.random(3), ValueError, "shape (n, 8, 8, 3)"),
    (
        lambda r: np.where(r.random((2, *SHAPE)) < 0.05, np.nan, 0.5),
        ValueError,
        "images must be finite",
    ),
    (lambda r: np.full((2, *SHAPE), -np.inf), ValueError, "images must be finite"),
    (lambda r: r.integers(0, 9, (2, *SHAPE)), TypeError, "uint8"),
    (lambda r: r.random((2, *SHAPE)).astype(str), TypeError, "uint8"),
]
for _seed in range(3 * SCALE):
    for _i, (_make, _error, _fragment) in enumerate(_BAD_IMAGES):
        for _method in ("encode", "query"):
            case(f"{_method}-bad-{_i}-{_seed}", _error, _fragment)(
                lambda world, make=_make, seed=_seed, method=_method: getattr(
                    world["subic"], method
                )(make(np.random.default_rng(seed)))
            )
case("encode-empty", check=lambda result, world: result.shape == (0, M))(
    lambda world: world["subic"].encode(np.zeros((0, *SHAPE), np.uint8))
)


# The serving signatures: checked inside the graph ----------------------------


def _served(world):
    """The world's model exported for TF Serving, loaded (once)."""
    if "served" not in world:
        import tensorflow as tf

        from subic_keras.serving.export import export_saved_model

        path = export_saved_model(world["subic"], str(world["root"] / "serving"))
        world["served"] = tf.saved_model.load(path).signatures
    return world["served"]


def _serve(signature: str, make: Callable):
    def run(world):
        import tensorflow as tf

        feed = make(np.random.default_rng(len(signature)))
        name = "image_bytes" if signature == "encode_images" else "images"
        return _served(world)[signature](**{name: tf.constant(feed)})

    return run


_SHAPE_ERROR = "is not compatible with expected shape [?,8,8,3]"
_BAD_SERVING_FEEDS = [
    (lambda r: r.random((8, 8, 3)), _SHAPE_ERROR),
    (lambda r: r.random((2, 8, 8, 1)), _SHAPE_ERROR),
    (lambda r: r.random((2, 8, 8, 4)), _SHAPE_ERROR),
    (lambda r: r.random((2, 9, 8, 3)), _SHAPE_ERROR),
    (lambda r: r.random((1, 2, 8, 8, 3)), _SHAPE_ERROR),
]
for _i, (_make, _fragment) in enumerate(_BAD_SERVING_FEEDS):
    for _signature in ("serving_default", "classify"):
        case(
            f"serving-{_signature}-shape-{_i}",
            "tensorflow.errors.InvalidArgumentError",
            _fragment,
        )(_serve(_signature, lambda r, make=_make: make(r).astype(np.float32)))


def _serving_check(images):
    def check(result, world):
        expected = world["subic"].encode(images)
        np.testing.assert_array_equal(result["codes"].numpy(), expected)
        z = world["subic"].query(images, kind="fc0")
        np.testing.assert_allclose(result["query"].numpy(), z, rtol=1e-5, atol=1e-6)

    return check


def _png_bytes(images):
    import tensorflow as tf

    return [tf.io.encode_png(image).numpy() for image in images]


for _seed in range(5 * SCALE):
    _images = np.random.default_rng(100 + _seed).integers(
        0, 256, (_seed % 3 + 1, *SHAPE), dtype=np.uint8
    )
    case(f"serving-floats-{_seed}", check=_serving_check(_images))(
        _serve("serving_default", lambda r, x=_images: x.astype(np.float32) / 255)
    )
    case(f"serving-png-{_seed}", check=_serving_check(_images))(
        _serve("encode_images", lambda r, x=_images: _png_bytes(x))
    )
    # A NaN pixel still gives codes inside [0, K) (BlockArgmax).
    case(
        f"serving-nan-{_seed}",
        check=lambda result, world: bool(
            ((result["codes"].numpy() >= 0) & (result["codes"].numpy() < K)).all()
        ),
    )(
        _serve(
            "serving_default",
            lambda r: np.where(r.random((2, *SHAPE)) < 0.1, np.nan, 0.5).astype(
                np.float32
            ),
        )
    )
case(
    "serving-empty",
    check=lambda result, world: result["codes"].shape == (0, M),
)(_serve("serving_default", lambda r: np.zeros((0, *SHAPE), np.float32)))
_BAD_BYTES = [
    (lambda r: [b"junk"], "Unknown image file format"),
    (lambda r: [r.bytes(64)], "Unknown image file format"),
    (lambda r: [b""], "Input is empty"),
    (lambda r: [_png_bytes(r.integers(0, 256, (1, *SHAPE), np.uint8))[0][:-12]], "PNG"),
    (lambda r: [_png_bytes(r.integers(0, 256, (1, *SHAPE), np.uint8))[0][:40]], "PNG"),
    (lambda r: [[b"x"]], "tensor image_bytes"),
]
for _i, (_make, _fragment) in enumerate(_BAD_BYTES):
    case(
        f"serving-bytes-{_i}",
        "tensorflow.errors.InvalidArgumentError",
        _fragment,
    )(_serve("encode_images", _make))


# The command line: one line, status 2, no traceback -----------------------


def _cli(arguments: Callable[[dict], list[str]]):
    def run(world):
        main(arguments(world))

    return run


def _build_digits(w):
    return ["index", "build", w["model"], "--dataset", "digits", "--output"]


_CLI_CASES = [
    (lambda w: ["search", "missing.keras", w["index_path"], w["queries"]], "not found"),
    (lambda w: ["search", str(w["root"]), w["index_path"], w["queries"]], "directory"),
    (lambda w: ["search", w["index_path"], w["index_path"], w["queries"]], "Keras"),
    (lambda w: ["search", w["model"], w["model"], w["queries"]], INDEX_ERROR),
    (lambda w: ["search", w["model"], str(w["root"]), w["queries"]], "directory"),
    (lambda w: ["search", w["model"], w["index_path"], w["model"]], "not a picture"),
    (lambda w: ["search", w["model"], w["index_path"], str(w["root"])], "directory"),
    (lambda w: ["search", w["model"], w["index_path"], w["queries"], "-k", "0"], "-k"),
    (
        lambda w: [*_build_digits(w), str(w["root"] / "digits.subic")],
        "images must have shape (n, 8, 8, 3), received (599, 8, 8, 1)",
    ),
    (lambda w: [*_build_digits(w), str(w["root"])], "a directory, not an output file"),
    (
        lambda w: [
            "evaluate",
            w["model"],
            "--dataset",
            "cifar10",
            "--data-dir",
            str(w["root"] / "none"),
        ],
        "none",
    ),
    (
        lambda w: ["export", w["model"], "--output-dir", w["index_path"]],
        "--output-dir is not a directory",
    ),
    (lambda w: ["train", "--epochs", "0"], "epochs must be >= 1"),
    (lambda w: ["train", "--block-size", "3"], "power of two"),
]
for _i, (_arguments, _fragment) in enumerate(_CLI_CASES):
    case(f"cli-{_i}", SystemExit, _fragment)(_cli(_arguments))


def test_there_are_enough_cases():
    assert len(CASES) >= 110 * SCALE
    assert len(set(CASES.ids())) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=CASES.ids())
def test_case(case: Case, world, capsys, record_property):
    run_case(case, world, capsys, record_property)
