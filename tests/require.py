"""``require(module)``: import an optional dependency for a test module, or skip it; under CI=true, fail instead.

CI installs every optional extra, so a missing one there is a broken
environment, not a reason to pass silently.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(name: str) -> ModuleType:
    """The imported module ``name``; skips the calling test module without it, or fails under CI=true."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {name} cannot be imported ({exc}): install the extras", pytrace=False)
        pytest.skip(f"{name} is not installed ({exc})", allow_module_level=True)
