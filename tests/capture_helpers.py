"""A small capture and a leftover check shared by the write-path tests (not a test module)."""

from __future__ import annotations

import pathlib
from typing import Any

# The JSON of a 2-layer, 3-expert, traced recorder after ``fill``.
DOC = '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,0,1],[0,1,1]],"trace":[[2,0],[1,2]]}'


def fill(hist: Any) -> Any:
    """The passes behind ``DOC``."""
    hist.record(0, [2, 0])
    hist.record(1, [1, 2])
    return hist


def leftovers(directory: pathlib.Path) -> list[str]:
    """Temporary files an atomic write left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))
