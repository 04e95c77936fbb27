"""turbospark: see how a Mixture-of-Experts model routes, from inside its decode loop.

``RouterHistogram`` records each layer's router top-k (counts, and optionally
the ordered trace, a one-layer-ahead pilot prediction and one raw logit row)
and writes the reference runtime's JSON. ``BACKEND`` says which core is in
use: ``"cython"`` (compiled) or ``"python"`` (the pure-Python twin).
"""

from ._backend import BACKEND
from .recorder import RouterHistogram

__version__ = "0.1.0"

__all__ = ["BACKEND", "RouterHistogram", "__version__"]
