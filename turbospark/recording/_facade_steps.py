"""The facade's engine steps: ``mark_step`` closes one, and the capture's ``step_passes`` holds them
(each layer's passes per step; the format is ``capture/_steps.py``, docs/format.md)."""

from __future__ import annotations

import threading
from typing import Callable, Optional

import numpy as np
import numpy.typing as npt

from ..capture._steps import StepMarks
from ._backend import CoreBase


class Steps(CoreBase):
    """``mark_step``, for the engines that know their steps (docs/rebalance.md)."""

    # From the facade's other mixins and the core: staged device rows drained, the write lock, passes.
    _drain: Callable[[], None]
    _write_lock: threading.RLock
    _passes_array: Callable[[], npt.NDArray[np.int64]]
    _step_marks: Optional[StepMarks]
    num_layers: int

    def mark_step(self) -> int:
        """Close the current engine step: each layer's passes since the previous mark form one step,
        written as the capture's ``step_passes`` (docs/format.md). Returns the steps marked so far.
        Not a hot path: one read of the per-layer pass counts (staged device rows drained first)."""
        self._drain()
        with self._write_lock:  # two threads' first marks make one StepMarks
            if self._step_marks is None:
                self._step_marks = StepMarks(self.num_layers)
        return self._step_marks.mark(self._passes_array())
