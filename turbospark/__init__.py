"""turbospark: see how a Mixture-of-Experts model routes, from inside its decode loop.

``RouterHistogram`` records each layer's router top-k (counts, and optionally
the ordered trace, a one-layer-ahead pilot prediction and one raw logit row)
and writes the reference runtime's JSON. ``load`` reads such a capture back
and ``analyze`` answers what it was recorded for. ``BACKEND`` says which core
records: ``"cython"`` (compiled) or ``"python"`` (the pure-Python twin).

The recorder core is imported on first use of ``RouterHistogram`` or
``BACKEND``, not by ``import turbospark``: loading and analysing a capture
never needs it (nor warns when only the slow fallback is available).
"""

from typing import TYPE_CHECKING, Any

from . import _moved
from .capture.reader import Capture, load, loads
from .metrics.layers import analyze

# The old paths of moved modules (turbospark.analysis.cache, ...) resolve, with a warning, for one release.
_moved.install()

if TYPE_CHECKING:
    from .recording._backend import BACKEND
    from .recording.recorder import RouterHistogram

__version__ = "0.1.0"

__all__ = ["BACKEND", "Capture", "RouterHistogram", "__version__", "analyze", "load", "loads"]


def __getattr__(name: str) -> Any:
    # PEP 562: resolved once, then cached as a module attribute.
    if name == "RouterHistogram":
        from .recording.recorder import RouterHistogram as value
    elif name == "BACKEND":
        from .recording._backend import BACKEND as value
    else:
        raise AttributeError(f"module 'turbospark' has no attribute {name!r}")
    globals()[name] = value
    return value
