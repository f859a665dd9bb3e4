"""Where the modules of earlier releases live now, and the packages that
keep the names those modules had.

Until 0.1 every module sat at the top of `subic_keras`; now each lives in
the subpackage of its kind (`subic_keras.recipe` is
`subic_keras.trainers.recipe`). `install` lets the earlier dotted names
import the same module objects, so `from subic_keras.recipe import
train_subic` keeps working; `reexport` lets a subpackage named as an
earlier module (`subic_keras.models`, `evaluation`, `instance`) answer
for that module's names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

MOVED = {
    "alterations": "instance.alterations",
    "applications": "models.applications",
    "backbones": "models.backbones",
    "building": "models.building",
    "callbacks": "trainers.callbacks",
    "code_scores": "evaluation.code_scores",
    "copies": "instance.copies",
    "datasets": "data.datasets",
    "export": "serving.export",
    "folder_rules": "instance.folder_rules",
    "folders": "data.folders",
    "http_app": "serving.http_app",
    "images": "data.images",
    "layers": "models.layers",
    "litert": "models.litert",
    "litert_features": "models.litert_features",
    "losses": "models.losses",
    "metrics": "models.metrics",
    "near_duplicates": "instance.near_duplicates",
    "paths": "data.paths",
    "pipelines": "data.pipelines",
    "pixels": "data.pixels",
    "preprocessing": "data.preprocessing",
    "pretraining": "trainers.pretraining",
    "protocols": "data.protocols",
    "ranking": "evaluation.ranking",
    "ray_folders": "serving.ray_folders",
    "recipe": "trainers.recipe",
    "retrieval": "serving.retrieval",
    "scoring": "evaluation.scoring",
    "server": "serving.server",
    "sockets": "serving.sockets",
    "streams": "data.streams",
    "tfds_loaders": "data.tfds_loaders",
    "train_model": "models.train_model",
    "training_data": "trainers.training_data",
    "weights_digest": "models.weights_digest",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `subic_keras.<earlier name>` as the module it is now."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != "subic_keras" or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"subic_keras.{MOVED[spec.name[12:]]}")
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The module ran under its own name; importing it under this one
        # set its `__spec__` to this name's, which it gets back.
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        # First: a file of an earlier release left beside the package
        # must not run as a second copy of a module.
        sys.meta_path.insert(0, _MovedModules())


def reexport(
    package: str, *modules: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`: its submodules by name,
    else the names of its submodules `modules`, the first that has it
    (each loaded on first use)."""

    def __getattr__(name: str) -> Any:
        if not name.startswith("_"):
            if importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            for module in modules:
                loaded = importlib.import_module(f"{package}.{module}")
                if hasattr(loaded, name):
                    value = getattr(loaded, name)
                    setattr(sys.modules[package], name, value)
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        names = set(vars(sys.modules[package]))
        for module in modules:
            loaded = importlib.import_module(f"{package}.{module}")
            names.update(
                getattr(loaded, "__all__", None)
                or [name for name in vars(loaded) if not name.startswith("_")]
            )
        return sorted(names)

    return __getattr__, __dir__
