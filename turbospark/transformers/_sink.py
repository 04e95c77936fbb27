"""Hand router ids to a ``RouterHistogram`` through the best call its core offers.

The hooks produce, per routed layer and forward call, an (n, top_k) id
tensor, an optional row mask (padding, finished sequences) and the rows'
sequence ids and phase. The recorder's batch API (``record_batch``,
``record_prediction_many`` with ``mask=``) takes all of that in one call;
on a core that lacks it, the kept rows are selected into a private copy and
recorded with ``record_many`` / ``record_prediction`` (no sequence tags).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["Sink"]


class Sink:
    """Feeds one recorder; built once per capture, so the API checks happen once."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.tags_sequences = hasattr(recorder, "record_batch")
        self._many_prediction = hasattr(recorder, "record_prediction_many")
        self.predicting = bool(recorder.pilot_enabled())

    def selections(
        self, layer: int, ids: torch.Tensor, mask: Optional[torch.Tensor], seq: Optional[torch.Tensor], phase: str
    ) -> None:
        """Record the rows of ``ids`` that ``mask`` keeps (all when None), tagged with ``seq`` and ``phase``."""
        ids = _host(ids)
        if self.tags_sequences and seq is not None:
            self.recorder.record_batch(layer, ids, seq=seq, phase=phase, mask=mask)
            return
        if mask is not None:
            ids = ids[mask]
        if ids.shape[0]:
            self.recorder.record_many(layer, ids.numpy())

    def predictions(self, layer: int, ids: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Record the pilot's predictions for ``layer``, the rows ``mask`` keeps, aligned with ``selections``."""
        ids = _host(ids)
        if self._many_prediction:
            self.recorder.record_prediction_many(layer, ids, mask=mask)
            return
        if mask is not None:
            ids = ids[mask]
        for row in ids.tolist():
            self.recorder.record_prediction(layer, row)


def _host(ids: torch.Tensor) -> torch.Tensor:
    # The device path (turbospark.torch) is not available on this branch yet:
    # a device tensor is copied to the host, one sync per layer.
    if ids.device.type != "cpu":
        ids = ids.cpu()
    return ids
