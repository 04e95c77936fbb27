"""Chooses the recorder core: compiled when it imports, pure Python otherwise.

``TURBOSPARK_PUREPYTHON`` set to a non-empty value forces pure Python (as
msgpack's ``MSGPACK_PUREPYTHON`` does), which is how the test suite runs
against both backends.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Type checkers see the compiled core's stub (_recorder.pyi): the precise
    # interface both cores implement (_types.RecorderCoreAPI).
    from ._recorder import RecorderCore
    from ._types import RecorderCoreAPI

    BACKEND: str

    def _conforms(core: RecorderCore) -> RecorderCoreAPI:
        """Fails type checking when the compiled core's stub drifts from the interface."""
        return core
elif os.environ.get("TURBOSPARK_PUREPYTHON"):
    from ._recorder_py import RecorderCore

    BACKEND = "python"
else:
    try:
        from ._recorder import RecorderCore

        BACKEND = "cython"
    except ImportError as exc:
        warnings.warn(
            f"turbospark's compiled core could not be imported ({exc}); "
            "falling back to the pure-Python backend, which is several times slower",
            RuntimeWarning,
            stacklevel=2,
        )
        from ._recorder_py import RecorderCore

        BACKEND = "python"

__all__ = ["BACKEND", "RecorderCore"]
