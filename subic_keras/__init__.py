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

from subic_keras._quiet import load_module

__version__ = "0.1.0"

_SUBMODULES = (
    "alterations",
    "applications",
    "backbones",
    "baselines",
    "building",
    "callbacks",
    "config",
    "copies",
    "datasets",
    "evaluation",
    "export",
    "folder_rules",
    "images",
    "instance",
    "layers",
    "litert_features",
    "losses",
    "metrics",
    "models",
    "pipelines",
    "pixels",
    "preprocessing",
    "protocols",
    "recipe",
    "retrieval",
    "scoring",
    "search",
    "streams",
    "tfds_loaders",
    "train_model",
    "training",
)
_NAMES = {
    "BlockArgmax": "layers",
    "BlockOneHot": "layers",
    "BlockSoftmax": "layers",
    "ImageIndex": "search",
    "ImageModel": "pixels",
    "InstanceSubic": "instance",
    "MilvusIndex": "search.milvus",  # needs the [milvus] extra
    "MilvusPictures": "search.milvus_pictures",  # needs the [milvus] extra
    "Recipe": "config",
    "TrainConfig": "config",
    "Scorer": "scoring",
    "SearchBackend": "search",
    "ShardedSubicIndex": "search",
    "Subic": "models",
    "SubicIndex": "search",
    "SubicTrainModel": "train_model",
    "build_instance_subic": "instance",
    "build_subic": "building",
    "merge_results": "search",
    "pretrain_backbone": "recipe",
    "train_subic": "recipe",
}

__all__ = sorted([*_NAMES, *_SUBMODULES])


# The modules that register Keras-serializable classes: loading any of them
# loads all, so that every SuBiC `.keras` file (a DSH backbone's local response
# normalization, a baseline's `Binarize`) deserializes without custom_objects.
_KERAS_MODULES = (
    "applications",
    "instance",
    "backbones",
    "baselines.dlbhc",
    "baselines.dsh",
    "baselines.hashing",
    "layers",
    "losses",
    "metrics",
    "models",
    "pixels",
    "train_model",
)


def _register_keras_objects() -> None:
    for module in _KERAS_MODULES:
        load_module(f"{__name__}.{module}")


def __getattr__(name: str):
    if name not in _SUBMODULES and name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _NAMES.get(name, name)
    if module in _KERAS_MODULES:
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
