"""The machinery of the fuzz tests (tests/fuzz/): a case states its outcome,
the correct result or a named exception with a fragment of its message, and
acts on a small world of a model, an index and their files.

Seeded and fast in the default run; `SUBIC_FUZZ_SCALE=10` multiplies the
generated cases for a longer run.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest

from subic_keras import build_subic
from subic_keras.search import SubicIndex

SCALE = int(os.environ.get("SUBIC_FUZZ_SCALE", "1"))
M, K = 4, 16
SHAPE = (8, 8, 3)
INDEX_ERROR = "not a valid SuBiC index file"


@dataclasses.dataclass(frozen=True)
class Case:
    """`run(world)` must return normally (and `check` its result), or raise
    `error` with `fragment` in its message."""

    name: str
    run: Callable
    error: type[BaseException] | tuple | str | None = None
    fragment: str = ""
    check: Callable | None = None


class Cases(list):
    """A module's cases; `add` is the decorator that registers one."""

    def add(self, name, error=None, fragment="", check=None):
        def register(run):
            self.append(Case(name, run, error, fragment, check))
            return run

        return register

    def ids(self) -> list[str]:
        return [c.name for c in self]


def make_world(root: Path) -> dict:
    """The model, index and files that the cases act on, under `root`."""
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


def write(world, name: str, data: bytes) -> str:
    path = world["root"] / name
    path.write_bytes(data)
    return str(path)


def run_case(case: Case, world: dict, capsys, record_property) -> None:
    """Runs `case` and checks its stated outcome."""
    # Counted by outcome in pytest's summary (tests/conftest.py).
    record_property("fuzz_outcome", "correct" if case.error is None else "clear error")
    if case.error is None:
        result = case.run(world)
        if case.check is not None:
            assert case.check(result, world) is not False
        return
    error = case.error
    if isinstance(error, str):  # named lazily: TensorFlow loads on demand
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
