"""Capture texts used by several test files, and the write-path tests' helpers (not a test module)."""

from __future__ import annotations

import pathlib
from typing import Any

# The reference's own unit-test outputs (router_hist.rs), byte for byte:
# layer 0 routes (2,0) then (2,1), layer 1 (1,1); with trace=True for RUST_TRACE.
RUST_COUNTS = '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,1,2],[0,2,0]]}'
RUST_TRACE = (
    '{"num_layers":2,"num_experts":3,"top_k":2,'
    '"counts":[[1,1,2],[0,2,0]],"trace":[[2,0,2,1],[1,1]]}'
)
# pilot="next": layer 0 routes (2,0), a prediction (1,2) for layer 1, layer 1 routes (1,0).
RUST_PILOT = (
    '{"num_layers":2,"num_experts":3,"top_k":2,'
    '"counts":[[1,0,1],[1,1,0]],"trace":[[2,0],[1,0]],"pred":[[],[1,2]]}'
)

# A 1-layer, 2-expert recorder after one pass, ``record(0, [1])``.
ONE_PASS = '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[0,1]]}'

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
