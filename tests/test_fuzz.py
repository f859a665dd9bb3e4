"""Bad input, generated: every case states its outcome, the correct result or
a named exception with a fragment of its message.

Seeded and fast in the default run; `SUBIC_FUZZ_SCALE=10` multiplies the
generated cases for a longer run. The cases cover the Python API, index
files, `.keras` files, `.npy` and image query files, the command line (a
user's mistake is one line, exit status 2, no traceback), the serving
signatures, and data files that try to run code.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import zipfile
from collections.abc import Callable

import keras
import numpy as np
import pytest

from subic_keras import build_subic
from subic_keras.cli import main
from subic_keras.cli.search_commands import _read_query_images
from subic_keras.search import ShardedSubicIndex, SubicIndex
from subic_keras.serving.export import load_subic

SCALE = int(os.environ.get("SUBIC_FUZZ_SCALE", "1"))
M, K = 4, 16
SHAPE = (8, 8, 3)


@dataclasses.dataclass(frozen=True)
class Case:
    """`run(world)` must return normally (and `check` its result), or raise
    `error` with `fragment` in its message."""

    name: str
    run: Callable
    error: type[BaseException] | tuple | str | None = None
    fragment: str = ""
    check: Callable | None = None


CASES: list[Case] = []


def case(name, error=None, fragment="", check=None):
    def add(run):
        CASES.append(Case(name, run, error, fragment, check))
        return run

    return add


# The world the cases act on ----------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([keras.Input(SHAPE), keras.layers.Flatten()])
    subic = build_subic(backbone, M, K, num_classes=3, input_shape=SHAPE)
    model_path = root / "model.keras"
    subic.train_model.save(model_path)
    rng = np.random.default_rng(0)
    index = SubicIndex(M, K)
    index.add(rng.integers(0, K, (300, M)), ids=np.arange(300) * 7)
    index_path = root / "db.subic"
    index.save(index_path)
    images = rng.integers(0, 256, (6, *SHAPE), dtype=np.uint8)
    np.save(root / "queries.npy", images)
    return {
        "root": root,
        "subic": subic,
        "model": str(model_path),
        "model_bytes": model_path.read_bytes(),
        "index": index,
        "index_path": str(index_path),
        "index_bytes": index_path.read_bytes(),
        "images": images,
        "queries": str(root / "queries.npy"),
    }


def _write(world, name: str, data: bytes) -> str:
    path = world["root"] / name
    path.write_bytes(data)
    return str(path)


# Index files: any change is refused, never read as other codes ------------

_INDEX_ERROR = "not a valid SuBiC index file"


def _mutated_index(seed: int, kind: str):
    def run(world):
        rng = np.random.default_rng(seed)
        data = bytearray(world["index_bytes"])
        if kind == "flip":
            for at in rng.integers(0, len(data), rng.integers(1, 5)):
                data[at] ^= int(rng.integers(1, 256))
        elif kind == "truncate":
            data = data[: int(rng.integers(0, len(data)))]
        elif kind == "extend":
            data += bytes(rng.integers(0, 256, int(rng.integers(1, 64)), np.uint8))
        elif kind == "header":  # a size field claiming up to 2**63 items
            at = int(rng.choice([12, 16, 20, 24, 32, 36]))
            value = int(rng.integers(1, 2**31)) << int(rng.integers(0, 32))
            data[at : at + 4] = (value % 2**32).to_bytes(4, "little")
        return SubicIndex.load(_write(world, f"mutated_{kind}_{seed}.subic", data))

    return run


for _seed in range(60 * SCALE):
    for _kind in ("flip", "truncate", "extend", "header"):
        case(f"index-{_kind}-{_seed}", ValueError, _INDEX_ERROR)(
            _mutated_index(_seed, _kind)
        )


# SubicIndex API ------------------------------------------------------------

_BAD_SHAPES = [
    ((0, 16), ValueError, "num_blocks must be >= 1, received 0"),
    ((4, 1), ValueError, "block_size must be >= 2, received 1"),
    ((4, 12), ValueError, "power of two"),
    ((4.5, 16), TypeError, "num_blocks must be an integer"),
    (("4", 16), TypeError, "num_blocks must be an integer"),
    ((4, None), TypeError, "block_size must be an integer"),
    ((-3, 16), ValueError, "num_blocks must be >= 1"),
    ((4, 2**40), ValueError, "block_size must be"),
]
for _i, (_args, _error, _fragment) in enumerate(_BAD_SHAPES):
    case(f"index-init-{_i}", _error, _fragment)(
        lambda world, args=_args: SubicIndex(*args)
    )


def _fresh(world) -> SubicIndex:
    index = SubicIndex(M, K)
    index.add(world["index"].get_codes(), ids=world["index"].get_ids())
    return index


_BAD_CODES = [
    (lambda r: r.integers(0, K, (5, M + 1)), ValueError, "codes must have width"),
    (lambda r: r.integers(K, 2 * K, (5, M)), ValueError, "must hold values in [0,"),
    (lambda r: -r.integers(1, 5, (5, M)), ValueError, "must hold values in [0,"),
    (lambda r: r.random((5, M)), ValueError, "must be integer codes"),
    (lambda r: r.integers(0, K, (5, M, 1)), ValueError, "must be a 2-D array"),
    (lambda r: np.full((5, M), np.nan), ValueError, "must be integer codes"),
    (lambda r: r.integers(0, K, (5,)), ValueError, "must be a 2-D array"),
]
_BAD_QUERIES = [
    (lambda r: r.random((3, M * K + 1)), ValueError, "queries must have width"),
    (
        lambda r: np.where(r.random((3, M * K)) < 0.1, np.nan, 1.0),
        ValueError,
        "queries must be finite",
    ),
    (lambda r: np.full((3, M * K), np.inf), ValueError, "queries must be finite"),
    (lambda r: r.random((3, M, K)), ValueError, "must be a 2-D array"),
    (lambda r: r.random((3, M * K)).astype(str), ValueError, "must hold real numbers"),
]
for _seed in range(10 * SCALE):
    for _i, (_make, _error, _fragment) in enumerate(_BAD_CODES):
        case(f"index-add-{_i}-{_seed}", _error, _fragment)(
            lambda world, make=_make, seed=_seed: _fresh(world).add(
                make(np.random.default_rng(seed))
            )
        )
    for _i, (_make, _error, _fragment) in enumerate(_BAD_QUERIES):
        case(f"index-search-{_i}-{_seed}", _error, _fragment)(
            lambda world, make=_make, seed=_seed: world["index"].search(
                make(np.random.default_rng(seed)), 5
            )
        )


for _i, (_k, _error, _fragment) in enumerate(
    [
        (0, ValueError, "k must be >= 1, received 0"),
        (-5, ValueError, "k must be >= 1, received -5"),
        (2.5, TypeError, "k must be an integer"),
        ("10", TypeError, "k must be an integer"),
        (None, TypeError, "k must be an integer"),
    ]
):
    case(f"index-k-{_i}", _error, _fragment)(
        lambda world, k=_k: world["index"].search(np.ones((2, M * K)), k)
    )


def _exact_top(world, queries, k):
    codes, ids = world["index"].get_codes(), world["index"].get_ids()
    scores = queries.reshape(len(queries), M, K)[:, np.arange(M), codes].sum(-1)
    return np.sort(scores, axis=1)[:, ::-1][:, :k], ids


def _check_search(k):
    def check(result, world, queries):
        scores, ids = result
        expected, _ = _exact_top(world, queries, k)
        found = min(k, len(world["index"]))
        assert scores.shape == ids.shape == (len(queries), found)
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
        assert (ids >= 0).all()

    return check


for _seed in range(8 * SCALE):
    for _k in (1, 7, 300, 301, 1000):
        _queries = np.random.default_rng(_seed).normal(size=(4, M * K))
        if _seed % 2:
            _queries[:, 0] = 1e30  # one huge entry
        case(
            f"index-search-ok-{_k}-{_seed}",
            check=lambda result, world, k=_k, q=_queries: _check_search(k)(
                result, world, q
            ),
        )(lambda world, k=_k, q=_queries: world["index"].search(q, k))


case("index-remove-unknown", KeyError, "ids not in the index")(
    lambda world: _fresh(world).remove([1])
)
case("index-duplicate-ids", ValueError, "ids must be unique, repeated: [3]")(
    lambda world: SubicIndex(M, K).add(np.zeros((2, M), int), ids=[3, 3])
)
case("index-existing-ids", ValueError, "already")(
    lambda world: _fresh(world).add(np.zeros((1, M), int), ids=[7])
)
case("sharded-same-shard", ValueError, "received the same one")(
    lambda world: ShardedSubicIndex([world["index"], world["index"]])
)
case("sharded-overlap", ValueError, "ids")(
    lambda world: ShardedSubicIndex([world["index"], _fresh(world)])
)


# Saved models: refused with a reason, never "file not found" --------------


def _keras_variant(kind: str, seed: int):
    def run(world):
        rng = np.random.default_rng(seed)
        data = world["model_bytes"]
        if kind == "truncate":
            data = data[: int(rng.integers(0, len(data) - 1))]
        elif kind == "garbage":
            data = bytes(rng.integers(0, 256, int(rng.integers(0, 4096)), np.uint8))
        elif kind == "flip":  # inside a member: the CRC check finds it
            data = bytearray(data)
            with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
                member = archive.infolist()[int(rng.integers(0, 3))]
            start = member.header_offset + 30 + len(member.filename)
            at = start + int(rng.integers(0, max(1, member.compress_size)))
            data[at] ^= 0xFF
            data = bytes(data)
        elif kind == "no-config":
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w") as archive:
                archive.writestr("metadata.json", "{}")
            data = buffer.getvalue()
        return load_subic(_write(world, f"model_{kind}_{seed}.keras", data))

    return run


for _seed in range(12 * SCALE):
    for _kind in ("truncate", "garbage", "flip"):
        case(f"keras-{_kind}-{_seed}", ValueError, "not a Keras model file")(
            _keras_variant(_kind, _seed)
        )
case("keras-no-config", ValueError, "no config.json")(_keras_variant("no-config", 0))
case("keras-directory", IsADirectoryError, "a directory")(
    lambda world: load_subic(world["root"])
)


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


# Query files of `subic search` ---------------------------------------------


def _query_file(kind: str, seed: int):
    def run(world):
        rng = np.random.default_rng(seed)
        if kind == "random-bytes":
            name = f"q_{seed}." + str(rng.choice(["png", "jpg", "npy", "bin"]))
            data = bytes(rng.integers(0, 256, int(rng.integers(0, 2048)), np.uint8))
            path = _write(world, name, data)
        elif kind == "npy-pickle":
            path = str(world["root"] / f"q_{seed}.npy")
            np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        elif kind == "npy-dtype":
            path = str(world["root"] / f"q_{seed}.npy")
            np.save(path, rng.integers(0, 9, (2, *SHAPE)).astype(np.int16))
        elif kind == "npy-shape":
            path = str(world["root"] / f"q_{seed}.npy")
            np.save(path, np.zeros((2, 8, 8, int(rng.integers(4, 6))), np.uint8))
        return _read_query_images([path], SHAPE)

    return run


for _seed in range(40 * SCALE):
    case(f"query-file-bytes-{_seed}", ValueError, "not a")(
        _query_file("random-bytes", _seed)
    )
for _seed in range(5 * SCALE):
    case(f"query-file-pickle-{_seed}", ValueError, "not a NumPy .npy array")(
        _query_file("npy-pickle", _seed)
    )
    case(f"query-file-dtype-{_seed}", ValueError, "uint8 pixels or floats")(
        _query_file("npy-dtype", _seed)
    )
    case(f"query-file-shape-{_seed}", ValueError, "query images must have shape")(
        _query_file("npy-shape", _seed)
    )


def _png(size, channels):
    import tensorflow as tf

    def run(world):
        image = np.random.default_rng(size).integers(
            0, 256, (size, size, channels), dtype=np.uint8
        )
        path = _write(
            world, f"q_{size}_{channels}.png", tf.io.encode_png(image).numpy()
        )
        _, images, _ = _read_query_images([path], SHAPE)
        return images

    return run


for _size in (8, 5, 31):
    for _channels in (1, 3, 4):
        case(
            f"query-png-{_size}-{_channels}",
            check=lambda images, world: (
                images.shape == (1, *SHAPE) and images.dtype == np.uint8
            ),
        )(_png(_size, _channels))


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
    (lambda w: ["search", w["model"], w["model"], w["queries"]], _INDEX_ERROR),
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


# Data files that try to run code -----------------------------------------


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _cifar_payload(where: str):
    def run(world):
        from subic_keras.data.datasets import load_cifar10

        directory = world["root"] / f"payload_{where}" / "cifar-10-batches-py"
        directory.mkdir(parents=True, exist_ok=True)
        marker = str(world["root"] / f"ran_{where}")
        batch = {
            b"data": np.zeros((2, 3072), np.uint8),
            b"labels": [0, 1],
            b"x": _Payload(marker),
        }
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            payload = (
                batch if name == where else {b"data": batch[b"data"], b"labels": [0, 1]}
            )
            (directory / name).write_bytes(pickle.dumps(payload))
        try:
            load_cifar10(directory.parent)
        finally:
            assert not os.path.exists(marker), "a data file ran code"

    return run


for _where in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    case(f"cifar-payload-{_where}", ValueError, "refusing to run it")(
        _cifar_payload(_where)
    )


# ---------------------------------------------------------------------------


def test_there_are_enough_cases():
    assert len(CASES) >= 600 * SCALE
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, world, capsys, record_property):
    # Counted by outcome in pytest's summary (tests/conftest.py).
    record_property("fuzz_outcome", "correct" if case.error is None else "clear error")
    if case.error is None:
        result = case.run(world)
        if case.check is not None:
            assert case.check(result, world) is not False
        return
    error = case.error
    if isinstance(error, str):  # named lazily: TensorFlow loads on demand
        import importlib

        module, _, name = error.rpartition(".")
        error = getattr(importlib.import_module(module), name)
    with pytest.raises(error) as raised:
        case.run(world)
    if case.error is SystemExit:
        assert raised.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "Traceback" not in "\n".join(err)
        assert err[-1].startswith("subic "), err
        assert case.fragment in err[-1], err
    else:
        assert case.fragment in str(raised.value), str(raised.value)
