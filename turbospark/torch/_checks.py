"""What the host can check of a per-layer call without reading a device value (``DeviceRecorder``'s checks)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..recording import _sequences
from ._buffers import _NO_PHASE


def check_ids(ids: Any, device: torch.device, top_k: int) -> torch.Tensor:
    """``ids`` as an (n, top_k) integer tensor on ``device`` (one row unsqueezed); TypeError/ValueError else."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a torch.Tensor on {device}, got {type(ids).__name__}")
    if ids.device != device:
        raise TypeError(f"ids are on device {str(ids.device)!r}, this recorder stages on {str(device)!r}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"ids must have an integer dtype, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] != top_k:
        raise ValueError(f"ids must be (n, {top_k}) or ({top_k},), got shape {tuple(ids.shape)}")
    return ids


def check_rows(name: str, value: Any, rows: int, dtype: Optional[torch.dtype], device: torch.device) -> None:
    """None, or a (rows,) tensor on ``device`` of ``dtype`` (None: any integer dtype)."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor) or value.device != device:
        where = str(value.device) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{name} must be a tensor on {str(device)!r}, got {where}")
    if dtype is not None and value.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {value.dtype}")
    if dtype is None and (value.dtype == torch.bool or value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    if tuple(value.shape) != (rows,):
        raise ValueError(f"{name} must have shape ({rows},), got {tuple(value.shape)}")


def check_valid(valid: Any, device: torch.device) -> None:
    """None, a non-negative int, or a one-element integer tensor on ``device``."""
    if valid is None:
        return
    if isinstance(valid, torch.Tensor):
        if valid.device != device or valid.numel() != 1:
            raise TypeError(f"valid must be an int or a one-element tensor on {str(device)!r}")
        if valid.dtype == torch.bool or valid.is_floating_point() or valid.is_complex():
            raise TypeError(f"valid must have an integer dtype, got {valid.dtype}")
        return
    if isinstance(valid, bool) or not isinstance(valid, int) or valid < 0:
        raise TypeError(f"valid must be a non-negative int or a device tensor, got {valid!r}")


def check_seq(seq: Any, phase: Any, rows: int, device: torch.device, counts_only: bool) -> int:
    """The phase code of a (seq, phase) pair (``_NO_PHASE`` for neither); raises for a bad or lone one."""
    if seq is None and phase is None:
        return _NO_PHASE
    if seq is None or phase is None:
        raise ValueError("seq and phase come together: give both or neither")
    code = _sequences.phase_code(phase)
    if counts_only:
        raise ValueError(
            "sequence ids need per-pass data, which counts-only recording does not move to the host: "
            "create the DeviceRecorder with counts_only=False"
        )
    if isinstance(seq, int) and not isinstance(seq, bool):
        if seq < 0:
            raise ValueError(f"seq holds a negative sequence id {seq}")
        return code
    check_rows("seq", seq, rows, None, device)
    return code
