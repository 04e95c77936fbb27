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

import math
from typing import Any, Optional, Sequence

import numpy as np

from .metrics import (
    _pilot_passes,
    _reuse_ratios,
    _window_totals,
    lru_stack_distances,
    pass_bitsets,
)
from .capture import Capture

__all__ = ["PHASE_NAMES", "layer_by_sequence", "sequence_ids", "split"]

PHASE_NAMES: tuple[str, ...] = ("prompt", "decode")


def sequence_ids(capture: Capture) -> list[int]:
    """The distinct sequence ids of a capture, ascending (empty without sequence information)."""
    if capture.seq is None:
        return []
    rows = [row for row in capture.seq if row.size]
    return np.unique(np.concatenate(rows)).tolist() if rows else []


def _runs(seq: np.ndarray, keep: Optional[np.ndarray]) -> list[np.ndarray]:
    """Pass indices of each sequence (restricted to ``keep``), in pass order, by ascending id."""
    index = np.arange(seq.shape[0]) if keep is None else np.nonzero(keep)[0]
    ids = seq[index]
    order = np.argsort(ids, kind="stable")
    boundaries = np.nonzero(np.diff(ids[order]))[0] + 1
    return [index[part] for part in np.split(order, boundaries) if part.size]


def layer_by_sequence(
    capture: Capture, layer: int, windows: Sequence[int], caches: Sequence[int]
) -> dict[str, Any]:
    """One layer's trace metrics over each sequence's own passes, pooled and per phase.

    Takes a capture with sequence information, a layer and the window and
    cache sizes; returns the keys ``window_distinct``, ``reuse``,
    ``pilot_recall``, ``pilot_exact`` (and ``lru_hit_rate`` when ``caches``)
    computed that way (all None without a trace, as ``analyze`` reports them),
    plus ``phases``: {"prompt": {...}, "decode": {...}} with ``passes`` and the
    same keys for each phase's passes alone.
    """
    assert capture.seq is not None and capture.phase is not None
    seq, phase = capture.seq[layer], capture.phase[layer]
    pooled = _metrics(capture, layer, _runs(seq, None), windows, caches)
    del pooled["passes"]
    pooled["phases"] = {
        name: _metrics(capture, layer, _runs(seq, phase == code), windows, caches)
        for code, name in enumerate(PHASE_NAMES)
    }
    return pooled


def _metrics(
    capture: Capture, layer: int, runs: list[np.ndarray], windows: Sequence[int], caches: Sequence[int]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "passes": int(sum(run.shape[0] for run in runs)),
        "window_distinct": None,
        "reuse": None,
        "pilot_recall": None,
        "pilot_exact": None,
    }
    if capture.trace is None:
        return out
    ids = capture.trace[layer]
    bits = pass_bitsets(ids, capture.num_experts)
    totals = {m: [0, 0] for m in windows}
    reuse: list[float] = []
    for run in runs:
        for m, (total, count) in _window_totals(bits[run], windows).items():
            totals[m][0] += total
            totals[m][1] += count
        reuse += _reuse_ratios(bits[run]).tolist()
    out["window_distinct"] = {str(m): (t / c if c else None) for m, (t, c) in totals.items()}
    out["reuse"] = math.fsum(reuse) / len(reuse) if reuse else None
    if layer > 0 and capture.pred is not None:
        out["pilot_recall"], out["pilot_exact"] = _pilot(capture, layer, bits, runs)
    if caches:
        out["lru_hit_rate"] = {str(c): rate for c, rate in _lru_runs(ids, capture.num_experts, runs, caches).items()}
    return out


def _pilot(
    capture: Capture, layer: int, bits: np.ndarray, runs: list[np.ndarray]
) -> tuple[Optional[float], Optional[float]]:
    assert capture.pred is not None
    guess = pass_bitsets(capture.pred[layer], capture.num_experts)
    # Predictions align with passes by index, over their common prefix.
    aligned = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
    aligned = np.sort(aligned[aligned < guess.shape[0]])
    if aligned.size == 0:
        return None, None
    ratios, exact = _pilot_passes(guess[aligned], bits[aligned])
    return math.fsum(ratios.tolist()) / aligned.size, int(exact.sum()) / aligned.size


def _lru_runs(
    ids: np.ndarray, num_experts: int, runs: list[np.ndarray], caches: Sequence[int]
) -> dict[int, Optional[float]]:
    # Each sequence has its own cache, empty at its first pass.
    distances = [lru_stack_distances(ids[run], num_experts) for run in runs]
    lookups = sum(d.shape[0] for d in distances)
    if lookups == 0:
        return {c: None for c in caches}
    seen = np.sort(np.concatenate([d[d >= 0] for d in distances]))
    return {c: int(np.searchsorted(seen, c, side="left")) / lookups for c in caches}


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
