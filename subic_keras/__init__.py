"""subic-keras: supervised structured binary codes (SuBiC) for Keras 3.

SuBiC (Jain et al., ICCV 2017) encodes an image as `M` one-hot blocks of
size `K`, `M·log2 K` bits, trained end to end with a block softmax and two
entropy terms, and searched asymmetrically with a real-valued query.
"""

from subic_keras import (
    backbones,
    baselines,
    callbacks,
    datasets,
    evaluation,
    export,
    losses,
    metrics,
    recipe,
    retrieval,
    search,
    training,
)
from subic_keras.layers import BlockArgmax, BlockOneHot, BlockSoftmax
from subic_keras.models import Subic, SubicTrainModel, build_subic
from subic_keras.recipe import Recipe, pretrain_backbone, train_subic
from subic_keras.search import ShardedSubicIndex, SubicIndex, merge_results

__version__ = "0.1.0"

__all__ = [
    "BlockArgmax",
    "BlockOneHot",
    "BlockSoftmax",
    "Recipe",
    "ShardedSubicIndex",
    "Subic",
    "SubicIndex",
    "SubicTrainModel",
    "backbones",
    "baselines",
    "build_subic",
    "callbacks",
    "datasets",
    "evaluation",
    "export",
    "losses",
    "merge_results",
    "metrics",
    "pretrain_backbone",
    "recipe",
    "retrieval",
    "search",
    "train_subic",
    "training",
]
