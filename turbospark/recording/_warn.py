"""Warnings that point at the user's code, however deep inside turbospark they are raised."""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from typing import Optional

# The whole package (every room), so a warning raised on behalf of an
# integration still points at the user's line.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# ``with turbospark.transformers.capture(...)`` enters through contextlib.
_CONTEXTLIB = os.path.abspath(contextlib.__file__)


def _ours(frame: types.FrameType) -> bool:
    if frame.f_code.co_filename.startswith("<"):
        return False  # "<string>", "<stdin>": the user's code, wherever the working directory is
    filename = os.path.abspath(frame.f_code.co_filename)
    return filename.startswith(_PACKAGE_DIR) or filename == _CONTEXTLIB


def warn_caller(message: str) -> None:
    """Emit a RuntimeWarning attributed to the first frame outside this package (and contextlib)."""
    level = 2  # stacklevel 2 is the frame that called warn_caller
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None and _ours(frame):
        frame = frame.f_back
        level += 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)
