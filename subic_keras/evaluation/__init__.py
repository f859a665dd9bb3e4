"""Evaluation, in NumPy only: the paper's protocols, exact retrieval
metrics with ties, and one scoring interface for every method.

A new protocol goes in `protocols.py`, a new method to compare in
`scoring.py`. The names of `retrieval_metrics.py` are also this
package's, as they were when it was a module.
"""

from subic_keras._moved import reexport

__getattr__, __dir__ = reexport(__name__, "retrieval_metrics")
