"""Which engine step each traced pass belongs to, and its token index inside that step.

A capture made inside an engine may record its steps (``Capture.step_passes``:
the passes each layer routed in each engine step, from ``RouterHistogram.mark_step``;
``turbospark.capture._steps``); passes after the last mark are one open step.
Without them, steps are formed as ``turbospark place --batch B`` forms them
(``turbospark.placement.samples.serving_steps``): B consecutive passes a step
(the shorter tail a step of its own), or, with sequence tags (``seq`` and
``phase``), the iterations of continuous batching with B rows. ``Steps.how``
says which, for the output.

Within a step, passes keep recorder order: the token index of a pass is its
position among its step's passes (vLLM's router hashes that index to pick a
replica). Layers are formed one at a time (``Steps.layer``), so a streamed
capture's layers are never all held at once.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..capture.sequences import Sequences
from ..metrics.trace_sums import layer_rows
from ..placement.samples import serving_steps
from ..capture._steps import steps_of

__all__ = ["Steps", "form_steps", "recorded_steps"]

RECORDED = "engine steps recorded in the capture"


def recorded_steps(capture: Any) -> Optional[Any]:
    """The capture's recorded engine steps (``Capture.step_passes``, (L, T) passes per step), or None."""
    return getattr(capture, "step_passes", None)


class Steps:
    """Per layer, each pass's step and token index; ``count`` steps in all; ``how`` they were formed."""

    def __init__(self, capture: Any, batch: Optional[int], seqs: Optional[Sequences]) -> None:
        self._capture = capture
        self._batch = batch
        self._seqs = seqs
        self._recorded = recorded_steps(capture)
        if self._recorded is not None:
            self.how = RECORDED
        else:
            kind = "concurrent sequences" if seqs is not None else "consecutive passes"
            self.how = f"formed as place --batch {batch} forms them ({kind}): the capture records no engine steps"
        self.count = self._count()

    def _count(self) -> int:
        layers = self._capture.num_layers
        if self._recorded is None and self._seqs is None:
            assert self._batch is not None  # form_steps checks: no recorded steps needs a batch
            most = max((layer_rows(self._capture.trace, layer) for layer in range(layers)), default=0)
            return -(-most // self._batch)
        return max((int(self.layer(layer)[0].max(initial=-1)) + 1 for layer in range(layers)), default=0)

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(step, token index within the step) of each of ``layer``'s passes, each (P,) int64."""
        if self._recorded is not None:
            step = steps_of(self._recorded, layer, layer_rows(self._capture.trace, layer))
        else:
            passes = layer_rows(self._capture.trace, layer)
            seq = None if self._seqs is None else (self._seqs[0][layer], self._seqs[1][layer])
            assert self._batch is not None
            step = serving_steps(passes, self._batch, seq)
        return step, token_index(step)


def token_index(step: np.ndarray) -> np.ndarray:
    """(P,) int64: each pass's position among the passes of its step, in recorder order."""
    if not (step[1:] < step[:-1]).any():  # in step order already (recorded steps): no sort
        return np.arange(step.shape[0], dtype=np.int64) - np.searchsorted(step, step, side="left")
    order = np.argsort(step, kind="stable")
    ordered = step[order]
    index = np.empty(step.shape[0], dtype=np.int64)
    index[order] = np.arange(step.shape[0]) - np.searchsorted(ordered, ordered, side="left")
    return index


def form_steps(capture: Any, batch: Optional[int] = None, seqs: Optional[Sequences] = None) -> Steps:
    """The ``Steps`` of ``capture``: its recorded engine steps, else batches of ``batch`` passes
    (with ``seqs``: continuous batching). Raises ``ValueError`` when the capture has no trace, or
    records no steps and ``batch`` is None or below 1."""
    if capture.trace is None:
        raise ValueError("per-step figures need the capture's trace (record with trace=True): "
                         "counts alone do not say which passes ran together")
    if recorded_steps(capture) is None:
        if batch is None:
            raise ValueError("the capture records no engine steps: give --batch B to form steps of B passes, "
                             "as place --batch B does")
        if type(batch) is not int or batch < 1:
            raise ValueError(f"--batch must be a positive integer, got {batch!r}")
    return Steps(capture, batch, seqs)
