"""Chooses the recorder core: compiled when it imports, pure Python otherwise.

``TURBOSPARK_PUREPYTHON`` set to a non-empty value forces pure Python (as
msgpack's ``MSGPACK_PUREPYTHON`` does), which is how the test suite runs
against both backends.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

# The package root (``turbospark/``), one level above this room.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fallback_message(error: ImportError) -> str:
    """Why the compiled core is missing and what to do, for the fallback warning."""
    checkout = os.path.dirname(_PACKAGE_DIR)
    slower = "the pure-Python core records 50-110x slower"
    if os.path.isfile(os.path.join(checkout, "csrc", "_recorder.pyx")):
        # The usual cause: a script or `python -m pytest` run from the repository root.
        return (
            f"turbospark is imported from its source checkout ({_PACKAGE_DIR}), which has no "
            f"compiled core ({error}), so {slower}. Fix: build it in place with "
            f"`pip install -e .` in {checkout}, or run from outside the checkout to use the "
            "installed package. TURBOSPARK_PUREPYTHON=1 selects the pure-Python core without this warning."
        )
    return (
        f"turbospark's compiled core could not be imported ({error}), so {slower}. Fix: reinstall "
        "turbospark from its source with a C compiler available (`pip install .` in a checkout; "
        "the build log says what failed). TURBOSPARK_PUREPYTHON=1 selects the pure-Python core "
        "without this warning."
    )


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
        warnings.warn(_fallback_message(exc), RuntimeWarning, stacklevel=2)
        from ._recorder_py import RecorderCore

        BACKEND = "python"

if TYPE_CHECKING:
    # The declared core/facade contract: for type checkers the facade's mixins
    # extend the compiled core's stub (_recorder.pyi, checked above against
    # _types.RecorderCoreAPI), so every core method they call is declared. At
    # run time the core is mixed in by RouterHistogram / recorder_class.
    CoreBase = RecorderCore
else:
    CoreBase = object

__all__ = ["BACKEND", "CoreBase", "RecorderCore"]
