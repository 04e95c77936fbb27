"""``turbospark.analysis``: the metrics API under its first name, and the old paths of the modules it held.

``from turbospark.analysis import analyze, coverage, ...`` keeps working without a warning:
this module re-exports ``turbospark.metrics`` (the metrics' home, the name the docs use).
Its former submodules moved to rooms of their own (``turbospark.capture``,
``turbospark.metrics``, ``turbospark.offload``, ``turbospark.outputs``); their old paths,
``turbospark.analysis.cache`` and the rest, are deprecation aliases for one release
(``turbospark/_moved.py`` lists them): importing one warns and gives the new module.
"""

from typing import Any

# The metrics' __all__ is the one list of public metric names.
from ..metrics import *  # noqa: F403
from ..metrics import __all__ as __all__


def __getattr__(name: str) -> Any:
    # ``turbospark.analysis.cache`` as an attribute (PEP 562), and ``from turbospark.analysis
    # import cache``, as when the submodules lived here: the new module, with the alias's warning
    # pointed at the caller rather than at importlib.
    import importlib
    import warnings

    from .._moved import MOVED, warning_text

    old = f"{__name__}.{name}"
    if old not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
    warnings.warn(warning_text(old), DeprecationWarning, stacklevel=2)
    return module
