"""The passes a placement is chosen from and judged on: fit/test splits and serving batches.

* ``split(capture, fit)``: with ``fit`` = F, each layer's first floor(F x P)
  traced passes are the in-sample (fit) passes and the rest the
  out-of-sample (test) passes; without F, the whole capture's counts are
  both the fit and the in-sample window, and there is no test window.
* ``batch_counts``: the counts of each serving batch of B passes in a window.
  Without sequence information, a batch is B consecutive passes (the
  recorder's pass order; a shorter tail is left out). With it (the ``seq``
  and ``phase`` keys), a batch is what a server's iteration sees under
  continuous batching with B rows: sequences, in order of first
  appearance, each take the row that frees first; a sequence's first step
  holds all its prompt passes (phase 0, one prefill), then each step one
  decode pass; iteration t holds the step each running sequence is at, so
  iterations shrink once no sequence is left to fill a freed row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..analysis.capture_sequences import Sequences, serving_iterations as _continuous_batches
from ..analysis.capture import Capture

__all__ = ["Split", "batch_counts", "split"]


@dataclass(frozen=True)
class Split:
    """Per layer: ``fit`` (L, E) counts; ``test`` (L, E) counts or None; the
    pass ranges ``fit_passes`` / ``test_passes`` per layer (None without a trace)."""

    fit: np.ndarray
    test: Optional[np.ndarray]
    fit_passes: Optional[list[int]]
    test_passes: Optional[list[int]]


def split(capture: Capture, fit: Optional[float]) -> Split:
    """Split ``capture`` at fraction ``fit`` of each layer's passes (None: no split).

    Raises ``ValueError`` when ``fit`` is not strictly between 0 and 1 or the
    capture has no trace to split.
    """
    trace = capture.trace
    if fit is None:
        passes = [int(ids.shape[0]) for ids in trace] if trace is not None else None
        return Split(capture.counts, None, passes, None)
    if not 0 < fit < 1:
        raise ValueError(f"--fit must be strictly between 0 and 1, got {fit}")
    if trace is None:
        raise ValueError("--fit needs the capture's trace (record with trace=True): "
                         "counts alone do not say which passes came first")
    e = capture.num_experts
    cut = [int(fit * ids.shape[0]) for ids in trace]
    fit_counts = np.stack([np.bincount(ids[:c].ravel(), minlength=e) for ids, c in zip(trace, cut)])
    test_counts = np.stack([np.bincount(ids[c:].ravel(), minlength=e) for ids, c in zip(trace, cut)])
    return Split(fit_counts, test_counts, cut, [ids.shape[0] - c for ids, c in zip(trace, cut)])


def batch_counts(ids: np.ndarray, num_experts: int, batch: int,
                 seq: Optional[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """(batches, E) counts of the serving batches of a window's (P, K) ``ids``.

    ``seq``: the window's per-pass (sequence ids, phases), or None (consecutive passes).
    """
    passes = ids.shape[0]
    if seq is None:
        whole = passes // batch
        ids = ids[: whole * batch]
        which = np.repeat(np.arange(whole), batch)
    else:
        which = _continuous_batches(*seq, batch)
        whole = int(which.max(initial=-1)) + 1
    if whole == 0:
        return np.zeros((0, num_experts), dtype=np.int64)
    flat = (which[:, None] * num_experts + ids).ravel()
    return np.bincount(flat, minlength=whole * num_experts).reshape(whole, num_experts)


def window_sequences(seqs: Optional[Sequences], layer: int, start: int,
                     stop: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(sequence ids, phases) of passes start..stop-1 of ``layer``, or None without sequence information."""
    return None if seqs is None else (seqs[0][layer][start:stop], seqs[1][layer][start:stop])
