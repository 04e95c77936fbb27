"""The ``seq`` / ``phase`` keys of a capture (sequence id and prompt/decode phase per pass).

The loader that gives ``Capture.seq`` / ``Capture.phase`` is being built on
another branch; until it lands, ``sequences`` reads the two keys itself
(only when the file holds them) and prefers the loader's attributes when
they exist. Contract: per layer, one non-negative integer per pass, aligned
with that layer's passes; phase 0 = prompt, 1 = decode.
"""

from __future__ import annotations

import json
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


def sequences(capture: Capture, raw: Optional[bytes]) -> Optional[Sequences]:
    """(seq, phase) per layer as int64 arrays, or None when the capture has no sequence information.

    ``raw`` is the capture file's bytes (read again only when they mention
    ``"seq"``). Raises ``ValueError`` naming the problem when the keys are
    malformed or do not align with the layers' passes.
    """
    seq, phase = getattr(capture, "seq", None), getattr(capture, "phase", None)
    if seq is None and raw is not None and b'"seq"' in raw:
        doc = json.loads(raw)
        seq, phase = doc.get("seq"), doc.get("phase")
    if seq is None:
        return None
    passes = layer_passes(capture)
    return _rows(seq, "seq", passes, None), _rows(phase, "phase", passes, 1)


def _rows(value: object, key: str, passes: list[int], top: Optional[int]) -> list[np.ndarray]:
    if not isinstance(value, (list, tuple)) or len(value) != len(passes):
        raise ValueError(f"{key} must hold one row per layer ({len(passes)})")
    rows = []
    for layer, (row, expected) in enumerate(zip(value, passes)):
        if isinstance(row, np.ndarray):
            array = row.astype(np.int64)
        elif isinstance(row, list) and all(type(v) is int for v in row):
            array = np.array(row, dtype=np.int64).reshape(-1)
        else:
            raise ValueError(f"{key}[{layer}] must be a list of integers")
        if array.shape[0] != expected:
            raise ValueError(f"{key}[{layer}] has {array.shape[0]} entries for {expected} passes")
        if array.size and (array.min() < 0 or (top is not None and array.max() > top)):
            bad = int(array.min()) if array.min() < 0 else int(array.max())
            raise ValueError(f"{key}[{layer}] holds {bad}, outside the allowed values")
        rows.append(array)
    return rows
