"""TensorFlow loaded quietly: its C++ start-up lines hidden, its loggers at errors.

TensorFlow prints a dozen start-up lines (CUDA drivers, oneDNN, absl's
`InitializeLog`) from C++ when it loads, some before any Python setting can
reach them; `quiet_imports` hides them by pointing the process's standard
error at `/dev/null` while the heavy modules load. Importing the package sets
`TF_CPP_MIN_LOG_LEVEL=3` where the user set no level and TensorFlow is not
loaded yet, so a submodule imported directly loads it quietly too, and the
package loads its TensorFlow modules through `quiet_imports`
(`subic_keras.__getattr__`); a level the user set (they asked for
TensorFlow's own lines) is kept, and the command line's `--verbose` shows
them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_imports(quiet: bool = True, loggers: bool = True) -> Iterator[None]:
    """Silences TensorFlow's and absl's log lines while heavy modules load.

    A Python error raised inside still reaches the user, once standard
    error is restored; only the native writes to file descriptor 2 are
    dropped. Afterwards, with `loggers`, TensorFlow's loggers stay at
    errors only and its warnings are hidden (the command line's choice).
    """
    if not quiet:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (a GUI host): nothing to silence
        saved = None
    if saved is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    try:
        yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
    if loggers:
        _quiet_python_loggers()


def _quiet_python_loggers() -> None:
    for name in ("tensorflow", "absl", "h5py"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # pymilvus logs every failed request with a traceback before raising the
    # error that the command reports in one line.
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    # TensorFlow's and Keras's notices (retracing, deprecations) are for
    # developers of the package, not for a person running a command.
    for module in ("tensorflow", "keras", "tf_keras", "absl"):
        warnings.filterwarnings("ignore", module=module)


# Whether the package set TensorFlow's C++ log level itself (the user did
# not): its TensorFlow modules then load quietly (`load_module`).
_CHOSEN = "TF_CPP_MIN_LOG_LEVEL" not in os.environ


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Loads `tensorflow`, the first time anything imports it, inside
    `quiet_imports`: its start-up lines are written as its libraries load,
    where no environment variable set from Python reaches them."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        _stop_hiding()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with quiet_imports(loggers=False):
            self.loader.exec_module(module)


_HOOK = _QuietTensorFlow()
if _CHOSEN and "tensorflow" not in sys.modules:
    # Set before any of the package's modules can import TensorFlow (a
    # submodule imported directly as well as `subic_keras.X`): the level
    # quiets what it logs later (device set-up), the hook its loading.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.meta_path.insert(0, _HOOK)


def _stop_hiding() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def show_native_logs() -> None:
    """TensorFlow's C++ lines shown from now on (`subic --verbose`)."""
    global _CHOSEN
    if _CHOSEN and "tensorflow" not in sys.modules:
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    _stop_hiding()
    _CHOSEN = False


def load_module(name: str):
    """`importlib.import_module(name)`, TensorFlow's C++ start-up lines
    hidden where it is not loaded yet and the user set no log level."""
    import importlib

    if not _CHOSEN or "tensorflow" in sys.modules:
        return importlib.import_module(name)
    with quiet_imports(loggers=False):
        return importlib.import_module(name)
