"""The network: SuBiC's layers, losses and metrics, the backbones they sit
on, and the models `build_subic` assembles from them.

A new backbone goes in `backbones.py` (a `keras.applications` network in
`applications.py`, one rebuilt from a file in a module of its own, as
`mobilenet.py`, named in `backbones.py`); a Keras object that `.keras`
files hold is registered in its module and listed in
`subic_keras._KERAS_MODULES`. The names of
`subic.py` (`Subic`, `FC0`, ...) are also this package's, as they were
when it was a module.
"""

from subic_keras._moved import reexport

__getattr__, __dir__ = reexport(__name__, "subic")
