"""``analyze`` of merged captures from per-(file, layer) partial states, reduced exactly.

A layer of one capture becomes a ``LayerPart``: integers and exact multisets, never a rounded
mean, so the parts of many captures add up to the state of their merge (``turbospark merge``
keeps each file's passes apart as sequences of their own, so no window, pass pair or LRU
lookup spans two files) and ``report`` turns the sum into the very document ``analyze`` gives
for the merged capture, float for float:

* ``passes``, ``entropy_bits``, ``coverage``, ``counts_sum_ok``: from the summed counts.
* ``trace_matches_counts``: the summed bincounts of the traces against the summed counts.
* the trace metrics: ``trace_sums``' exact integer sums (window union sizes and window counts,
  histograms of the reuse and pilot ratios a / b, exact predictions, LRU lookups and hits by
  depth), summed element by element and turned into floats once by ``trace_sums.trace_values``,
  exactly as ``analyze`` turns its own sums into the merged capture's floats.
* Per phase: the same over each phase's passes alone; ``sequences``: distinct ids per file, summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from ..capture.reader import Capture
from .layers import _passes, coverage, entropy_bits
from .sequences import PHASE_NAMES
from ..capture.rows import layer_breaks
from .trace_sums import run_sums, runs_of, sequence_sums, tagged_sums, trace_values

__all__ = ["Group", "LayerPart", "layer_part", "layer_entry", "trace_mismatch"]


@dataclass
class Group:
    """One view of a layer's passes (all of them, or one phase's): its pass count and, with a trace,
    ``trace_sums``' integer sums (None without a trace)."""

    passes: int = 0
    sums: Optional[dict[str, Any]] = None

    def add(self, other: "Group") -> None:
        """Add ``other``'s passes (another file's, of the same layer and view) into this group."""
        self.passes += other.passes
        if other.sums is None:
            return
        if self.sums is None:
            self.sums = {key: (list(value) if isinstance(value, list) else value) for key, value in other.sums.items()}
            return
        for key, value in other.sums.items():
            mine = self.sums[key]
            if isinstance(value, list):
                self.sums[key] = [a + b for a, b in zip(mine, value)]
            else:
                self.sums[key] = mine + value


@dataclass
class LayerPart:
    """One layer of one capture: its counts, its trace's bincount (None without a trace), its kept and
    dropped passes, and the pooled and per-phase ``Group``s."""

    counts: np.ndarray
    kept: Optional[np.ndarray]
    traced_passes: int
    dropped: int
    pooled: Group
    phases: dict[str, Group] = field(default_factory=dict)

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
    e, k = capture.num_experts, capture.top_k
    phases = capture.phase if capture.seq is not None else None
    tagged = phases is not None
    if capture.trace is None:
        if phases is not None:
            phase = phases[layer]
            views = {name: Group(int(np.count_nonzero(phase == code))) for code, name in enumerate(PHASE_NAMES)}
            return LayerPart(counts, None, 0, dropped, Group(int(phase.shape[0])), views)
        passes = _untagged_passes(capture, layer)
        return LayerPart(counts, None, 0, dropped, Group(passes), {"prompt": Group(0), "decode": Group(passes)})
    pred = capture.pred if layer > 0 else None
    if not tagged:
        # One run, all decode: the pooled view and the decode view are the same sums.
        sums = run_sums(capture.trace, pred, layer, e, k, windows, caches, layer_breaks(capture, layer))
        passes = int(sums["counts"].sum()) // k if k else 0
        kept = np.asarray(sums["counts"], dtype=np.int64)
        return LayerPart(counts, kept, passes, dropped, Group(passes, sums),
                         {"prompt": Group(0, sequence_sums(np.zeros((0, max(k, 1)), np.int64), None,
                                                           runs_of(np.zeros(0, np.int64), None), e, k, windows,
                                                           caches)),
                          "decode": Group(passes, dict(sums))})
    groups = [Group(passes, sums) for passes, sums in
              tagged_sums(capture.trace, pred, capture.seq, capture.phase, layer, e, k, windows, caches,
                          layer_breaks(capture, layer))]
    pooled = groups[0]
    assert pooled.sums is not None, "a layer with a trace has its sums"
    kept = np.asarray(pooled.sums["counts"], dtype=np.int64)
    views = {name: groups[1 + code] for code, name in enumerate(PHASE_NAMES)}
    return LayerPart(counts, kept, pooled.passes, dropped, pooled, views)


def _untagged_passes(capture: Capture, layer: int) -> int:
    k = capture.top_k
    return int(capture.counts[layer].sum()) // k if k else 0


def _metrics(group: Group, layer: int, traced: bool, predicted: bool, windows: Sequence[int],
             caches: Sequence[int]) -> dict[str, Any]:
    """One view's keys, as ``sequences._metrics`` writes them."""
    out: dict[str, Any] = {"passes": group.passes, "window_distinct": None, "reuse": None,
                           "pilot_recall": None, "pilot_exact": None}
    if not traced or group.sums is None:
        return out
    out.update(trace_values(group.sums, windows, caches, layer > 0 and predicted))
    return out


def layer_entry(part: LayerPart, layer: int, top_k: int, *, traced: bool, predicted: bool, tagged: bool,
                windows: Sequence[int], caches: Sequence[int]) -> dict[str, Any]:
    """The ``layers[layer]`` entry of ``analyze``'s document, from the layer's summed part."""
    entry: dict[str, Any] = {"layer": layer, "passes": _passes(int(part.counts.sum()), top_k),
                             "entropy_bits": entropy_bits(part.counts), "coverage": coverage(part.counts)}
    pooled = _metrics(part.pooled, layer, traced, predicted, windows, caches)
    del pooled["passes"]
    entry.update(pooled)
    if tagged:
        entry["phases"] = {name: _metrics(part.phases[name], layer, traced, predicted, windows, caches)
                           for name in PHASE_NAMES}
    return entry


def trace_mismatch(part: LayerPart, top_k: int) -> bool:
    """Whether the layer's trace fails ``trace_matches_counts`` (``metrics.trace_mismatches``' rule)."""
    assert part.kept is not None
    if not part.dropped:
        return not np.array_equal(part.kept, part.counts)
    passes = (part.traced_passes + part.dropped) * top_k
    return passes != int(part.counts.sum()) or bool((part.kept > part.counts).any())
