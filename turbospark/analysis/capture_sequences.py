"""Reading a capture's per-pass sequence information, for the analyses that form batches or merge.

``turbospark.load`` validates the ``seq`` / ``phase`` keys (one entry per
pass of each layer; phase 0 = prompt, 1 = decode) into ``Capture.seq`` and
``Capture.phase``; this module pairs them up, counts passes, and forms the
serving iterations a continuous-batching server would have run them in
(``place --batch`` and ``cache --shared --batch`` share that definition).
"""

from __future__ import annotations

import heapq
from typing import Optional

import numpy as np

from .capture import Capture

__all__ = ["Sequences", "layer_passes", "sequences", "serving_iterations"]

Sequences = tuple[list[np.ndarray], list[np.ndarray]]


def layer_passes(capture: Capture) -> list[int]:
    """Passes per layer: the trace's rows, or counts total / top_k without a trace."""
    if capture.trace is not None:
        return [int(ids.shape[0]) for ids in capture.trace]
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
