"""The device path's staging rows: their sizes, the host's record of each staged call, and the row writes."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

# Rows of top_k ids staged before a flush: for top-8, 5.1 MiB on the device
# and 4.6 MiB of pinned host memory (see staging_bytes).
DEFAULT_CAPACITY = 65536
# Counts-only: rows counted per chunk of a call (scratch space, not a limit).
COUNTS_ONLY_CAPACITY = 4096

_SELECTION, _PREDICTION = 0, 1
# A staged call with no sequence information.
_NO_PHASE = -1


def staging_bytes(capacity: int, top_k: int) -> tuple[int, int]:
    """(device bytes, host bytes) of a staging buffer of ``capacity`` rows of ``top_k`` ids.

    A row is top_k int64 ids, one int64 sequence id and one bool keep flag,
    on the device and again in (pinned) host memory; the device also holds an
    int64 row index per row.
    """
    row = 8 * top_k + 8 + 1
    return capacity * (row + 8), capacity * row


class _Call(NamedTuple):
    """One staged per-layer call, as the host knows it (no device values)."""

    kind: int
    layer: int
    start: int
    rows: int
    phase: int


class _Host(NamedTuple):
    """One staged call's rows, copied to the host, ready to hand to the recorder."""

    call: _Call
    ids: np.ndarray
    keep: np.ndarray
    seq: np.ndarray


class _Buffers:
    """Ids, keep flags and sequence ids of ``capacity`` rows on one device."""

    def __init__(self, capacity: int, top_k: int, device: torch.device, pin: bool) -> None:
        self.ids = torch.zeros((capacity, top_k), dtype=torch.int64, device=device, pin_memory=pin)
        self.keep = torch.zeros(capacity, dtype=torch.bool, device=device, pin_memory=pin)
        self.seq = torch.zeros(capacity, dtype=torch.int64, device=device, pin_memory=pin)

    def copy_rows(self, source: "_Buffers", start: int, rows: int, at: int = 0) -> None:
        for mine, theirs in ((self.ids, source.ids), (self.keep, source.keep), (self.seq, source.seq)):
            mine[at : at + rows].copy_(theirs[start : start + rows], non_blocking=True)



def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _keep_rows(keep: torch.Tensor, arange: torch.Tensor, rows: int, valid: Any, mask: Any) -> None:
    """keep[i] = i < valid and mask[i], on the device."""
    if valid is None:
        keep.fill_(True)
    else:
        torch.lt(arange[:rows], valid, out=keep)
    if mask is not None:
        keep.logical_and_(mask)


def _write_rows(buffers: _Buffers, arange: torch.Tensor, call: _Call, ids: torch.Tensor, valid: Any, mask: Any, seq: Any) -> None:
    part = slice(call.start, call.start + call.rows)
    buffers.ids[part].copy_(ids)
    _keep_rows(buffers.keep[part], arange, call.rows, valid, mask)
    if isinstance(seq, torch.Tensor):
        buffers.seq[part].copy_(seq)
    else:
        buffers.seq[part].fill_(0 if seq is None else seq)


