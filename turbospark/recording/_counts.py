"""Validation of whole passes added by their counts alone (the device path's counts-only mode).

Shared by both cores' ``_add_counts``, so they accept and refuse the same
blocks with the same messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def added_counts(
    counts: Any, passes: Any, top_k: int, num_layers: int, num_experts: int, known_k: int, ids_kept: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Private int64 copies of ``counts`` (L, E) and ``passes`` (L,), or raise ValueError/TypeError.

    ``known_k`` is the recorder's top_k (or 0 while unknown); ``ids_kept``
    whether it keeps a trace or predictions, which passes without ids cannot
    join. Every row must sum to its passes times ``top_k``.
    """
    if ids_kept:
        raise ValueError("counts without ids cannot be added while the trace or the pilot probe is on")
    if not isinstance(counts, np.ndarray) or not isinstance(passes, np.ndarray):
        raise TypeError("counts and passes must be numpy arrays")
    if counts.dtype != np.int64 or passes.dtype != np.int64:
        raise TypeError(f"counts and passes must be int64, got {counts.dtype} and {passes.dtype}")
    if counts.shape != (num_layers, num_experts) or passes.shape != (num_layers,):
        raise ValueError(
            f"counts must be ({num_layers}, {num_experts}) and passes ({num_layers},), "
            f"got {counts.shape} and {passes.shape}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    if known_k and top_k != known_k:
        raise ValueError(f"top_k is {known_k}, got counts of top-{top_k} passes")
    counts, passes = counts.copy(), passes.copy()
    if counts.size and counts.min() < 0:
        raise ValueError(f"counts hold a negative value {int(counts.min())}")
    if passes.size and passes.min() < 0:
        raise ValueError(f"passes hold a negative value {int(passes.min())}")
    wrong = np.nonzero(counts.sum(axis=1) != passes * top_k)[0]
    if wrong.size:
        layer = int(wrong[0])
        raise ValueError(
            f"counts of layer {layer} sum to {int(counts[layer].sum())}, "
            f"not passes x top_k = {int(passes[layer])} x {top_k}"
        )
    return counts, passes
