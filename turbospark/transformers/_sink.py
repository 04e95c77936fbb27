"""Hand router ids to a ``RouterHistogram`` through the best call its core offers.

The hooks produce, per routed layer and forward call, an (n, top_k) id
tensor, an optional row mask (padding, finished sequences) and the rows'
sequence ids and phase. The recorder's batch API (``record_batch``,
``record_prediction_many`` with ``mask=``) takes all of that in one call;
on a core that lacks it, the kept rows are selected into a private copy and
recorded with ``record_many`` / ``record_prediction`` (no sequence tags).

A model on a non-CPU device records through ``turbospark.torch``'s
``DeviceRecorder``: ids, masks and sequence ids stay on the device and are
staged without a host sync; they reach the recorder in bulk when the staging
buffer fills and when the capture is written. With the trace and the probe
off it counts on the device and only the counts cross (no sequence tags
then: they are per-pass data).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

__all__ = ["FLUSH_ROWS", "Sink"]

# Rows (over all layers) waiting before a flush to record_batch.
FLUSH_ROWS = 4096


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
        # Host path with tags: blocks wait here and reach record_batch in bulk
        # (one call costs ~20 us whatever its size, several times a decode
        # step's model work per layer on a small model). The recorder drains
        # them before every write, so its file is always complete.
        self._pending: list[list[tuple[list, list, str]]] = [[] for _ in range(recorder.num_layers)]
        self._pending_rows = 0
        self._seq_tensor: Optional[torch.Tensor] = None
        self._seq_list: list = []
        if uses_device_path(device):
            from turbospark.torch import DeviceRecorder

            self.staging = DeviceRecorder(recorder, device=device, top_k=top_k or None)
            self.tags_sequences = not self.staging.counts_only
            self._moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        elif self.tags_sequences:
            recorder._add_drain(self.flush)

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
            # Private copies now (the model may reuse its tensors before the
            # flush), as lists: tolist() is the cheapest read of a fresh tensor.
            if mask is None:
                rows = ids.tolist()
                if seq is not self._seq_tensor:
                    self._seq_tensor, self._seq_list = seq, seq.tolist()
                seqs = self._seq_list
            else:
                rows, seqs = ids[mask].tolist(), seq[mask].tolist()
            if rows:
                self._pending[layer].append((rows, seqs, phase))
                self._pending_rows += len(rows)
                if self._pending_rows >= FLUSH_ROWS:
                    self.flush()
            return
        if mask is not None:
            ids = ids[mask]
        if ids.shape[0]:
            self.recorder.record_many(layer, ids.numpy())

    def flush(self) -> None:
        """Hand the waiting blocks to ``record_batch``: per layer, one call per run of one phase, in order."""
        for layer, entries in enumerate(self._pending):
            if not entries:
                continue
            self._pending[layer] = []
            start = 0
            for end in range(1, len(entries) + 1):
                if end == len(entries) or entries[end][2] != entries[start][2]:
                    run = entries[start:end]
                    ids = np.array([row for entry in run for row in entry[0]], dtype=np.int64)
                    seq = np.array([item for entry in run for item in entry[1]], dtype=np.int64)
                    self.recorder.record_batch(layer, ids, seq=seq, phase=run[0][2])
                    start = end
        self._pending_rows = 0

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


def _host(ids: torch.Tensor) -> torch.Tensor:
    # Only a model spread over CPU and another device gets here with device ids.
    if ids.device.type != "cpu":
        ids = ids.cpu()
    return ids
