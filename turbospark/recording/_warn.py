"""Warnings that point at the user's code, however deep inside turbospark they are raised."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_caller(message: str) -> None:
    """Emit a RuntimeWarning attributed to the first frame outside this package."""
    level = 2  # stacklevel 2 is the frame that called warn_caller
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
        level += 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)
