"""``record_batch``'s arguments read into private copies: the block, the mask, the sequence ids, the phase.

Both cores commit a pass and its tag (sequence id, phase) together; this
module is their shared reading of the arguments, in the order both check
them (the compiled core reads common inputs in one pass itself and comes
here for everything else, so the messages are the same). Passes recorded
without tags (plain ``record``/``record_many``) read as ``DEFAULT_SEQ``,
``DEFAULT_PHASE``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _convert

PHASES = {"prompt": 0, "decode": 1}
PHASE_NAMES = ("prompt", "decode")
# What a pass recorded without sequence information reads as.
DEFAULT_SEQ = 0
DEFAULT_PHASE = PHASES["decode"]


def device_error(value: Any, what: str) -> Optional[TypeError]:
    """A TypeError for a tensor that lives on a non-CPU device, else None (torch is never imported)."""
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    if isinstance(kind, str) and kind != "cpu" and hasattr(value, "data_ptr"):
        return TypeError(
            f"{what} is a tensor on device {str(device)!r}; copy it to the CPU, or record device "
            "tensors without a sync through turbospark.torch.DeviceRecorder"
        )
    return None


def phase_code(phase: Any) -> int:
    """0 for ``"prompt"``, 1 for ``"decode"``; raise ValueError naming anything else."""
    if isinstance(phase, str) and phase in PHASES:
        return PHASES[phase]
    raise ValueError(f"phase must be 'prompt' or 'decode', got {phase!r}")


def block_copy(ids: Any) -> np.ndarray:
    """A private (n, k) copy of a block of ids, never a view of the caller's buffer."""
    error = device_error(ids, "ids")
    if error is not None:
        raise error
    arr = _convert.as_array(ids, _convert.TWO_D)
    return np.array(arr, copy=True)


def seq_copy(seq: Any, rows: int, keep: Optional[np.ndarray] = None) -> np.ndarray:
    """The ids of the rows ``keep`` keeps (all without it) as a private 1-D int64 array; raise TypeError/ValueError.

    ``seq`` must hold one integer per row (``rows``), a dropped row's too
    (any integer: a padding row may carry -1, or a sentinel beyond int64);
    only the kept entries must be non-negative int64 sequence ids. Both cores
    apply this one rule (the compiled one reads a list of ints itself and
    hands anything else here).
    """
    error = device_error(seq, "seq")
    if error is not None:
        raise error
    if isinstance(seq, (str, bytes)) or seq is None:
        raise TypeError(f"seq must be a sequence of non-negative integers, got {type(seq).__name__} {seq!r}")
    if isinstance(seq, (list, tuple)) and not any(isinstance(v, (list, tuple, np.ndarray)) for v in seq):
        # Read entry by entry: numpy would turn a list mixing int64 and larger ints into floats.
        for row, value in enumerate(seq):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"seq must hold integers, found {type(value).__name__} {value!r} at row {row}")
        if len(seq) != rows:
            raise ValueError(f"seq has {len(seq)} entries, expected one per row ({rows})")
        kept = [int(v) for v in seq] if keep is None else [int(v) for v, k in zip(seq, keep.tolist()) if k]
        return _checked_ids(kept)
    try:
        arr = np.asarray(seq).copy()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"seq must be a sequence of non-negative integers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"seq must be 1-D with one id per row, got shape {arr.shape}")
    if arr.shape[0] != rows:
        raise ValueError(f"seq has {arr.shape[0]} entries, expected one per row ({rows})")
    if arr.dtype.kind == "O":
        for row, value in enumerate(arr.tolist()):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"seq must hold integers, found {type(value).__name__} {value!r} at row {row}")
    elif arr.dtype.kind not in "iu":
        raise TypeError(f"seq must hold integers, got dtype {arr.dtype}")
    if keep is not None:
        arr = arr[keep]
    if arr.dtype.kind == "O":
        return _checked_ids([int(v) for v in arr.tolist()])
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"seq holds a negative sequence id {int(arr.min())}")
    if arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"seq holds a sequence id too large for int64: {int(arr.max())}")
    return arr.astype(np.int64)


def _checked_ids(values: list[int]) -> np.ndarray:
    """Kept sequence ids (Python ints) as int64; ValueError for one below 0 or beyond int64."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    low, high = min(values), max(values)
    if low < 0:
        raise ValueError(f"seq holds a negative sequence id {low}")
    if high > np.iinfo(np.int64).max:
        raise ValueError(f"seq holds a sequence id too large for int64: {high}")
    return np.array(values, dtype=np.int64)


def mask_copy(mask: Any, rows: int) -> Optional[np.ndarray]:
    """``mask`` as a private 1-D bool array of ``rows`` entries (None stays None); raise TypeError/ValueError."""
    if mask is None:
        return None
    error = device_error(mask, "mask")
    if error is not None:
        raise error
    arr = np.asarray(mask).copy()
    if arr.dtype != np.bool_:
        raise TypeError(f"mask must be boolean, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != rows:
        raise ValueError(f"mask must be 1-D with one entry per row ({rows}), got shape {arr.shape}")
    return arr
