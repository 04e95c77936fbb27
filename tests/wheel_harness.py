"""What the harnesses that import a server's own modules from its wheel share (not a test module):
the command-line flags they model, and putting ``sys.modules`` back after the stubs."""

from __future__ import annotations

import shlex
import sys
from types import ModuleType
from typing import Optional


def flag_values(flags: str) -> dict[str, str]:
    """``--name value`` pairs of a command line (the ones turbospark prints) as ``{"name": "value"}``,
    dashes in names made underscores, as the server's argument parser stores them."""
    words = shlex.split(flags)
    return {words[i][2:].replace("-", "_"): words[i + 1] for i in range(0, len(words), 2)}


def restore_modules(saved: dict[str, Optional[ModuleType]]) -> None:
    """Put ``sys.modules`` back as ``saved`` holds it (``None``: the name was not imported)."""
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
