"""Per-pass sequence ids and phases, kept beside the core by ``RouterHistogram.record_batch``.

The core knows nothing of sequences: it counts and traces passes. This module
validates ``record_batch``'s extra arguments into private copies and keeps, per
layer, one sequence id and one phase per pass in growable arrays. Passes the
core recorded without sequence information (plain ``record``/``record_many``)
read as sequence 0, phase decode: the columns are padded to the core's pass
count whenever they are extended or written.
"""

from __future__ import annotations

from array import array
from typing import Any, Optional, Sequence

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

    ``seq`` must hold one entry per row (``rows``); only the kept entries must
    be non-negative integers (a dropped padding row may carry -1).
    """
    error = device_error(seq, "seq")
    if error is not None:
        raise error
    if isinstance(seq, (str, bytes)) or seq is None:
        raise TypeError(f"seq must be a sequence of non-negative integers, got {type(seq).__name__} {seq!r}")
    if isinstance(seq, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in seq):
        bad = next(v for v in seq if isinstance(v, (bool, np.bool_)))
        raise TypeError(f"seq must hold integers, found bool {bad!r}")
    try:
        arr = np.asarray(seq).copy()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"seq must be a sequence of non-negative integers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"seq must be 1-D with one id per row, got shape {arr.shape}")
    if arr.shape[0] != rows:
        raise ValueError(f"seq has {arr.shape[0]} entries, expected one per row ({rows})")
    if keep is not None:
        arr = arr[keep]
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind == "O":
        values = arr.tolist()
        stray = next((v for v in values if not isinstance(v, int)), None)
        if stray is not None:
            raise TypeError(f"seq must hold integers, found {type(stray).__name__} {stray!r}")
        low, high = min(values), max(values)
    elif arr.dtype.kind in "iu":
        low, high = int(arr.min()), int(arr.max())
    else:
        raise TypeError(f"seq must hold integers, got dtype {arr.dtype}")
    if low < 0:
        raise ValueError(f"seq holds a negative sequence id {low}")
    if high > np.iinfo(np.int64).max:
        raise ValueError(f"seq holds a sequence id too large for int64: {high}")
    return arr.astype(np.int64)


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


class SequenceColumns:
    """Per layer, the sequence id and phase of every pass, padded to the core's pass counts."""

    def __init__(self, num_layers: int) -> None:
        self._seq = [array("q") for _ in range(num_layers)]
        self._phase = [array("B") for _ in range(num_layers)]

    def extend(self, layer: int, first_pass: int, seq: np.ndarray, phase: int) -> None:
        """Record ``seq`` (one id per pass) in ``phase`` for passes ``first_pass`` onwards of ``layer``."""
        self._pad(layer, first_pass)
        self._seq[layer].frombytes(seq.astype(np.int64, copy=False).tobytes())
        self._phase[layer].frombytes(bytes([phase]) * seq.shape[0])

    def _pad(self, layer: int, passes: int) -> None:
        missing = passes - len(self._seq[layer])
        if missing > 0:
            self._seq[layer].extend([DEFAULT_SEQ] * missing)
            self._phase[layer].extend([DEFAULT_PHASE] * missing)

    def json_tail(self, passes: Sequence[int]) -> bytes:
        """``,"seq":[...],"phase":[...]`` for a document whose layers hold ``passes`` passes.

        Reads only: a write may come between a batch's commit and its
        ``extend`` (a signal handler in that thread), and padding the columns
        here would leave that batch's tags after the defaults for good.
        """
        seq_rows = [_row(self._seq[layer], count, DEFAULT_SEQ) for layer, count in enumerate(passes)]
        phase_rows = [_row(self._phase[layer], count, DEFAULT_PHASE) for layer, count in enumerate(passes)]
        return f',"seq":[{",".join(seq_rows)}],"phase":[{",".join(phase_rows)}]'.encode("ascii")


def _row(column: "array[int]", count: int, default: int) -> str:
    """The first ``count`` entries of ``column`` as JSON, passes it has not reached reading as ``default``."""
    values = column[:count].tolist()
    values.extend([default] * (count - len(values)))
    return "[" + ",".join(map(str, values)) + "]"
