"""The models that ship with the package, found without TensorFlow.

`instance.keras` is an instance code (`subic_keras.instance.instance_code`): 256 bits
(64 blocks of 16) on DSH's CIFAR-10 CNN, 32 × 32 colour pictures, trained
without labels on CIFAR-10's 50,000 training pictures, each against its
copies altered by `subic_keras.instance.alterations`, by

    python -m benchmarks.near_duplicates --epochs 60 --num-blocks 64 --ship

CIFAR-10 (Krizhevsky, 2009) is distributed for research without a
licence of its own; the weights are the package's, under its Apache-2.0
licence. The command line names this model `instance`
(`subic index build instance FOLDER`); `subic_keras.instance.instance_code.pretrained()`
loads it.
"""

from __future__ import annotations

import os

# The command line's name for the instance code that ships with the package.
INSTANCE = "instance"


def path(name: str = INSTANCE) -> str:
    """The file of the shipped model `name`.

    Raises:
        ValueError: for a name that is not a shipped model's.
    """
    if name != INSTANCE:
        raise ValueError(f"name must be {INSTANCE!r}, received {name!r}")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "instance.keras")
