"""Fuzz cases of the files a user hands us: index files, `.keras` files, query
files of `subic search`, and data files that try to run code. Each is refused
with a reason, never read as something else."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import numpy as np
import pytest
from fuzzing import INDEX_ERROR, SCALE, SHAPE, Case, Cases, run_case, write

from subic_keras.cli.search_commands import _read_query_images
from subic_keras.search import SubicIndex
from subic_keras.serving.export import load_subic

CASES = Cases()
case = CASES.add


# Index files: any change is refused, never read as other codes ------------


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
        return SubicIndex.load(write(world, f"mutated_{kind}_{seed}.subic", data))

    return run


for _seed in range(60 * SCALE):
    for _kind in ("flip", "truncate", "extend", "header"):
        case(f"index-{_kind}-{_seed}", ValueError, INDEX_ERROR)(
            _mutated_index(_seed, _kind)
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
        return load_subic(write(world, f"model_{kind}_{seed}.keras", data))

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


# Query files of `subic search` ---------------------------------------------


def _query_file(kind: str, seed: int):
    def run(world):
        rng = np.random.default_rng(seed)
        if kind == "random-bytes":
            name = f"q_{seed}." + str(rng.choice(["png", "jpg", "npy", "bin"]))
            data = bytes(rng.integers(0, 256, int(rng.integers(0, 2048)), np.uint8))
            path = write(world, name, data)
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
        path = write(world, f"q_{size}_{channels}.png", tf.io.encode_png(image).numpy())
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


def test_there_are_enough_cases():
    assert len(CASES) >= 340 * SCALE
    assert len(set(CASES.ids())) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=CASES.ids())
def test_case(case: Case, world, capsys, record_property):
    run_case(case, world, capsys, record_property)
