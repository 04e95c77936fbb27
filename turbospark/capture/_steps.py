"""Engine steps in a capture: ``RouterHistogram.mark_step()`` and the ``step_passes`` key.

A recorder inside an engine knows where one engine step (one forward of the
batch) ends. ``mark_step()`` closes the current step: it reads each layer's
routed-pass count (after the device path's staged rows are drained into the
core) and keeps it. Nothing here is on the per-call hot path: one read of L
counters per step, in the facade, not in either core.

The capture's JSON then ends with (before the vLLM plugin's ``requests``)::

    "step_passes": [[n_0, n_1, ..., n_{T-1}], ...]   # one list per layer, T marked steps

where ``n_t`` is the passes layer l routed in step t (the same T for every
layer; 0 where the layer routed nothing). A layer's passes after the last
mark are one more, open step. The key is written both in memory and in a
streamed capture's summary (its JSON), so it is streamed like the summary's
``passes`` and read back by ``turbospark.load`` as ``Capture.step_passes``
((L, T) int64); ``steps_of`` turns it into each pass's step. A capture
without the key has no recorded steps (tools form them from ``--batch``).
Under ``trace_cap`` the counts cover every pass; a layer's trace keeps its
first passes, so their steps are the first entries of ``steps_of``.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import numpy as np

__all__ = ["StepMarks", "read_step_passes", "step_passes_key", "steps_of"]


class StepMarks:
    """Per-layer pass counts at each ``mark`` (cumulative), under a lock (marks may come from any thread)."""

    def __init__(self, num_layers: int) -> None:
        self._layers = num_layers
        self._marks: list[np.ndarray] = []
        self._lock = threading.Lock()

    def mark(self, passes: np.ndarray) -> int:
        """Close a step at the (L,) cumulative ``passes``; returns the number of marked steps."""
        now = np.asarray(passes, dtype=np.int64).copy()
        with self._lock:
            if self._marks and (now < self._marks[-1]).any():
                raise RuntimeError("the recorder's pass counts went down between two steps")
            self._marks.append(now)
            return len(self._marks)

    def per_step(self) -> Optional[np.ndarray]:
        """(L, T) int64 passes per layer per marked step, or None before the first mark."""
        with self._lock:
            if not self._marks:
                return None
            cumulative = np.stack(self._marks, axis=1)
        return np.diff(cumulative, axis=1, prepend=0)


def step_passes_key(marks: Optional[StepMarks]) -> bytes:
    """``,"step_passes":[[...],...]`` for the JSON document, or b"" without marks."""
    table = None if marks is None else marks.per_step()
    if table is None:
        return b""
    rows = ",".join("[" + ",".join(map(str, row)) + "]" for row in table.tolist())
    return f',"step_passes":[{rows}]'.encode("ascii")


def read_step_passes(value: Any, num_layers: int) -> Optional[np.ndarray]:
    """The ``step_passes`` key as (L, T) int64, or None when absent. Raises ``ValueError`` naming the
    problem: not one list per layer, lists of different lengths, or an entry that is not a count."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != num_layers or not all(isinstance(row, list) for row in value):
        raise ValueError(f"step_passes must hold one list per layer ({num_layers})")
    lengths = {len(row) for row in value}
    if len(lengths) > 1:
        raise ValueError(f"step_passes lists differ in length ({sorted(lengths)}): every layer has the same steps")
    for layer, row in enumerate(value):
        for step, n in enumerate(row):
            if type(n) is not int or n < 0:
                raise ValueError(f"step_passes[{layer}][{step}] must be a non-negative integer, got {n!r}")
    width = lengths.pop() if lengths else 0
    return np.array(value, dtype=np.int64).reshape(num_layers, width)


def steps_of(step_passes: np.ndarray, layer: int, passes: int) -> np.ndarray:
    """(``passes``,) int64: the step of each of ``layer``'s first ``passes`` passes; passes beyond the
    marked ones fall in one open step after the last."""
    row = step_passes[layer]
    steps = np.repeat(np.arange(row.shape[0], dtype=np.int64), row)
    if steps.shape[0] >= passes:
        return steps[:passes]
    return np.concatenate([steps, np.full(passes - steps.shape[0], row.shape[0], dtype=np.int64)])
