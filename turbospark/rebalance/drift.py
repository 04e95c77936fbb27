"""Routing drift: how fast per-expert loads change from one window of steps to the next.

For a window of w steps (consecutive windows, a shorter tail left out), a
layer's load distribution is its per-expert counts over the window divided
by their sum. Between consecutive windows t and t + 1:

* ``distance``: the total variation distance, half the L1 distance of the two
  distributions (0: the same loads; 1: no expert in common), per layer and
  model-wide (the distribution over every (layer, expert) pair);
* ``hot``: the hottest ``h`` experts of a layer in window t (most load; on
  ties the lower id) and whether they are still among the h hottest at
  t + d. ``overlap[d - 1]`` is the mean share over layers and window pairs
  for d = 1, 2, ...; ``chance`` is h / E, what unrelated windows would show.
  ``half_life_steps`` is the least d x w at which the overlap has lost half
  its excess over chance, ``overlap <= (1 + chance) / 2`` (None: not within
  the capture): how long a placement chosen on one window stays right.

A layer's windows without load are left out of its figures. A small
distance at every window size says rebalancing cannot pay; a half-life
shorter than ``step_interval`` says the placement is stale before it moves.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from .steps import Steps

__all__ = ["drift", "hot_count"]


def hot_count(num_experts: int) -> int:
    """The default hot-set size h: a tenth of the experts, at least one."""
    return max(1, num_experts // 10)


def drift(capture: Any, steps: Steps, windows: Sequence[int], *, hot: Optional[int] = None,
          max_lag: int = 16) -> list[dict[str, Any]]:
    """Per window size w of ``windows`` (in steps): {"window", "windows" (how many), "distance":
    {"model": mean, "model_max", "model_series": the model-wide distance of each consecutive pair (None:
    a window without load), "layers": per-layer mean (None: fewer than two loaded windows)},
    "hot": {"experts": h, "chance", "overlap": [d = 1..max_lag], "half_life_steps"}}.

    Raises ``ValueError`` for a window size below 1 or ``hot`` outside 1..E."""
    experts, layers = capture.num_experts, capture.num_layers
    h = hot_count(experts) if hot is None else hot
    if type(h) is not int or not 1 <= h <= experts:
        raise ValueError(f"--hot must be in 1..{experts}, got {h!r}")
    for w in windows:
        if type(w) is not int or w < 1:
            raise ValueError(f"drift windows must be positive integers, got {w!r}")
    total = steps.count
    sizes = [(w, total // w) for w in windows]
    model_totals = {w: np.zeros(n) for w, n in sizes}
    per_layer: list[dict[int, np.ndarray]] = []
    for layer in range(layers):
        step, _ = steps.layer(layer)
        ids = np.asarray(capture.trace[layer], dtype=np.int64)
        ids = ids[:, None] if ids.ndim == 1 else ids
        counts = np.bincount((step[:, None] * experts + ids).ravel(), minlength=total * experts)
        counts = counts.reshape(total, experts)
        by_size = {}
        for w, n in sizes:
            window_counts = counts[:n * w].reshape(n, w, experts).sum(axis=1)
            model_totals[w] += window_counts.sum(axis=1)
            by_size[w] = window_counts
        per_layer.append(by_size)
    out = []
    for w, n in sizes:
        out.append(_one_size(per_layer, w, n, model_totals[w], h, experts, max_lag))
    return out


def _one_size(per_layer: list[dict[int, np.ndarray]], w: int, n: int, model_total: np.ndarray, h: int,
              experts: int, max_lag: int) -> dict[str, Any]:
    model_gap = np.zeros(max(n - 1, 0))
    layer_means: list[Optional[float]] = []
    hits = np.zeros(max_lag)
    pairs = np.zeros(max_lag)
    for by_size in per_layer:
        counts = by_size[w].astype(np.float64)
        sums = counts.sum(axis=1)
        loaded = sums > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            share = counts / np.where(loaded, sums, 1)[:, None]
            model_share = counts / np.where(model_total > 0, model_total, 1)[:, None]
        if n > 1:
            model_gap += 0.5 * np.abs(model_share[1:] - model_share[:-1]).sum(axis=1)
            both = loaded[1:] & loaded[:-1]
            gaps = 0.5 * np.abs(share[1:] - share[:-1]).sum(axis=1)[both]
            layer_means.append(math.fsum(gaps.tolist()) / gaps.size if gaps.size else None)
        else:
            layer_means.append(None)
        # Hot sets: top h by load, lower id first on ties (a stable sort of -load).
        top = np.argsort(-counts, axis=1, kind="stable")[:, :h]
        member = np.zeros((n, experts), dtype=bool)
        np.put_along_axis(member, top, True, axis=1)
        for lag in range(1, min(max_lag, n - 1) + 1):
            valid = loaded[:-lag] & loaded[lag:]
            if valid.any():
                kept = (member[:-lag] & member[lag:]).sum(axis=1)[valid]
                hits[lag - 1] += kept.sum() / h
                pairs[lag - 1] += valid.sum()
    both_model = (model_total[1:] > 0) & (model_total[:-1] > 0) if n > 1 else np.zeros(0, dtype=bool)
    gaps = model_gap[both_model]
    overlap = [None if pairs[i] == 0 else float(hits[i] / pairs[i]) for i in range(max_lag)]
    chance = h / experts
    half = None
    for lag, value in enumerate(overlap, 1):
        if value is not None and value <= (1 + chance) / 2:
            half = lag * w
            break
    return {"window": w, "windows": n,
            "distance": {"model": math.fsum(gaps.tolist()) / gaps.size if gaps.size else None,
                         "model_series": [None if not ok else float(v) for v, ok in zip(model_gap, both_model)],
                         "model_max": float(gaps.max()) if gaps.size else None, "layers": layer_means},
            "hot": {"experts": h, "chance": chance, "overlap": overlap, "half_life_steps": half}}
