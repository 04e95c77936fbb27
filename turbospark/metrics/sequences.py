"""Trace metrics of a batched capture, per sequence and per phase, never across sequences.

A runtime that routes a batch records the rows of many sequences interleaved
in one trace (``RouterHistogram.record_batch``), with each pass's sequence id
and phase (0 = prompt, 1 = decode) in ``Capture.seq`` / ``Capture.phase``.
Window, reuse and LRU metrics are about one sequence's consecutive passes, so
here each sequence's passes of a layer form their own run, in pass order:

* pooled (the layer entry's own keys): every run is a sequence's passes;
* per phase (``"phases": {"prompt": ..., "decode": ...}``): every run is a
  sequence's passes of that phase, as if the capture held only those.

Means are pooled over runs exactly as over one long trace: window sizes and
LRU hits are summed and divided once by the total window and lookup counts,
reuse and pilot ratios are summed with ``math.fsum`` over all of them. A run
of one sequence therefore gives exactly what a capture of that sequence alone
gives (``split`` builds such captures).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..capture.reader import Capture
from ..capture.rows import CHUNK_PASSES, layer_breaks, layer_rows
from .trace_sums import tagged_sums, trace_values

__all__ = ["PHASE_NAMES", "layer_and_counts", "layer_by_sequence", "sequence_ids", "split"]

PHASE_NAMES: tuple[str, ...] = ("prompt", "decode")


def sequence_ids(capture: Capture) -> list[int]:
    """The distinct sequence ids of a capture, ascending (empty without sequence information)."""
    if capture.seq is None:
        return []
    # A layer's ids a chunk at a time (a streamed layer is never built whole): memory is the distinct ids.
    found = np.zeros(0, dtype=np.int64)
    for layer in range(len(capture.seq)):
        passes = layer_rows(capture.seq, layer)
        for lo in range(0, passes, CHUNK_PASSES):
            chunk = _seq_range(capture.seq, layer, lo, min(passes, lo + CHUNK_PASSES))
            found = np.union1d(found, np.unique(chunk))
        release = getattr(capture.seq, "release", None)
        if release is not None:
            release()
    return found.tolist()


def _seq_range(seq: Any, layer: int, lo: int, hi: int) -> np.ndarray:
    piece = getattr(seq, "row_range", None)
    return np.asarray(piece(layer, lo, hi) if piece is not None else seq[layer][lo:hi], dtype=np.int64)


def layer_by_sequence(
    capture: Capture, layer: int, windows: Sequence[int], caches: Sequence[int]
) -> dict[str, Any]:
    """One layer's trace metrics over each sequence's own passes, pooled and per phase.

    Takes a capture with sequence information, a layer and the window and
    cache sizes (ascending, distinct); returns the keys ``window_distinct``,
    ``reuse``, ``pilot_recall``, ``pilot_exact`` (and ``lru_hit_rate`` when
    ``caches``) computed that way (all None without a trace, as ``analyze``
    reports them), plus ``phases``: {"prompt": {...}, "decode": {...}} with
    ``passes`` and the same keys for each phase's passes alone.
    """
    return layer_and_counts(capture, layer, windows, caches)[0]


def layer_and_counts(
    capture: Capture, layer: int, windows: Sequence[int], caches: Sequence[int]
) -> tuple[dict[str, Any], Optional[np.ndarray]]:
    """``layer_by_sequence`` and the layer's counts recomputed from its trace (None without a trace)."""
    assert capture.seq is not None and capture.phase is not None
    # Predictions align with passes by index, over their common prefix.
    pred = capture.pred if layer > 0 and capture.pred is not None else None
    views = tagged_sums(capture.trace, pred, capture.seq, capture.phase, layer, capture.num_experts,
                        capture.top_k, windows, caches, layer_breaks(capture, layer))
    (pooled, counts), *phases = [_metrics(passes, sums, windows, caches, pred is not None) for passes, sums in views]
    del pooled["passes"]
    pooled["phases"] = {name: phases[code][0] for code, name in enumerate(PHASE_NAMES)}
    return pooled, counts


def _metrics(passes: int, sums: Optional[dict[str, Any]], windows: Sequence[int], caches: Sequence[int],
             pilot: bool) -> tuple[dict[str, Any], Optional[np.ndarray]]:
    out: dict[str, Any] = {
        "passes": passes,
        "window_distinct": None,
        "reuse": None,
        "pilot_recall": None,
        "pilot_exact": None,
    }
    if sums is None:
        return out, None
    out.update(trace_values(sums, windows, caches, pilot))
    return out, sums["counts"]


def split(capture: Capture) -> dict[int, Capture]:
    """Each sequence's passes as a capture of its own: {sequence id: Capture}.

    Counts are recomputed from the sequence's trace; predictions keep those
    aligned with its passes; ``seq``/``phase`` are kept. Needs the trace and
    sequence information; raises ValueError otherwise.
    """
    if capture.seq is None or capture.phase is None:
        raise ValueError("the capture has no sequence information (record with record_batch)")
    if capture.trace is None:
        raise ValueError("splitting by sequence needs the trace")
    out: dict[int, Capture] = {}
    for sid in sequence_ids(capture):
        counts, trace, pred, seq, phase = [], [], [], [], []
        for layer in range(capture.num_layers):
            passes = np.nonzero(capture.seq[layer] == sid)[0]
            ids = capture.trace[layer][passes]
            trace.append(ids)
            counts.append(np.bincount(ids.ravel(), minlength=capture.num_experts).astype(np.int64))
            seq.append(capture.seq[layer][passes])
            phase.append(capture.phase[layer][passes])
            if capture.pred is not None:
                pred.append(capture.pred[layer][passes[passes < capture.pred[layer].shape[0]]])
        out[sid] = Capture(
            capture.num_layers,
            capture.num_experts,
            capture.top_k,
            np.stack(counts) if counts else np.zeros((0, capture.num_experts), dtype=np.int64),
            tuple(trace),
            tuple(pred) if capture.pred is not None else None,
            None,
            seq,
            phase,
        )
    return out
