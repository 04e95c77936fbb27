"""turbospark: see how a Mixture-of-Experts model routes, from inside its decode loop.

``RouterHistogram`` records each layer's router top-k (counts, and optionally
the ordered trace, a one-layer-ahead pilot prediction and one raw logit row)
and writes the reference runtime's JSON. ``load`` reads such a capture back
and ``analyze`` answers what it was recorded for. ``BACKEND`` says which core
records: ``"cython"`` (compiled) or ``"python"`` (the pure-Python twin).
"""

from ._backend import BACKEND
from .analysis import analyze
from .capture import Capture, load, loads
from .recorder import RouterHistogram

__version__ = "0.1.0"

__all__ = ["BACKEND", "Capture", "RouterHistogram", "__version__", "analyze", "load", "loads"]
