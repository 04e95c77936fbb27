"""The metrics computed from a capture (the numpy twins and the compiled kernels share primitives here).

As a module, ``turbospark.metrics`` is the public metrics API (``analyze``,
``coverage``, ``lru_hit_rates``, ...: the ``__all__`` of ``layers.py``, the
per-layer metrics). Beside them: ``_primitives.py`` (the pass bitsets both
the metrics and their numpy twin build on), ``trace_sums.py`` with the
compiled ``_metrics_kernels`` (from ``csrc/_metrics.pyx``) or its twin
``_metrics_py.py``, the per-sequence view (``sequences.py``), the text report,
the holdout, comparison, and the partial states reduced over many files
(``partial.py``, ``distributed.py``). Nothing here imports the recorder core.
"""

# layers.py's __all__ is the one list of public metric names.
from .layers import *  # noqa: F403
from .layers import __all__ as __all__
