"""The passes a placement is chosen from and judged on: fit/test splits and serving batches.

* ``split(capture, fit)``: with ``fit`` = F, each layer's traced passes are
  split into in-sample (fit) and out-of-sample (test) passes by
  ``turbospark.capture.sequences.fit_split``: with sequence tags,
  whole sequences (the first floor(F x S) of the layer's S sequences, in
  order of first appearance) are fit and the others test; without them (or
  in a layer of one sequence), the first floor(F x P) passes are fit and the
  rest test; F is taken exactly (``0.29`` of 100 passes is 29). Without F,
  the whole capture's counts are both the fit and the in-sample window, and
  there is no test window.
* ``batch_counts``: the counts of each serving batch of B passes in a window.
  Without sequence information, a batch is B consecutive passes (the
  recorder's pass order; a shorter tail is left out). With it (the ``seq``
  and ``phase`` keys), a batch is what a server's iteration sees under
  continuous batching with B rows: sequences, in order of first
  appearance, each take the row that frees first; a sequence's first step
  holds all its prompt passes (phase 0, one prefill), then each step one
  decode pass; iteration t holds the step each running sequence is at, so
  iterations shrink once no sequence is left to fill a freed row.
* A streamed capture's gap (rows lost to a failed append: ``layer_breaks``)
  ends every batch and step there: the rows on each side are served as two
  runs (a sequence's passes after the gap as a new arrival), so no batch,
  step or round-robin kernel call joins rows across it. The fit split
  itself needs nothing more: it takes whole sequences, or a layer's first
  kept passes, and its windows' batches are cut at the gaps they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from ..capture.sequences import Sequences, exact_fraction, fit_mask
from ..capture.sequences import serving_iterations as _continuous_batches
from ..capture.reader import Capture
from ..capture.rows import layer_rows

__all__ = ["Split", "batch_counts", "serving_steps", "split", "window_breaks"]


@dataclass(frozen=True)
class Split:
    """Per layer: ``fit`` (L, E) counts; ``test`` (L, E) counts or None; the
    pass counts ``fit_passes`` / ``test_passes`` per layer (None without a
    trace); ``fit_masks``, per layer a boolean mask over the trace's passes
    (True: a fit pass), and ``kinds``, how each layer was split ("sequences"
    or "passes"); both None without a split."""

    fit: np.ndarray
    test: Optional[np.ndarray]
    fit_passes: Optional[list[int]]
    test_passes: Optional[list[int]]
    fit_masks: Optional[Sequence[np.ndarray]] = None
    kinds: Optional[list[str]] = None


def split(capture: Capture, fit: Optional[Union[float, Fraction]]) -> Split:
    """Split ``capture``'s trace at fraction ``fit`` (None: no split); see the module docstring.

    Raises ``ValueError`` when ``fit`` is not strictly between 0 and 1 or the
    capture has no trace to split.
    """
    trace = capture.trace
    if fit is None:
        passes = [layer_rows(trace, layer) for layer in range(len(trace))] if trace is not None else None
        return Split(capture.counts, None, passes, None)
    exact = exact_fraction(fit)
    if not 0 < exact < 1:
        raise ValueError(f"--fit must be strictly between 0 and 1, got {fit}")
    if trace is None:
        raise ValueError("--fit needs the capture's trace (record with trace=True): "
                         "counts alone do not say which passes came first")
    e = capture.num_experts
    fit_counts, test_counts, fit_passes, test_passes, kinds = [], [], [], [], []
    # A layer at a time, its mask dropped after: the masks are made again when asked for (FitMasks),
    # so a long capture's split holds no mask per pass of every layer.
    for layer in range(capture.num_layers):
        mask, kind = fit_mask(capture, layer, exact)
        ids = trace[layer]
        fit_counts.append(np.bincount(ids[mask].ravel(), minlength=e))
        test_counts.append(np.bincount(ids[~mask].ravel(), minlength=e))
        fit_passes.append(int(mask.sum()))
        test_passes.append(int(ids.shape[0]) - fit_passes[-1])
        kinds.append(kind)
    return Split(np.stack(fit_counts), np.stack(test_counts), fit_passes, test_passes, FitMasks(capture, exact),
                 kinds)


class FitMasks(Sequence[np.ndarray]):
    """Per layer, ``fit_mask``'s boolean mask over the trace's passes, made when asked for (not kept)."""

    def __init__(self, capture: Capture, fit: Fraction) -> None:
        self._capture = capture
        self._fit = fit

    def __len__(self) -> int:
        return self._capture.num_layers

    def __getitem__(self, layer: Any) -> Any:
        if isinstance(layer, slice):
            return [self[i] for i in range(*layer.indices(len(self)))]
        if layer < 0:
            layer += len(self)
        if not 0 <= layer < len(self):
            raise IndexError(f"layer {layer} out of range for {len(self)} layers")
        return fit_mask(self._capture, layer, self._fit)[0]


def batch_counts(ids: np.ndarray, num_experts: int, batch: int,
                 seq: Optional[tuple[np.ndarray, np.ndarray]], breaks: Sequence[int] = ()) -> np.ndarray:
    """(batches, E) counts of the serving batches of a window's (P, K) ``ids``.

    ``seq``: the window's per-pass (sequence ids, phases), or None (consecutive passes); ``breaks``:
    positions in the window where rows resume after a gap (``window_breaks``): each side's batches are
    its own (a shorter tail of each side is left out).
    """
    pieces = _bounds(ids.shape[0], breaks)
    if len(pieces) > 1:
        parts = [batch_counts(ids[a:b], num_experts, batch, None if seq is None else (seq[0][a:b], seq[1][a:b]))
                 for a, b in pieces]
        return np.concatenate(parts) if parts else np.zeros((0, num_experts), dtype=np.int64)
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


def serving_steps(passes: int, batch: int, seq: Optional[tuple[np.ndarray, np.ndarray]],
                  breaks: Sequence[int] = ()) -> np.ndarray:
    """(P,) the serving step of each of a window's passes, the batches of ``batch_counts``; without
    sequence information B consecutive passes a step, the shorter tail a step of its own (an
    engine serves it too). ``breaks`` as ``batch_counts`` takes them: the steps after a gap follow
    those before it, none holding passes of both sides."""
    pieces = _bounds(passes, breaks)
    if len(pieces) > 1:
        out, after = [], 0
        for a, b in pieces:
            steps = serving_steps(b - a, batch, None if seq is None else (seq[0][a:b], seq[1][a:b])) + after
            after = int(steps.max(initial=after - 1)) + 1
            out.append(steps)
        return np.concatenate(out)
    if seq is None:
        return np.arange(passes, dtype=np.int64) // batch
    return _continuous_batches(*seq, batch)


def window_breaks(breaks: Sequence[int], which: Union[slice, np.ndarray]) -> list[int]:
    """A layer's ``breaks`` (positions in its rows) as positions in the window ``which`` of them
    (``slice(None)``, or a boolean mask over the rows): where the window's rows resume after a gap."""
    if not len(breaks) or isinstance(which, slice):
        assert not isinstance(which, slice) or which == slice(None)
        return list(breaks)
    total = int(np.count_nonzero(which))
    moved = sorted({int(np.count_nonzero(which[:b])) for b in breaks})
    return [b for b in moved if 0 < b < total]


def _bounds(passes: int, breaks: Sequence[int]) -> list[tuple[int, int]]:
    """The (start, stop) row ranges of ``passes`` rows cut at ``breaks``."""
    cuts = [0] + sorted({b for b in breaks if 0 < b < passes}) + [passes]
    return list(zip(cuts[:-1], cuts[1:]))


def window_sequences(seqs: Optional[Sequences], layer: int,
                     which: Union[slice, np.ndarray]) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(sequence ids, phases) of the passes ``which`` (a slice or a boolean mask) of ``layer``,
    or None without sequence information."""
    return None if seqs is None else (seqs[0][layer][which], seqs[1][layer][which])
