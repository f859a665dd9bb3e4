"""`subic_keras._quiet`: the package loads TensorFlow without its C++
start-up lines, unless the user set its log level."""

import os
import subprocess
import sys

import pytest

_LOAD = (
    "import sys, subic_keras as sk; sk.build_subic; print('tensorflow' in sys.modules)"
)

# A submodule imported directly, without the package's lazy names.
_DIRECT = (
    "import sys; from subic_keras.serving.export import export_saved_model; "
    "import tensorflow as tf; tf.constant(1) + 1; print('tensorflow' in sys.modules)"
)


@pytest.mark.parametrize(
    "load, level",
    [
        (_LOAD, None),
        (_LOAD, "0"),
        (_DIRECT, None),
        (_DIRECT, "0"),
    ],
)
def test_python_use_is_quiet_unless_the_user_set_a_log_level(load, level):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-c", load], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    native = [line for line in done.stderr.splitlines() if line.startswith("I0000")]
    if level is None:
        assert done.stderr == "", done.stderr
    else:  # asked for: TensorFlow's own lines, as it prints them
        assert native or "absl::InitializeLog" in done.stderr, done.stderr
