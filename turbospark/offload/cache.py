"""``turbospark cache``: how a per-layer GPU expert cache of C slots would serve a capture's trace.

The model (one cache per layer, as expert-offloading systems keep them):

* A **pass** needs its distinct top-k experts resident at once. Each needed
  expert already resident when the pass starts is a **hit**; every other one
  is a **miss** and is loaded (a demand load). When the cache is full a load
  first evicts one resident expert that the pass does not need, chosen by the
  policy. So C must be at least top_k (refused otherwise). The cache starts
  empty; its first loads are cold misses.
* **Policies.** ``lru``: evict the expert whose last use is oldest. ``lfu``:
  evict the expert used by the fewest passes so far in this cache's stream
  (counted over the whole stream, kept across evictions), then the least
  recently used. ``belady``: Belady's MIN, evict the expert whose next use is
  farthest in the future (never used again: first); the exact optimum of any
  demand policy, so no demand policy's hit rate exceeds it at any C. Ties
  between experts equal on every other key: the lower expert id is evicted.
* **Prefetch from the pilot** (``pilot+lru``, ``pilot+lfu``; ``pilot`` means
  ``pilot+lru``): with the capture's one-layer-ahead predictions, the
  predicted experts of layer L's pass are loaded while layer L-1 runs, so
  before the pass needs them, evicting by the base policy experts not
  predicted; a predicted expert already resident counts as used then (its
  recency is refreshed, not its use count). A prefetch load is **useful**
  when the same pass needs the expert, **wasted** otherwise. Passes without a
  prediction (beyond the prediction row's length: all of layer 0 in a
  ``pilot="next"`` capture) are served without prefetch; a ``pilot="self"``
  model capture's layer 0 is predicted like the others. Prefetch loads extra experts, so a prefetch policy can
  beat ``belady``'s hit rate; its bytes per token count the wasted loads.
* **Streams.** By default each sequence has its own cache (the capture's
  ``seq`` tags; a capture without them is one stream per layer). With
  ``shared=True`` one cache per layer serves every sequence's passes in the
  order the server ran them: the recorder's order, or with ``batch=B`` the
  serving iterations continuous batching with B rows forms (as ``place
  --batch`` forms them), passes of one iteration in recorder order. Without
  sequence tags an iteration is B consecutive passes (as ``place --batch``
  forms them too), so the order, and every figure, is the recorder's; the
  document's ``batches`` says which (``"concurrent sequences"`` or
  ``"consecutive passes"``).

Figures per layer and C: ``hit_rate`` = hits / needed (None without
lookups), ``misses_per_token`` = demand loads / passes, and with
``expert_bytes`` B, ``bytes_per_token`` = (demand + prefetch loads) x B /
passes. Model-wide: ``hit_rate`` is the mean over routed layers (layers with
lookups), ``misses_per_token`` and ``bytes_per_token`` the sums over routed
layers (what one token costs through the whole model).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..capture.reader import Capture
from ..capture.sequences import serving_iterations
from ..capture.rows import layer_breaks

__all__ = [
    "DEFAULT_POLICIES",
    "POLICIES",
    "cache_report",
    "default_slots",
    "parse_policies",
    "parse_slots",
    "simulate_cache",
]

POLICIES: tuple[str, ...] = ("lru", "lfu", "belady", "pilot+lru", "pilot+lfu")
DEFAULT_POLICIES: tuple[str, ...] = ("lru", "lfu", "belady", "pilot+lru")
_ALIASES = {"pilot": "pilot+lru", "opt": "belady", "min": "belady"}
_CODES = {"lru": 0, "lfu": 1, "belady": 2}
NO_TRACE = "the capture has no trace (record with trace=True): a cache is simulated pass by pass"
NO_PREDICTIONS = ("the capture has no predictions (record with pilot='next'): there is nothing "
                  "to prefetch from")


def _kernel() -> Any:
    """The compiled simulation, or the pure-Python reference (forced by TURBOSPARK_PUREPYTHON)."""
    if not os.environ.get("TURBOSPARK_PUREPYTHON"):
        try:
            from . import _cache_kernels

            return _cache_kernels.simulate
        except ImportError:
            pass  # the recorder's import already warned that the build is missing
    from . import _cache_py

    return _cache_py.simulate


def parse_policies(text: str | Iterable[str]) -> list[str]:
    """Policy names from ``"lru,belady"`` (or an iterable of names), aliases resolved, order kept,
    duplicates merged. Raises ``ValueError`` naming an unknown policy."""
    names = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        name = _ALIASES.get(name, name)
        if name not in POLICIES:
            raise ValueError(f"unknown cache policy {raw.strip()!r}: choose from "
                             f"{', '.join(POLICIES)} (pilot = pilot+lru)")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("no cache policy given")
    return out


_RANGE = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*(?::\s*(\d+)\s*)?)?$")


def parse_slots(values: Iterable[str | int]) -> list[int]:
    """Cache sizes from ``["16", "8:64:8"]``: single sizes and inclusive ranges ``A:B`` (every C)
    or ``A:B:S`` (step S); ascending, duplicates merged. Raises ``ValueError`` naming a bad value."""
    sizes: set[int] = set()
    for value in values:
        if isinstance(value, int):
            sizes.add(value)
            continue
        match = _RANGE.match(value)
        if match is None:
            raise ValueError(f"bad cache size {value!r}: give C, A:B or A:B:S with whole numbers")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        step = int(match.group(3)) if match.group(3) is not None else 1
        if step < 1 or high < low:
            raise ValueError(f"bad cache size range {value!r}: needs A <= B and a step S >= 1")
        sizes.update(range(low, high + 1, step))
    return sorted(sizes)


def default_slots(capture: Capture) -> list[int]:
    """top_k x 1, 2, 4, 8 (at most num_experts), then num_experts: the sizes ``cache`` reports by default."""
    k, e = capture.top_k, capture.num_experts
    sizes = {c for c in (k, 2 * k, 4 * k, 8 * k) if c <= e}
    sizes.add(max(e, k))
    return sorted(c for c in sizes if c >= 1)


def simulate_cache(
    ids: np.ndarray,
    num_experts: int,
    slots: int,
    policy: str,
    *,
    pred: Optional[np.ndarray] = None,
    streams: Optional[Sequence[np.ndarray]] = None,
) -> dict[str, int]:
    """Serve one layer's (P, K) trace ``ids`` from a cache of ``slots`` experts under ``policy``.

    ``pred``: the layer's (P2, K) predictions (pass p < P2 prefetches
    ``pred[p]``), needed by and only used with the pilot policies.
    ``streams``: the pass indices of each independent cache, in serving order
    (default: one cache serving every pass in order). Returns the integer
    totals ``needed``, ``hits``, ``loads`` (demand), ``prefetched`` and
    ``useful``. Raises ``ValueError`` for an unknown policy, ids outside
    0..num_experts-1, a pilot policy without ``pred``, or ``slots`` below
    the width of a pass or prediction.
    """
    name = parse_policies([policy])[0]
    ids = _ids(ids, num_experts, "ids")
    base = name.partition("+")[2] or name
    guess = None
    if name.startswith("pilot+"):
        if pred is None:
            raise ValueError(f"policy {name} needs predictions (pred=)")
        guess = _ids(pred, num_experts, "pred")
    width = max(ids.shape[1], guess.shape[1] if guess is not None else 0)
    if slots < max(width, 1):
        raise ValueError(f"cache size {slots} is below top_k {width}: a pass needs its {width} experts "
                         "resident at once")
    order, starts = _flatten(streams if streams is not None else [np.arange(ids.shape[0])], ids.shape[0])
    needed, hits, loads, prefetched, useful = _kernel()(
        ids, order, starts, num_experts, slots, _CODES[base], guess)
    return {"needed": needed, "hits": hits, "loads": loads, "prefetched": prefetched, "useful": useful}


def cache_report(
    capture: Capture,
    slots: Optional[Iterable[int]] = None,
    policies: Iterable[str] = DEFAULT_POLICIES,
    *,
    expert_bytes: Optional[int] = None,
    shared: bool = False,
    batch: Optional[int] = None,
) -> dict[str, Any]:
    """The ``turbospark cache --json`` document for ``capture``, as plain Python values.

    ``slots``: cache sizes C (default ``default_slots``), each >= top_k;
    ``policies``: names from ``POLICIES``; ``expert_bytes``: bytes one expert's
    weights take (adds ``bytes_per_token``); ``shared`` / ``batch``: the
    stream model in the module docstring. A policy that cannot be computed
    (a pilot policy on a capture without predictions) maps to None with its
    reason under ``"why"``. Raises ``ValueError`` for a capture without a
    trace, a size below top_k, an unknown policy, ``expert_bytes`` < 1, or
    ``batch`` without ``shared`` or below 1.
    """
    if capture.trace is None:
        raise ValueError(NO_TRACE)
    sizes = sorted(set(int(c) for c in slots)) if slots is not None else default_slots(capture)
    if not sizes:
        raise ValueError("no cache size given")
    k = capture.top_k
    for c in sizes:
        if c < max(k, 1):
            raise ValueError(f"cache size {c} is below top_k {k}: a pass needs its {k} experts resident at once")
    names = parse_policies(list(policies))
    if expert_bytes is not None and expert_bytes < 1:
        raise ValueError(f"expert bytes must be at least 1, got {expert_bytes}")
    if batch is not None and not shared:
        raise ValueError("batch forms the serving iterations a shared cache sees: it needs shared=True (--shared)")
    if batch is not None and batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    why = {name: NO_PREDICTIONS for name in names if name.startswith("pilot+") and capture.pred is None}
    simulate = _kernel()
    e = capture.num_experts
    layers = []
    for layer, ids in enumerate(capture.trace):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        order, starts = _flatten(_streams(capture, layer, shared, batch), ids.shape[0])
        guess = _layer_predictions(capture, layer)
        entry = _layer_entry(layer, ids, order, starts, e, sizes, names, why, guess, expert_bytes, simulate)
        entry["streams"] = int(starts.shape[0]) if ids.shape[0] else 0
        layers.append(entry)
    return {
        "num_layers": capture.num_layers,
        "num_experts": e,
        "top_k": k,
        "slots": sizes,
        "policies": names,
        "shared": bool(shared),
        "batch": batch,
        # Without sequence tags an iteration is B consecutive passes (as place --batch forms
        # them), which leaves the recorder's order as it is: say so rather than imply re-forming.
        "batches": None if batch is None else ("concurrent sequences" if capture.seq is not None
                                               else "consecutive passes"),
        "expert_bytes": expert_bytes,
        "layers": layers,
        "model": _model(layers, names, sizes, why, expert_bytes),
    }


def _layer_entry(layer: int, ids: np.ndarray, order: np.ndarray, starts: np.ndarray, e: int,
                 sizes: list[int], names: list[str], why: dict[str, str], guess: Optional[np.ndarray],
                 expert_bytes: Optional[int], simulate: Any) -> dict[str, Any]:
    passes = int(ids.shape[0])
    needed = _distinct_total(ids)
    hit_rate: dict[str, Any] = {}
    misses: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    prefetch: dict[str, Any] = {}
    for name in names:
        if name in why:
            hit_rate[name] = misses[name] = moved[name] = None
            continue
        base = name.partition("+")[2] or name
        pilot = name.startswith("pilot+")
        rates, per_token, loaded, useful, wasted = [], [], [], [], []
        for c in sizes:
            _, hits, loads, fetched, good = simulate(
                ids, order, starts, e, c, _CODES[base], guess if pilot else None)
            rates.append(hits / needed if needed else None)
            per_token.append(loads / passes if passes else None)
            loaded.append(loads + fetched)
            useful.append(good)
            wasted.append(fetched - good)
        hit_rate[name], misses[name] = rates, per_token
        moved[name] = [n * expert_bytes / passes if passes and expert_bytes else None for n in loaded]
        if pilot:
            prefetch[name] = {"useful": useful, "wasted": wasted}
    entry: dict[str, Any] = {
        "layer": layer,
        "passes": passes,
        "needed": needed,
        "hit_rate": hit_rate,
        "misses_per_token": misses,
        "bytes_per_token": moved if expert_bytes is not None else None,
    }
    if prefetch:
        entry["prefetch"] = prefetch
    if why:
        entry["why"] = dict(why)
    return entry


def _model(layers: list[dict[str, Any]], names: list[str], sizes: list[int], why: dict[str, str],
           expert_bytes: Optional[int]) -> dict[str, Any]:
    routed = [entry for entry in layers if entry["needed"] > 0]
    hit_rate: dict[str, Any] = {}
    misses: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    for name in names:
        if name in why or not routed:
            hit_rate[name] = misses[name] = moved[name] = None
            continue
        hit_rate[name] = [math.fsum(e["hit_rate"][name][i] for e in routed) / len(routed) for i in range(len(sizes))]
        misses[name] = [math.fsum(e["misses_per_token"][name][i] for e in routed) for i in range(len(sizes))]
        if expert_bytes is not None:
            moved[name] = [math.fsum(e["bytes_per_token"][name][i] for e in routed) for i in range(len(sizes))]
    prefetch = {
        name: {kind + "_per_token": [math.fsum(e["prefetch"][name][kind][i] / e["passes"] for e in routed)
                                     for i in range(len(sizes))] for kind in ("useful", "wasted")}
        for name in names if name.startswith("pilot+") and name not in why and routed
    }
    out: dict[str, Any] = {
        "routed_layers": len(routed),
        "hit_rate": hit_rate,
        "misses_per_token": misses,
        "bytes_per_token": moved if expert_bytes is not None else None,
    }
    if prefetch:
        out["prefetch"] = prefetch
    if why:
        out["why"] = dict(why)
    return out


def _distinct_total(ids: np.ndarray) -> int:
    """Lookups of a (P, K) trace: each pass's distinct ids."""
    if ids.size == 0:
        return 0
    ordered = np.sort(ids, axis=1)
    return int(ids.shape[0] + (ordered[:, 1:] != ordered[:, :-1]).sum())


def _layer_predictions(capture: Capture, layer: int) -> Optional[np.ndarray]:
    """Layer ``layer``'s predictions as prefetch input, None when it has none.

    Layer 0 is not special: a ``pilot="next"`` capture files nothing for it
    (nothing runs before it), while a ``pilot="self"`` model capture predicts
    it from itself, and those predictions are served like any other layer's.
    """
    if capture.pred is None or capture.pred[layer].shape[0] == 0:
        return None
    return np.ascontiguousarray(capture.pred[layer], dtype=np.int64)


def _streams(capture: Capture, layer: int, shared: bool, batch: Optional[int]) -> list[np.ndarray]:
    """The pass indices of each cache of ``layer``, in serving order; a gap in a streamed capture's rows
    (``layer_breaks``) ends every cache there, as if the rows on each side were two captures."""
    streams = _unbroken_streams(capture, layer, shared, batch)
    breaks = np.asarray(layer_breaks(capture, layer), dtype=np.int64)
    if not breaks.size:
        return streams
    out = []
    for stream in streams:
        piece = np.searchsorted(breaks, stream, side="right")
        out.extend(stream[piece == p] for p in np.unique(piece).tolist())
    return out


def _unbroken_streams(capture: Capture, layer: int, shared: bool, batch: Optional[int]) -> list[np.ndarray]:
    passes = capture.trace[layer].shape[0] if capture.trace is not None else 0
    seq = capture.seq[layer] if capture.seq is not None else None
    if seq is None or (shared and batch is None):
        return [np.arange(passes, dtype=np.int64)]
    if shared:
        assert capture.phase is not None and batch is not None
        iteration = serving_iterations(seq, capture.phase[layer], batch)
        return [np.argsort(iteration, kind="stable").astype(np.int64)]
    order = np.argsort(seq, kind="stable").astype(np.int64)
    cuts = np.flatnonzero(np.diff(seq[order])) + 1
    return np.split(order, cuts)


def _flatten(streams: Sequence[np.ndarray], passes: int) -> tuple[np.ndarray, np.ndarray]:
    """``streams`` as one int64 order array and the start of each stream in it; validated."""
    parts = [np.asarray(s, dtype=np.int64).ravel() for s in streams if len(s)]
    order = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    if order.size and (order.min() < 0 or order.max() >= passes):
        bad = order[(order < 0) | (order >= passes)][0]
        raise ValueError(f"stream pass index {int(bad)} is outside 0..{passes - 1}")
    lengths = np.array([p.shape[0] for p in parts], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if parts else np.zeros(1, np.int64)
    return order, np.ascontiguousarray(starts)


def _ids(ids: Any, num_experts: int, what: str) -> np.ndarray:
    """``ids`` as a C-contiguous (P, K) int64 array of ids in 0..num_experts-1."""
    raw = np.asarray(ids)
    if raw.size and (raw.dtype.kind not in "iu"):
        raise ValueError(f"{what} must hold integer expert ids, got dtype {raw.dtype}")
    arr = np.ascontiguousarray(raw, dtype=np.int64)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a (passes, top_k) array, got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= num_experts):
        bad = arr[(arr < 0) | (arr >= num_experts)][0]
        raise ValueError(f"{what} holds expert id {int(bad)}, outside 0..{num_experts - 1}")
    return arr
