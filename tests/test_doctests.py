"""The docstring examples of the library run, and show what they print."""

import doctest
import importlib

import numpy as np
import pytest

# Modules whose every example is self-contained.
MODULES = (
    "subic_keras.evaluation",
    "subic_keras.layers",
    "subic_keras.metrics",
    "subic_keras.scoring",
    "subic_keras.search.base",
    "subic_keras.search.packing",
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        extraglobs={"np": np},
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        report=True,
    )
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0, f"{result.failed} docstring examples of {name} failed"


def test_numpy_only_modules_do_not_import_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys, subic_keras.evaluation, subic_keras.protocols, "
        "subic_keras.scoring, subic_keras.search, subic_keras.baselines.quantizers; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
