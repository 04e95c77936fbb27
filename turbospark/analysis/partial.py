"""``analyze`` of merged captures from per-(file, layer) partial states, reduced exactly.

A layer of one capture becomes a ``LayerPart``: integers and exact multisets, never a rounded
mean, so the parts of many captures add up to the state of their merge (``turbospark merge``
keeps each file's passes apart as sequences of their own, so no window, pass pair or LRU
lookup spans two files) and ``report`` turns the sum into the very document ``analyze`` gives
for the merged capture, float for float:

* ``passes``, ``entropy_bits``, ``coverage``, ``counts_sum_ok``: from the summed counts.
* ``trace_matches_counts``: the summed bincounts of the traces against the summed counts.
* ``window_distinct[M]``: (sum of union sizes, number of windows), summed; divided once, as
  ``analyze`` divides its own integer totals.
* ``reuse`` and ``pilot_recall`` are ``math.fsum`` of per-pass ratios over a count. A ratio is
  |A n B| / |B| with |B| <= top_k, so a layer holds few distinct values: the part keeps each
  value's multiplicity, the sum is formed exactly (``Fraction``) and rounded once, which is what
  ``math.fsum`` returns (the correctly rounded sum of its inputs, in any order).
* ``pilot_exact``, ``lru_hit_rate[C]``: integer counts (exact passes; lookups and hits below C).
* Per phase: the same over each phase's passes alone; ``sequences``: distinct ids per file, summed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Optional, Sequence

import numpy as np

from .capture import Capture
from .metrics import _passes, _pilot_passes, _reuse_ratios, _window_totals, coverage, entropy_bits, lru_stack_distances, pass_bitsets
from .sequences import PHASE_NAMES, _runs

__all__ = ["Group", "LayerPart", "layer_part", "layer_entry", "trace_mismatch"]


@dataclass
class Group:
    """One view of a layer's passes (all of them, or one phase's), as exactly summable state."""

    passes: int = 0
    windows: dict[int, list[int]] = field(default_factory=dict)  # M -> [sum of union sizes, windows]
    reuse: "Counter[float]" = field(default_factory=Counter)  # ratio -> passes with it
    pilot: "Counter[float]" = field(default_factory=Counter)  # recall ratio -> aligned passes with it
    pilot_exact: int = 0
    lookups: int = 0
    hits: dict[int, int] = field(default_factory=dict)  # C -> lookups at stack distance below C

    def add(self, other: "Group") -> None:
        """Add ``other``'s passes (another file's, of the same layer and view) into this group."""
        self.passes += other.passes
        for m, (total, count) in other.windows.items():
            mine = self.windows.setdefault(m, [0, 0])
            mine[0] += total
            mine[1] += count
        self.reuse.update(other.reuse)
        self.pilot.update(other.pilot)
        self.pilot_exact += other.pilot_exact
        self.lookups += other.lookups
        for c, n in other.hits.items():
            self.hits[c] = self.hits.get(c, 0) + n


@dataclass
class LayerPart:
    """One layer of one capture: its counts, its trace's bincount (None without a trace), its kept and
    dropped passes, and the pooled and per-phase ``Group``s."""

    counts: np.ndarray
    kept: Optional[np.ndarray]
    traced_passes: int
    dropped: int
    pooled: Group
    phases: dict[str, Group]

    def add(self, other: "LayerPart") -> None:
        """Add another file's part of the same layer (merge's sums and concatenations)."""
        self.counts = self.counts + other.counts
        if self.kept is not None and other.kept is not None:
            self.kept = self.kept + other.kept
        self.traced_passes += other.traced_passes
        self.dropped += other.dropped
        self.pooled.add(other.pooled)
        for name, group in other.phases.items():
            self.phases[name].add(group)


def layer_part(capture: Capture, layer: int, windows: Sequence[int], caches: Sequence[int]) -> LayerPart:
    """The exact partial state of ``layer`` of ``capture`` (windows and caches sorted, distinct).

    Passes of a capture without sequence tags form one run, all decode (as ``merge`` tags them).
    """
    counts = np.asarray(capture.counts[layer], dtype=np.int64)
    dropped = 0 if capture.trace_dropped is None else int(capture.trace_dropped[layer])
    if capture.seq is not None and capture.phase is not None:
        seq, phase = capture.seq[layer], capture.phase[layer]
    else:
        passes = int(capture.trace[layer].shape[0]) if capture.trace is not None else _untagged_passes(capture, layer)
        seq, phase = np.zeros(passes, dtype=np.int64), np.ones(passes, dtype=np.int64)
    if capture.trace is None:
        views = {name: Group(passes=int(np.count_nonzero(phase == code))) for code, name in enumerate(PHASE_NAMES)}
        return LayerPart(counts, None, 0, dropped, Group(passes=int(seq.shape[0])), views)
    # Ids may come in a narrow unsigned dtype (a streamed capture): widen before any arithmetic.
    ids = np.asarray(capture.trace[layer]).astype(np.int64, copy=False)
    bits = pass_bitsets(ids, capture.num_experts)
    guess = None
    if layer > 0 and capture.pred is not None:
        guess = pass_bitsets(np.asarray(capture.pred[layer]).astype(np.int64, copy=False), capture.num_experts)
    kept = np.bincount(ids.ravel(), minlength=capture.num_experts).astype(np.int64)

    def group(keep: Optional[np.ndarray]) -> Group:
        return _group(ids, bits, guess, _runs(seq, keep), capture.num_experts, windows, caches)

    views = {name: group(phase == code) for code, name in enumerate(PHASE_NAMES)}
    return LayerPart(counts, kept, int(ids.shape[0]), dropped, group(None), views)


def _untagged_passes(capture: Capture, layer: int) -> int:
    k = capture.top_k
    return int(capture.counts[layer].sum()) // k if k else 0


def _group(ids: np.ndarray, bits: np.ndarray, guess: Optional[np.ndarray], runs: list[np.ndarray],
           num_experts: int, windows: Sequence[int], caches: Sequence[int]) -> Group:
    """The sums ``sequences._metrics`` divides, over the given runs (each one sequence's passes, in order)."""
    out = Group(passes=int(sum(run.shape[0] for run in runs)), windows={m: [0, 0] for m in windows},
                hits={c: 0 for c in caches})
    ratios = []
    for run in runs:
        for m, (total, count) in _window_totals(bits[run], windows).items():
            out.windows[m][0] += total
            out.windows[m][1] += count
        ratios.append(_reuse_ratios(bits[run]))
        if caches:
            distances = lru_stack_distances(ids[run], num_experts)
            out.lookups += int(distances.shape[0])
            seen = np.sort(distances[distances >= 0])
            for c in caches:
                out.hits[c] += int(np.searchsorted(seen, c, side="left"))
    out.reuse = _multiset(np.concatenate(ratios) if ratios else np.zeros(0))
    if guess is not None:
        # Predictions align with passes by index, over their common prefix.
        aligned = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
        aligned = np.sort(aligned[aligned < guess.shape[0]])
        recall, exact = _pilot_passes(guess[aligned], bits[aligned])
        out.pilot = _multiset(recall)
        out.pilot_exact = int(exact.sum())
    return out


def _multiset(values: np.ndarray) -> "Counter[float]":
    found, counts = np.unique(values, return_counts=True)
    return Counter(dict(zip(found.tolist(), counts.tolist())))


def _mean(values: "Counter[float]") -> Optional[float]:
    """``math.fsum`` of the multiset over its size: the exact sum, rounded once, then divided."""
    size = sum(values.values())
    if size == 0:
        return None
    return float(sum((Fraction(value) * n for value, n in values.items()), Fraction(0))) / size


def _metrics(group: Group, layer: int, traced: bool, predicted: bool, caches: Sequence[int]) -> dict[str, Any]:
    """One view's keys, as ``sequences._metrics`` writes them."""
    out: dict[str, Any] = {"passes": group.passes, "window_distinct": None, "reuse": None,
                           "pilot_recall": None, "pilot_exact": None}
    if not traced:
        return out
    out["window_distinct"] = {str(m): (t / c if c else None) for m, (t, c) in group.windows.items()}
    out["reuse"] = _mean(group.reuse)
    if layer > 0 and predicted:
        aligned = sum(group.pilot.values())
        if aligned:
            out["pilot_recall"], out["pilot_exact"] = _mean(group.pilot), group.pilot_exact / aligned
    if caches:
        out["lru_hit_rate"] = {str(c): (group.hits[c] / group.lookups if group.lookups else None) for c in caches}
    return out


def layer_entry(part: LayerPart, layer: int, top_k: int, *, traced: bool, predicted: bool, tagged: bool,
                caches: Sequence[int]) -> dict[str, Any]:
    """The ``layers[layer]`` entry of ``analyze``'s document, from the layer's summed part."""
    entry: dict[str, Any] = {"layer": layer, "passes": _passes(int(part.counts.sum()), top_k),
                             "entropy_bits": entropy_bits(part.counts), "coverage": coverage(part.counts)}
    pooled = _metrics(part.pooled, layer, traced, predicted, caches)
    del pooled["passes"]
    entry.update(pooled)
    if tagged:
        entry["phases"] = {name: _metrics(part.phases[name], layer, traced, predicted, caches) for name in PHASE_NAMES}
    return entry


def trace_mismatch(part: LayerPart, top_k: int) -> bool:
    """Whether the layer's trace fails ``trace_matches_counts`` (``metrics.trace_mismatches``' rule)."""
    assert part.kept is not None
    if not part.dropped:
        return not np.array_equal(part.kept, part.counts)
    passes = (part.traced_passes + part.dropped) * top_k
    return passes != int(part.counts.sum()) or bool((part.kept > part.counts).any())
