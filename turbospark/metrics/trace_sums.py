"""One layer's trace metrics from exact integer sums, read chunk by chunk: what ``analyze`` reports.

The sums come from ``RunSums``: the compiled ``_metrics_kernels`` (one pass
at a time, O(E) memory per run, ids read in the trace's own width) or its
numpy twin ``_metrics_py`` (forced by ``TURBOSPARK_PUREPYTHON``); both give
the same integers, and the floats are built from them here, once:

* ``window_distinct[M]`` = (sum of the union sizes) / (number of windows);
* ``reuse``, ``pilot_recall``: the sums hold how many passes had each ratio
  a / b; the float of the exact sum of those ratios (each rounded as a / b
  is) is what ``math.fsum`` returns for the per-pass list, so the report is
  bit for bit what the whole-array code gave;
* ``lru_hit_rate[C]`` = (lookups hit at a depth below C) / lookups.

An untagged layer is one run, fed in chunks of ``CHUNK_PASSES`` passes (the
kernel carries the window, reuse and cache state across chunks), so its
memory is a chunk, whatever the layer's length; a streamed capture's pages
are handed back to the kernel after each chunk. A layer with sequence tags
is fed as runs (each sequence's passes in pass order), also chunk by chunk
(``tagged_sums``): a run that starts and ends within a chunk goes to the
layer's accumulator with the chunk's others in one call, a run that crosses
a chunk's end keeps an accumulator of its own until its last pass. Its
memory is then a chunk, an accumulator per sequence in flight at a chunk's
end, and 16 bytes per distinct sequence (its last pass), not the layer.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any, Optional, Sequence

import numpy as np

from ..capture import rows as _rows
from ..capture.rows import _pieces, _release, _row_range, layer_breaks, layer_gaps, gap_text, layer_rows

__all__ = ["backend", "gap_text", "layer_breaks", "layer_gaps", "layer_rows", "new_sums", "run_sums", "runs_of", "sequence_sums", "tagged_sums",
           "trace_values"]

_WIDTHS = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.int64))


def backend() -> Any:
    """The ``RunSums`` class: compiled, or the numpy reference (forced by TURBOSPARK_PUREPYTHON)."""
    if not os.environ.get("TURBOSPARK_PUREPYTHON"):
        try:
            from . import _metrics_kernels

            return _metrics_kernels.RunSums
        except ImportError:
            pass  # a build without the kernels: the twin gives the same numbers
    from . import _metrics_py

    return _metrics_py.RunSums


def new_sums(num_experts: int, top_k: int, windows: Sequence[int], caches: Sequence[int]) -> Any:
    """A fresh accumulator for windows ``windows`` and LRU sizes ``caches`` (either may be empty)."""
    return backend()(num_experts, top_k, list(windows), max(caches, default=0))


def _ready(ids: np.ndarray) -> np.ndarray:
    """``ids`` as the kernel reads them: one of its four widths, C-contiguous (a copy only when not)."""
    if ids.dtype not in _WIDTHS or not ids.dtype.isnative:
        ids = ids.astype(np.int64)
    return np.ascontiguousarray(ids)


def _fitting(windows: Sequence[int], longest: int) -> list[int]:
    """The windows a run of at most ``longest`` passes can fill (and any below 1, for the kernel to refuse).

    A longer window counts no window at all; leaving it out keeps the
    kernel's buffers (M - 1 passes of ring) from growing with it: a window
    of 10**11 would ask for terabytes, 10**19 does not fit int64.
    """
    return [m for m in windows if m <= longest]


def _widened(sums: dict[str, Any], windows: Sequence[int], fitted: Sequence[int]) -> dict[str, Any]:
    """``sums`` of the ``fitted`` windows, with a zero total and count for each other one of ``windows``."""
    if len(set(fitted)) == len(set(windows)):
        return sums
    kept = sorted(set(fitted))
    total = dict(zip(kept, sums["window_total"]))
    count = dict(zip(kept, sums["window_count"]))
    every = sorted(set(windows))
    return dict(sums, window_total=[total.get(m, 0) for m in every], window_count=[count.get(m, 0) for m in every])


def run_sums(
    trace: Any, pred: Optional[Any], layer: int, num_experts: int, top_k: int,
    windows: Sequence[int], caches: Sequence[int], breaks: Sequence[int] = (),
) -> dict[str, Any]:
    """The sums of layer ``layer`` of ``trace`` as one run (``pred``: the predictions, or None), chunk by chunk;
    ``breaks`` (``layer_breaks``) end the run there and start another."""
    passes = layer_rows(trace, layer)
    fitted = _fitting(windows, passes)
    sums = new_sums(num_experts, top_k, fitted, caches)
    guessed = layer_rows(pred, layer) if pred is not None else 0
    for start, stop in _pieces(passes, breaks):
        for lo in range(start, stop, _rows.CHUNK_PASSES):
            hi = min(stop, lo + _rows.CHUNK_PASSES)
            guess = _ready(_row_range(pred, layer, lo, min(hi, guessed))) if lo < guessed else None
            sums.feed(_ready(_row_range(trace, layer, lo, hi)), guess)
            _release(trace)
        sums.end_run()
    return _widened(sums.sums(), windows, fitted)


def runs_of(seq: np.ndarray, keep: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): each sequence's passes (restricted to ``keep``) in pass order, by ascending id."""
    index = np.arange(seq.shape[0], dtype=np.int64) if keep is None else np.flatnonzero(keep).astype(np.int64)
    ids = seq[index]
    order = np.argsort(ids, kind="stable")
    starts = np.flatnonzero(np.diff(ids[order])) + 1
    runs = np.concatenate([[0], starts]).astype(np.int64) if index.size else np.zeros(0, dtype=np.int64)
    return index[order], runs


def sequence_sums(
    ids: np.ndarray, pred: Optional[np.ndarray], runs: tuple[np.ndarray, np.ndarray], num_experts: int,
    top_k: int, windows: Sequence[int], caches: Sequence[int],
) -> dict[str, Any]:
    """The sums of a layer's ``ids`` over ``runs`` (from ``runs_of``), each run its own window and cache."""
    order, starts = runs
    lengths = np.diff(np.append(np.asarray(starts, dtype=np.int64), order.shape[0]))
    fitted = _fitting(windows, int(lengths.max()) if lengths.size else 0)
    sums = new_sums(num_experts, top_k, fitted, caches)
    sums.add_runs(_ready(ids), None if pred is None else _ready(pred), order, starts)
    return _widened(sums.sums(), windows, fitted)


def _add_sums(total: Optional[dict[str, Any]], part: dict[str, Any]) -> dict[str, Any]:
    """``total`` plus ``part`` (``sums()`` dicts): every sum is an integer, so the order of runs is free."""
    if total is None:
        return part
    out: dict[str, Any] = {}
    for key, value in total.items():
        other = part[key]
        out[key] = value + other if isinstance(value, (int, np.ndarray)) else [a + b for a, b in zip(value, other)]
    return out


def _last_passes(seq: Any, phase: Any, layer: int, start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per view (every pass, then the prompt passes, then the decode ones): the distinct sequence ids of the
    layer's rows ``start:stop``, ascending, and the index of each one's last pass in that view, read chunk by chunk."""
    views = [(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in range(3)]
    for lo in range(start, stop, _rows.CHUNK_PASSES):
        hi = min(stop, lo + _rows.CHUNK_PASSES)
        ids = np.asarray(_row_range(seq, layer, lo, hi), dtype=np.int64)
        codes = np.asarray(_row_range(phase, layer, lo, hi))
        for view, keep in enumerate((None, codes == 0, codes == 1)):
            at = np.arange(lo, hi, dtype=np.int64) if keep is None else np.flatnonzero(keep) + lo
            chunk = ids if keep is None else ids[keep]
            if not chunk.size:
                continue
            # The last occurrence of each id: the first in the reversed chunk.
            found, first = np.unique(chunk[::-1], return_index=True)
            last = at[chunk.shape[0] - 1 - first]
            known, known_last = views[view]
            merged = np.union1d(known, found)
            merged_last = np.empty(merged.shape[0], np.int64)
            merged_last[np.searchsorted(merged, known)] = known_last
            merged_last[np.searchsorted(merged, found)] = last  # a later chunk's pass is later
            views[view] = (merged, merged_last)
        _release(seq)
    return views


def tagged_sums(
    trace: Any, pred: Optional[Any], seq: Any, phase: Any, layer: int, num_experts: int, top_k: int,
    windows: Sequence[int], caches: Sequence[int], breaks: Sequence[int] = (),
) -> list[tuple[int, Optional[dict[str, Any]]]]:
    """(passes, sums) of a tagged layer: over each sequence's passes, then its prompt passes, then its decode ones.

    Exactly ``sequence_sums`` of ``runs_of`` for each view (the same runs, summed in another order),
    read ``CHUNK_PASSES`` passes at a time; ``trace`` None gives the pass counts and no sums. ``breaks``
    (``layer_breaks``) end every sequence's run there: the rows on each side are summed as separate captures.
    """
    out: Optional[list[tuple[int, Optional[dict[str, Any]]]]] = None
    for start, stop in _pieces(layer_rows(seq, layer), breaks):
        piece = _tagged_piece(trace, pred, seq, phase, layer, num_experts, top_k, windows, caches, start, stop)
        out = piece if out is None else [
            (n + m, None if a is None or b is None else _add_sums(a, b)) for (n, a), (m, b) in zip(out, piece)]
    if out is None:  # no rows: the empty piece's counts and (empty) sums
        out = _tagged_piece(trace, pred, seq, phase, layer, num_experts, top_k, windows, caches, 0, 0)
    return out


def _tagged_piece(
    trace: Any, pred: Optional[Any], seq: Any, phase: Any, layer: int, num_experts: int, top_k: int,
    windows: Sequence[int], caches: Sequence[int], start: int, stop: int,
) -> list[tuple[int, Optional[dict[str, Any]]]]:
    """``tagged_sums`` of the layer's rows ``start:stop`` alone."""
    passes = stop
    full_windows, windows = windows, _fitting(windows, stop - start)
    lasts = _last_passes(seq, phase, layer, start, stop) if trace is not None else []
    counted = [0, 0, 0]
    whole = [new_sums(num_experts, top_k, windows, caches) if trace is not None else None for _ in range(3)]
    totals: list[Optional[dict[str, Any]]] = [None, None, None]
    open_runs: list[dict[int, Any]] = [{}, {}, {}]
    guessed = layer_rows(pred, layer) if pred is not None else 0
    for lo in range(start, passes, _rows.CHUNK_PASSES):
        hi = min(passes, lo + _rows.CHUNK_PASSES)
        ids_chunk = np.asarray(_row_range(seq, layer, lo, hi), dtype=np.int64)
        codes = np.asarray(_row_range(phase, layer, lo, hi))
        rows = _ready(_row_range(trace, layer, lo, hi)) if trace is not None else None
        guess = _ready(_row_range(pred, layer, lo, min(hi, guessed))) if trace is not None and lo < guessed else None
        for view, keep in enumerate((None, codes == 0, codes == 1)):
            index = np.arange(hi - lo, dtype=np.int64) if keep is None else np.flatnonzero(keep).astype(np.int64)
            counted[view] += int(index.shape[0])
            if rows is None or not index.size:
                continue
            ids = ids_chunk[index]
            order = np.argsort(ids, kind="stable")
            local = index[order]  # the chunk's passes, by sequence, each sequence's in pass order
            starts = np.concatenate([[0], np.flatnonzero(np.diff(ids[order])) + 1]).astype(np.int64)
            bounds = np.append(starts, local.shape[0])
            group_ids = ids[order][starts]
            known, last = lasts[view]
            ends_here = last[np.searchsorted(known, group_ids)] < hi
            runs = open_runs[view]
            inside = ends_here & np.array([int(sid) not in runs for sid in group_ids.tolist()], dtype=bool)
            if inside.any():
                # Runs wholly within the chunk: one call for all of them.
                lengths = bounds[1:] - bounds[:-1]
                picked = local[np.repeat(inside, lengths)]
                whole[view].add_runs(rows, guess, picked,
                                     np.concatenate([[0], np.cumsum(lengths[inside])[:-1]]).astype(np.int64))
            for g in np.flatnonzero(~inside).tolist():
                sid = int(group_ids[g])
                part = local[bounds[g]:bounds[g + 1]]
                sums = runs.get(sid)
                if sums is None:
                    sums = runs[sid] = new_sums(num_experts, top_k, windows, caches)
                aligned = part[part < (guess.shape[0] if guess is not None else 0)]
                sums.feed(np.ascontiguousarray(rows[part]), None if guess is None else np.ascontiguousarray(guess[aligned]))
                if ends_here[g]:
                    sums.end_run()
                    totals[view] = _add_sums(totals[view], sums.sums())
                    del runs[sid]
        _release(trace)
        _release(seq)
    out: list[tuple[int, Optional[dict[str, Any]]]] = []
    for view in range(3):
        if whole[view] is None:
            out.append((counted[view], None))
            continue
        out.append((counted[view], _widened(_add_sums(totals[view], whole[view].sums()) if totals[view] is not None
                    else whole[view].sums(), full_windows, windows)))
    return out


def _mean_ratio(hist: list[int], width: int) -> Optional[float]:
    """Mean of the per-pass ratios a / b counted in ``hist`` (index a * width + b), as fsum would give it."""
    passes = sum(hist)
    if not passes:
        return None
    exact = sum(Fraction(index // width / (index % width)) * n for index, n in enumerate(hist) if n)
    return float(exact) / passes


def trace_values(
    sums: dict[str, Any], windows: Sequence[int], caches: Sequence[int], pilot: bool
) -> dict[str, Any]:
    """The report's trace keys from ``sums``: window_distinct, reuse, pilot_recall, pilot_exact
    (None unless ``pilot``), and lru_hit_rate when ``caches``."""
    width = int(round(len(sums["reuse"]) ** 0.5))
    out: dict[str, Any] = {
        "window_distinct": {
            str(m): (total / count if count else None)
            for m, total, count in zip(sorted(windows), sums["window_total"], sums["window_count"])
        },
        "reuse": _mean_ratio(sums["reuse"], width),
        "pilot_recall": None,
        "pilot_exact": None,
    }
    if pilot and sums["aligned"]:
        out["pilot_recall"] = _mean_ratio(sums["pilot"], width)
        out["pilot_exact"] = sums["exact"] / sums["aligned"]
    if caches:
        lookups, hits = sums["lookups"], sums["hits"]
        out["lru_hit_rate"] = {str(c): (sum(hits[:c]) / lookups if lookups else None) for c in sorted(caches)}
    return out
