"""The baselines SuBiC is compared with, evaluated through the same code.

- Unsupervised quantizers of feature vectors, searched asymmetrically:
  `ProductQuantizer` (PQ), `OptimizedProductQuantizer` (OPQ, "CKM" in the
  paper) and `LocalSearchQuantizer` (LSQ).
- Supervised deep hashing, searched by Hamming distance: DSH (`build_dsh`,
  `DSHLoss`) and DLBHC (`build_dlbhc`).

Their scores go into `subic_keras.evaluation` (`mean_average_precision`,
`evaluate_retrieval`) like SuBiC's.
"""

from subic_keras.baselines.dlbhc import DLBHC, build_dlbhc
from subic_keras.baselines.dsh import DSH, DSHLoss, build_dsh
from subic_keras.baselines.hashing import Binarize, HashingNetwork, hamming_search
from subic_keras.baselines.quantizers import (
    LocalSearchQuantizer,
    OptimizedProductQuantizer,
    ProductQuantizer,
    Quantizer,
)

__all__ = [
    "DLBHC",
    "DSH",
    "Binarize",
    "DSHLoss",
    "HashingNetwork",
    "LocalSearchQuantizer",
    "OptimizedProductQuantizer",
    "ProductQuantizer",
    "Quantizer",
    "build_dlbhc",
    "build_dsh",
    "hamming_search",
]
