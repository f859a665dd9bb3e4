"""The baselines SuBiC is compared with, evaluated through the same code.

- Unsupervised quantizers of feature vectors, searched asymmetrically:
  `ProductQuantizer` (PQ), `OptimizedProductQuantizer` (OPQ, "CKM" in the
  paper) and `LocalSearchQuantizer` (LSQ).
- Supervised deep hashing, searched by Hamming distance: DSH (`build_dsh`,
  `DSHLoss`) and DLBHC (`build_dlbhc`), trained with SuBiC's recipe by
  `train_hashing`.
- The uncompressed reference, float features ranked by L2 distance or
  cosine: `Uncompressed`.
- A classifier's prediction as a one-block code: `OneHotClassifier`
  (Sablayrolles et al., ICASSP 2017).
- For copy detection, the look (`looks`): 108 bytes of a picture's
  centre, the peer of the instance code.

Each is a `subic_keras.evaluation.scoring.Scorer`, so
`subic_keras.evaluation.scoring.evaluate` scores them like SuBiC. Names load
on first use: the quantizers do not import TensorFlow.
"""

import importlib

_NAMES = {
    "DLBHC": "dlbhc",
    "build_dlbhc": "dlbhc",
    "DSH": "dsh",
    "DSHLoss": "dsh",
    "build_dsh": "dsh",
    "Binarize": "hashing",
    "HashingNetwork": "hashing",
    "hamming_search": "hashing",
    "LocalSearchQuantizer": "quantizers",
    "OneHotClassifier": "one_hot",
    "OptimizedProductQuantizer": "quantizers",
    "ProductQuantizer": "quantizers",
    "Quantizer": "quantizers",
    "train_hashing": "training",
    "Uncompressed": "uncompressed",
}
_SUBMODULES = (
    "dlbhc",
    "dsh",
    "hashing",
    "looks",
    "one_hot",
    "quantizers",
    "training",
    "uncompressed",
)

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
