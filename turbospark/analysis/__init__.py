"""The reading and analysis wing; as a module, ``turbospark.analysis`` is the public metrics API.

The metrics live in ``metrics.py``; loading (``capture``), the text report,
the figures, the holdout, comparison, merge and per-sequence views sit beside
them. Nothing here imports the recorder core.
"""

# The metrics module's __all__ is the one list of public metric names.
from ..metrics.layers import *  # noqa: F403
from ..metrics.layers import __all__ as __all__
