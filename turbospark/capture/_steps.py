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
mark are one more, open step. A streamed capture (trace="stream") has no
such key: its marks go to the sidecar with its rows, as kind 2 frames of
per-step counts (docs/stream.md), and its JSON's ``"stream"`` member says how
many steps it covers (``"steps"``), so a run of days keeps O(layers) of them
in memory. Either is read back by ``turbospark.load`` as ``Capture.step_passes``
((L, T) int64); ``steps_of`` turns it into each pass's step. A capture
without the key has no recorded steps (tools form them from ``--batch``).
Under ``trace_cap`` the counts cover every pass; a layer's trace keeps its
first passes, so their steps are the first entries of ``steps_of``.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

__all__ = ["StepMarks", "StepsChunk", "read_step_passes", "step_passes_key", "steps_of"]


class StepMarks:
    """Per-layer pass counts at each ``mark`` (cumulative), under a lock (marks may come from any thread).

    In memory every mark is kept (the JSON's ``step_passes`` holds them all). A
    streamed recorder hands its marks to the sidecar with its rows (``take_into``):
    then only the marks not yet handed over are kept, so memory stays O(layers)
    however many steps a run of days marks.
    """

    def __init__(self, num_layers: int) -> None:
        self._layers = num_layers
        self._marks: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._taken = 0  # marks handed to a stream writer, and the last one's counts
        self._last = np.zeros(num_layers, dtype=np.int64)

    def mark(self, passes: np.ndarray) -> int:
        """Close a step at the (L,) cumulative ``passes``; returns the number of marked steps."""
        now = np.asarray(passes, dtype=np.int64).copy()
        with self._lock:
            if (now < (self._marks[-1] if self._marks else self._last)).any():
                raise RuntimeError("the recorder's pass counts went down between two steps")
            self._marks.append(now)
            return self._taken + len(self._marks)

    def per_step(self) -> Optional[np.ndarray]:
        """(L, T) int64 passes per layer per marked step, or None before the first mark (in memory only)."""
        with self._lock:
            if not self._marks:
                return None
            cumulative = np.stack(self._marks, axis=1)
        return np.diff(cumulative, axis=1, prepend=0)

    @property
    def handed(self) -> int:
        """The marks handed to a stream writer so far (``take_into``)."""
        with self._lock:
            return self._taken

    def take_into(self, ends: Sequence[int], inbox: Optional[list[Any]]) -> int:
        """Hand the marks whose passes are all within ``ends`` (per layer, the rows taken so far) to ``inbox``
        as one ``StepsChunk``, in the same step that forgets them (no other thread sees them in neither);
        returns how many steps have been handed over in all. ``inbox`` None (a forked child) drops them.
        Marks are kept in order, so the marks handed over are always the first ones."""
        limit = np.asarray(ends, dtype=np.int64)
        with self._lock:
            n = 0
            while n < len(self._marks) and (self._marks[n] <= limit).all():
                n += 1
            if n:
                cumulative = np.stack(self._marks[:n])
                counts = np.diff(cumulative, axis=0, prepend=self._last[None, :])
                if inbox is not None:
                    inbox.append(StepsChunk(self._taken, counts))
                self._last = cumulative[-1]
                self._taken += n
                del self._marks[:n]
            return self._taken


class StepsChunk(NamedTuple):
    """Marked steps on their way to the sidecar: the first one's index and (steps, L) passes per step."""

    first: int
    counts: np.ndarray


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
