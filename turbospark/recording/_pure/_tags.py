"""record_batch's tags: per-pass sequence ids and phases, and the defaults of passes recorded without.

Twin of ``csrc/_tags.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
"""

from __future__ import annotations

from typing import Any

from .._sequences import DEFAULT_PHASE, DEFAULT_SEQ

__all__ = ["DEFAULT_PHASE", "DEFAULT_SEQ", "padded"]


def padded(column: Any, tagged: int, passes: int, default: int) -> list[int]:
    """A layer's committed tags, then the default for each pass recorded without one."""
    values = column[:tagged].tolist()
    values.extend([default] * (passes - tagged))
    return values

