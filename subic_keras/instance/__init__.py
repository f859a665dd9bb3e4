"""Copies of a picture: the instance code (trained without labels), the
alterations a copy goes through, and the rules that mark copies.

A new alteration goes in `alterations.py`, a new copy rule in `copies.py`
or `folder_rules.py`, a new view of a picture (crops indexed or searched
as that picture) in `picture_views.py`. The names of `instance_code.py` and
`folder_training.py` are also this package's, as they were when it was a
module.
"""

from subic_keras._moved import reexport

__getattr__, __dir__ = reexport(__name__, "instance_code", "folder_training")
