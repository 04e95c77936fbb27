"""Reading a capture's per-pass sequence information, for the analyses that form batches, split or merge.

``turbospark.load`` validates the ``seq`` / ``phase`` keys (one entry per
pass of each layer; phase 0 = prompt, 1 = decode) into ``Capture.seq`` and
``Capture.phase``; this module pairs them up, counts passes, and splits a
trace into fit and test passes (``fit_split``, shared by ``place --fit`` and
``analyze --holdout``):

* The fraction F is taken exactly: a float is read as the decimal it prints
  as (``0.29`` is 29/100, not the binary double just below it), so the cut
  is floor(F x N) computed in integers (``--fit 0.29`` of 100 passes fits 29).
* With sequence tags (``seq``), a layer is split by sequence: its sequences,
  in order of first appearance in the layer's passes, the first floor(F x S)
  of its S sequences are the fit sequences and all their passes the fit
  passes; the other sequences' passes are the test passes. So on a batched
  capture both halves hold prompt and decode passes (a split by position
  puts every prompt first). A layer whose passes all belong to one sequence
  (a batch-1 ``generate``) has nothing to split by and is split by position.
* Without sequence tags, a layer's first floor(F x P) passes are the fit
  passes and the rest the test passes.

It also forms the serving iterations a continuous-batching server would have
run the passes in (``serving_iterations``: ``place --batch`` and ``cache
--shared --batch`` share that definition).
"""

from __future__ import annotations

import heapq
from fractions import Fraction
from typing import Optional, Union

import numpy as np

from .reader import Capture
from .rows import layer_rows

__all__ = ["SPLIT_BY_PASSES", "SPLIT_BY_SEQUENCES", "Sequences", "exact_fraction", "fit_mask", "fit_split",
           "layer_passes", "sequences", "serving_iterations", "split_unit"]

SPLIT_BY_SEQUENCES = "sequences"
SPLIT_BY_PASSES = "passes"

Sequences = tuple[list[np.ndarray], list[np.ndarray]]


def layer_passes(capture: Capture) -> list[int]:
    """Passes per layer: the trace's rows, or counts total / top_k without a trace."""
    if capture.trace is not None:
        # Without building a streamed capture's layers.
        return [layer_rows(capture.trace, layer) for layer in range(len(capture.trace))]
    k = capture.top_k
    return [int(total) // k if k else 0 for total in capture.totals.tolist()]


def sequences(capture: Capture) -> Optional[Sequences]:
    """(seq, phase) per layer as int64 arrays, or None when the capture has no sequence information."""
    if capture.seq is None or capture.phase is None:
        return None
    return capture.seq, capture.phase


def serving_iterations(seq: np.ndarray, phase: np.ndarray, batch: int) -> np.ndarray:
    """The serving iteration of every pass under continuous batching with ``batch`` rows.

    Sequences, in order of first appearance, each take the row that frees
    first; a sequence's first step holds all its prompt passes (phase 0, one
    prefill), then each step one decode pass; iteration t holds the step each
    running sequence is at. Takes per-pass sequence ids and phases; returns
    a 1-D int64 array of iteration indices.
    """
    _, first, inverse = np.unique(seq, return_index=True, return_inverse=True)
    count = first.shape[0]
    # Step of each pass within its sequence: all prompt passes in step 0 (one
    # prefill), then one decode pass per step (from step 0 if the window holds
    # no prompt pass of that sequence).
    decode = phase != 0
    has_prompt = np.zeros(count, dtype=bool)
    has_prompt[inverse[~decode]] = True
    key = np.where(decode, inverse, -1)
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    step = np.empty(seq.shape[0], dtype=np.int64)
    step[order] = np.arange(seq.shape[0]) - np.searchsorted(sorted_key, sorted_key, side="left")
    step = np.where(decode, step + has_prompt[inverse], 0)
    length = np.zeros(count, dtype=np.int64)
    np.maximum.at(length, inverse, step + 1)
    # Sequences in order of first appearance take the earliest free row.
    start = np.empty(count, dtype=np.int64)
    free = [0] * min(batch, count)
    for index in np.argsort(first, kind="stable").tolist():
        at = heapq.heappop(free)
        start[index] = at
        heapq.heappush(free, at + int(length[index]))
    return start[inverse] + step


def exact_fraction(value: Union[float, int, str, Fraction]) -> Fraction:
    """``value`` as an exact fraction: a float as the decimal it prints as, anything else as given.

    Raises ``ValueError`` when it is not a finite number.
    """
    try:
        return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, TypeError, ZeroDivisionError):
        raise ValueError(f"expected a finite number, got {value!r}") from None


def fit_split(capture: Capture, fit: Fraction) -> tuple[list[np.ndarray], list[str]]:
    """Per layer of the capture's trace, a boolean mask over its passes (True: a fit pass),
    and how the layer was split (``SPLIT_BY_SEQUENCES`` or ``SPLIT_BY_PASSES``); see the module docstring."""
    if capture.trace is None:
        raise ValueError("a split needs the capture's trace: counts alone do not say which passes came first")
    masks, kinds = [], []
    for layer in range(len(capture.trace)):
        mask, kind = fit_mask(capture, layer, fit)
        masks.append(mask)
        kinds.append(kind)
    return masks, kinds


def fit_mask(capture: Capture, layer: int, fit: Fraction) -> tuple[np.ndarray, str]:
    """``fit_split`` of one layer (a trace is required): its fit-pass mask and how it was split."""
    assert capture.trace is not None
    passes = layer_rows(capture.trace, layer)
    seq = None if capture.seq is None else capture.seq[layer]
    if seq is not None:
        found, first = np.unique(seq, return_index=True)
        if found.shape[0] != 1:
            order = found[np.argsort(first, kind="stable")]
            keep = order[: _floor(fit, order.shape[0])]
            return np.isin(seq, keep), SPLIT_BY_SEQUENCES
    return np.arange(passes) < _floor(fit, passes), SPLIT_BY_PASSES


def split_unit(kinds: list[str]) -> str:
    """What the fit fraction counted, for a report line: "passes", "sequences", or both."""
    found = set(kinds)
    if found == {SPLIT_BY_SEQUENCES}:
        return "sequences"
    if SPLIT_BY_SEQUENCES in found:
        return "sequences (passes in a layer of one sequence)"
    return "passes"


def _floor(fit: Fraction, n: int) -> int:
    """floor(fit x n), exactly."""
    return fit.numerator * n // fit.denominator
