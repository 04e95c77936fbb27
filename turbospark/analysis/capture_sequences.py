"""Reading a capture's per-pass sequence information, for the analyses that form batches or merge.

``turbospark.load`` validates the ``seq`` / ``phase`` keys (one entry per
pass of each layer; phase 0 = prompt, 1 = decode) into ``Capture.seq`` and
``Capture.phase``; this module only pairs them up and counts passes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .capture import Capture

__all__ = ["Sequences", "layer_passes", "sequences"]

Sequences = tuple[list[np.ndarray], list[np.ndarray]]


def layer_passes(capture: Capture) -> list[int]:
    """Passes per layer: the trace's rows, or counts total / top_k without a trace."""
    if capture.trace is not None:
        return [int(ids.shape[0]) for ids in capture.trace]
    k = capture.top_k
    return [int(total) // k if k else 0 for total in capture.totals.tolist()]


def sequences(capture: Capture) -> Optional[Sequences]:
    """(seq, phase) per layer as int64 arrays, or None when the capture has no sequence information."""
    if capture.seq is None or capture.phase is None:
        return None
    return capture.seq, capture.phase
