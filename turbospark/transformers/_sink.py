"""Hand router ids to a ``RouterHistogram`` through the best call its core offers.

The hooks produce, per routed layer and forward call, an (n, top_k) id
tensor, an optional row mask (padding, finished sequences) and the rows'
sequence ids and phase. The recorder's batch API (``record_batch``,
``record_prediction_many`` with ``mask=``) takes all of that in one call;
on a core that lacks it, the kept rows are selected into a private copy and
recorded with ``record_many`` / ``record_prediction`` (no sequence tags).

On the CPU every call reaches the recorder at once: ``record_batch`` commits
a block and its tags in the core in about twice a ``record_many``'s time, so
nothing waits on the host (nothing to lose to a Ctrl-C, nothing for a read
to miss). A model on a non-CPU device records through ``turbospark.torch``'s
``DeviceRecorder``, the one staging layer: ids, masks and sequence ids stay
on the device and are staged without a host sync; they reach the recorder in
call order when the staging buffer fills, before every read of the capture
and before every write. With the trace and the probe off it counts on the
device and only the counts cross (no sequence tags then: they are per-pass
data).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["Sink"]


def uses_device_path(device: torch.device) -> bool:
    """Whether ids on ``device`` go through the device path (every non-CPU device)."""
    return device.type != "cpu"


class Sink:
    """Feeds one recorder; built once per capture, so the API checks happen once."""

    def __init__(self, recorder: Any, device: torch.device = torch.device("cpu"), top_k: int = 0) -> None:
        self.recorder = recorder
        self.tags_sequences = hasattr(recorder, "record_batch")
        self._many_prediction = hasattr(recorder, "record_prediction_many")
        self.predicting = bool(recorder.pilot_enabled())
        self.device = device
        self.staging: Any = None
        if uses_device_path(device):
            from turbospark.torch import DeviceRecorder

            self.staging = DeviceRecorder(recorder, device=device, top_k=top_k or None)
            self.tags_sequences = not self.staging.counts_only
            self._moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _on_device(self, value: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A host mask or sequence column on the staging device, copied once per tensor (decode steps reuse theirs)."""
        if value is None or value.device == self.device:
            return value
        moved = self._moved.get(id(value))
        if moved is None or moved[0] is not value:
            moved = (value, value.to(self.device, non_blocking=True))
            if len(self._moved) > 8:
                self._moved.clear()
            self._moved[id(value)] = moved
        return moved[1]

    def _stage(self, record: Any, ids: torch.Tensor, **columns: Any) -> None:
        # One staged call holds at most `capacity` rows: a long prompt goes in slices.
        step = self.staging.capacity
        for start in range(0, ids.shape[0], step):
            part = {k: v[start : start + step] if isinstance(v, torch.Tensor) else v for k, v in columns.items()}
            record(ids[start : start + step], **part)

    def selections(
        self, layer: int, ids: torch.Tensor, mask: Optional[torch.Tensor], seq: Optional[torch.Tensor], phase: str
    ) -> None:
        """Record the rows of ``ids`` that ``mask`` keeps (all when None), tagged with ``seq`` and ``phase``."""
        if self.staging is not None:
            tags = {"seq": self._on_device(seq), "phase": phase} if self.tags_sequences and seq is not None else {}
            self._stage(lambda rows, **c: self.staging.record(layer, rows, **c), ids, mask=self._on_device(mask), **tags)
            return
        ids = _host(ids)
        if self.tags_sequences and seq is not None:
            # Straight to the core, which reads each tensor once into its own copy.
            self.recorder.record_batch(layer, _plain(ids), seq=_plain(_host(seq)), phase=phase,
                                       mask=None if mask is None else _plain(_host(mask)))
            return
        if mask is not None:
            ids = ids[mask]
        if ids.shape[0]:
            self.recorder.record_many(layer, ids.numpy())

    def end_step(self) -> None:
        """Close one engine step (a forward call of the model) after its rows were recorded: ``mark_step``
        reads each layer's pass count, staged device rows handed to the recorder first (a flush per step)."""
        self.recorder.mark_step()

    def predictions(self, layer: int, ids: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Record the pilot's predictions for ``layer``, the rows ``mask`` keeps, aligned with ``selections``."""
        if self.staging is not None:
            self._stage(lambda rows, **c: self.staging.record_prediction(layer, rows, **c), ids, mask=self._on_device(mask))
            return
        ids = _host(ids)
        if self._many_prediction:
            self.recorder.record_prediction_many(layer, ids, mask=mask)
            return
        if mask is not None:
            ids = ids[mask]
        for row in ids.tolist():
            self.recorder.record_prediction(layer, row)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    # A tensor that requires grad has no DLPack view; router ids never need one.
    return tensor.detach() if tensor.requires_grad else tensor


def _host(ids: torch.Tensor) -> torch.Tensor:
    # Only a model spread over CPU and another device gets here with device ids.
    if ids.device.type != "cpu":
        ids = ids.cpu()
    return ids
