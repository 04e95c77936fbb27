"""The static buffer routed ids are written into inside the (possibly compiled) forward.

Under ``torch.compile`` a Python callback runs once, at trace time; only
tensor writes into preallocated buffers survive in the compiled graph (and
in a captured CUDA graph). So each router's ``capture_fn`` does exactly two
tensor writes and nothing else: the step's ids into its layer's rows of
``ids`` and the number of rows into ``rows``. The rows are read after the
step, outside the compiled region (``_session``). The buffer holds the
routed layers only, slot i for the i-th routed layer (dense layers route
nothing), so one ``min`` over ``rows`` checks every routed layer.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["StaticBuffer"]

# ``rows`` before a step: a layer still reading this after the step never called capture_fn.
NOT_CALLED = -1


class StaticBuffer:
    """``ids`` (slots, capacity, top_k) int32 and ``rows`` (slots,) int64 on ``device``: one slot per routed layer.

    ``step_tokens``: the most tokens one step schedules on this rank (default
    ``capacity``); a data-parallel rank's routers may see every rank's rows,
    so its ``capacity`` is ``step_tokens`` times the ranks.
    """

    def __init__(self, slots: int, capacity: int, top_k: int, device: torch.device,
                 step_tokens: Optional[int] = None) -> None:
        self.capacity = capacity
        self.step_tokens = capacity if step_tokens is None else step_tokens
        with torch.inference_mode(False):
            # Ordinary tensors, wherever the worker builds them: the device hand-over resets ``rows`` in
            # place after the step, outside vLLM's inference mode, which an inference tensor would refuse.
            self.ids = torch.zeros((slots, capacity, top_k), dtype=torch.int32, device=device)
            self.rows = torch.full((slots,), NOT_CALLED, dtype=torch.int64, device=device)

    def capture_fn(self, slot: int) -> "LayerCapture":
        """The ``capture_fn`` of the router whose rows go to ``slot``."""
        return LayerCapture(self, slot)


class LayerCapture:
    """One router's ``capture_fn``: ids (n, top_k) into its static rows; graph-safe (tensor writes only)."""

    def __init__(self, buffer: StaticBuffer, slot: int) -> None:
        self.slot = slot
        self.ids = buffer.ids[slot]
        self.rows = buffer.rows[slot : slot + 1]

    def __call__(self, topk_ids: torch.Tensor) -> None:
        n = topk_ids.shape[0]
        self.ids[:n].copy_(topk_ids)
        self.rows.fill_(n)
