"""subic-keras: supervised structured binary codes (SuBiC) for Keras 3.

SuBiC (Jain et al., ICCV 2017) encodes an image as `M` one-hot blocks of
size `K`, `M·log2 K` bits, trained end to end with a block softmax and two
entropy terms, and searched asymmetrically with a real-valued query.

Submodules and names load on first use (PEP 562), so the NumPy-only parts
(`evaluation`, `protocols`, `scoring`, `search`, the quantizers) do not
import TensorFlow. Keras finds the package's layers, losses and metrics in
a `.keras` file once they are loaded: by using any Keras name of the package
(`subic_keras.Subic`, `subic_keras.layers`, ...), or by importing
`subic_keras` after `keras`.
"""

import sys

from subic_keras import _moved
from subic_keras._quiet import load_module

_moved.install()

__version__ = "0.1.0"

# Submodules by name: each subpackage, and the modules earlier releases
# had at the top (`subic_keras.datasets` is `subic_keras.data.datasets`).
_SUBMODULES = {
    "alterations": "instance.alterations",
    "applications": "models.applications",
    "backbones": "models.backbones",
    "baselines": "baselines",
    "building": "models.building",
    "callbacks": "trainers.callbacks",
    "config": "config",
    "copies": "instance.copies",
    "data": "data",
    "datasets": "data.datasets",
    "evaluation": "evaluation",
    "export": "serving.export",
    "folder_rules": "instance.folder_rules",
    "images": "data.images",
    "instance": "instance",
    "layers": "models.layers",
    "litert_features": "models.litert_features",
    "losses": "models.losses",
    "metrics": "models.metrics",
    "models": "models",
    "pipelines": "data.pipelines",
    "pixels": "data.pixels",
    "preprocessing": "data.preprocessing",
    "protocols": "data.protocols",
    "recipe": "trainers.recipe",
    "retrieval": "serving.retrieval",
    "scoring": "evaluation.scoring",
    "search": "search",
    "serving": "serving",
    "streams": "data.streams",
    "tfds_loaders": "data.tfds_loaders",
    "train_model": "models.train_model",
    "trainers": "trainers",
    "training": "training",
}
_NAMES = {
    "BlockArgmax": "models.layers",
    "BlockOneHot": "models.layers",
    "BlockSoftmax": "models.layers",
    "ImageIndex": "search",
    "ImageModel": "data.pixels",
    "InstanceSubic": "instance.instance_code",
    "MilvusIndex": "search.milvus",
    "MilvusPictures": "search.milvus_pictures",
    "Recipe": "config",
    "TrainConfig": "config",
    "Scorer": "evaluation.scoring",
    "SearchBackend": "search",
    "ShardedSubicIndex": "search",
    "Subic": "models.subic",
    "SubicIndex": "search",
    "SubicTrainModel": "models.train_model",
    "build_instance_subic": "instance.instance_code",
    "build_subic": "models.building",
    "merge_results": "search",
    "pretrain_backbone": "trainers.recipe",
    "train_subic": "trainers.recipe",
}

__all__ = sorted([*_NAMES, *_SUBMODULES])


# The modules that register Keras-serializable classes: loading any of them
# loads all, so that every SuBiC `.keras` file (a DSH backbone's local response
# normalization, a baseline's `Binarize`) deserializes without custom_objects.
_KERAS_MODULES = (
    "models.applications",
    "instance.instance_code",
    "models.backbones",
    "baselines.dlbhc",
    "baselines.dsh",
    "baselines.hashing",
    "models.layers",
    "models.losses",
    "models.metrics",
    "models.mobilenet",
    "models.subic",
    "data.pixels",
    "models.train_model",
)


def _register_keras_objects() -> None:
    for module in _KERAS_MODULES:
        load_module(f"{__name__}.{module}")


def __getattr__(name: str):
    if name not in _SUBMODULES and name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _NAMES.get(name) or _SUBMODULES[name]
    if module in _KERAS_MODULES or module in ("models", "instance"):
        _register_keras_objects()
    loaded = load_module(f"{__name__}.{module}")
    value = loaded if name in _SUBMODULES else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


# With Keras already loaded, registering the package's serializable classes
# costs nothing and lets `keras.saving.load_model` read SuBiC files.
if "keras" in sys.modules:
    _register_keras_objects()
