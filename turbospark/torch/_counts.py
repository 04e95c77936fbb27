"""Counts-only device recording: an (L, E) device count matrix updated with ``index_add_``.

With the recorder's trace and probe off, no id crosses to the host: each
call adds to the device counts, and a flush moves only those counts and the
per-layer pass totals (``DeviceRecorder``'s counts-only mode).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from . import _transfer
from ._buffers import _keep_rows


class DeviceCounts:
    """The device count matrix of a counts-only ``DeviceRecorder``, its scratch rows and their host copies."""

    def __init__(self, num_layers: int, num_experts: int, top_k: int, capacity: int, device: torch.device,
                 arange: torch.Tensor, pinned: bool) -> None:
        dev = device
        self._num_experts = num_experts
        self._top_k = top_k
        self._arange = arange  # the owner's row index 0..capacity-1
        # Columns E and E + 1 collect dropped rows and out-of-range ids.
        self._counts = torch.zeros((num_layers, num_experts + 2), dtype=torch.int64, device=dev)
        self._passes = torch.zeros(num_layers, dtype=torch.int64, device=dev)
        self._block = torch.zeros((capacity, top_k), dtype=torch.int64, device=dev)
        self._keep = torch.zeros(capacity, dtype=torch.bool, device=dev)
        self._flags = torch.zeros((capacity, top_k), dtype=torch.bool, device=dev)
        self._dropped = torch.zeros(capacity, dtype=torch.bool, device=dev)
        self._ones = torch.ones(1, dtype=torch.int64, device=dev).expand(capacity * top_k)
        self._host_counts = torch.zeros(self._counts.shape, dtype=torch.int64, pin_memory=pinned)
        self._host_passes = torch.zeros(num_layers, dtype=torch.int64, pin_memory=pinned)

    def tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What this allocated: (on the device, in host memory); the shared row index excluded."""
        return ([self._counts, self._passes, self._block, self._keep, self._flags, self._dropped, self._ones[:1]],
                [self._host_counts, self._host_passes])

    def count(self, index: int, ids: torch.Tensor, start: int, stop: int, valid: Any, mask: Any) -> None:
        """Count rows start..stop of one call into the device counts."""
        rows, e = stop - start, self._num_experts
        block = self._block[:rows]
        block.copy_(ids[start:stop])
        keep = self._keep[:rows]
        # Row start + i is kept when start + i < valid: compare i with valid - start.
        shifted = valid if valid is None or start == 0 else valid - start
        _keep_rows(keep, self._arange, rows, shifted, None if mask is None else mask[start:stop])
        flags = self._flags[:rows]
        # Out-of-range ids go to column E + 1, dropped rows to column E.
        torch.lt(block, 0, out=flags)
        block.masked_fill_(flags, e + 1)
        torch.ge(block, e, out=flags)
        block.masked_fill_(flags, e + 1)
        dropped = self._dropped[:rows]
        torch.logical_not(keep, out=dropped)
        block.masked_fill_(dropped.unsqueeze(1), e)
        self._counts[index].index_add_(0, block.view(-1), self._ones[: rows * self._top_k])
        self._passes[index : index + 1].add_(keep.sum())

    def flush(self, hist: Any, side: Optional[Any]) -> None:
        """Add the counts so far to ``hist`` and zero them; ValueError (after adding the others) for layers
        with out-of-range ids in kept rows, whose passes since the last flush are not recorded."""
        _transfer._to_host(side, [(self._host_counts, self._counts), (self._host_passes, self._passes)])
        self._counts.zero_()
        self._passes.zero_()
        counts = self._host_counts.numpy().copy()
        passes = self._host_passes.numpy().copy()
        bad = counts[:, self._num_experts + 1]
        good = bad == 0
        e = self._num_experts
        if good.any():
            hist._add_counts(np.where(good[:, None], counts[:, :e], 0), np.where(good, passes, 0), self._top_k)
        if not good.all():
            layers = np.nonzero(~good)[0].tolist()
            raise ValueError(
                f"expert ids outside [0, {e}) in kept rows of layer(s) {layers} "
                f"({int(bad.sum())} ids): those layers' passes since the last flush were not recorded"
            )
