"""Per-layer slot budgets for a dynamic expert cache: split S slots over the layers for the most hits.

The cache is ``turbospark cache``'s (``turbospark.offload.cache``, docs/cache.md):
one cache per layer, a pass needs its distinct experts resident at once, so
a layer gets at least top_k slots (and at most E, where every miss is cold).
Given a total S, ``allocate`` picks the per-layer sizes C_l (sum S) that
maximise the hits over all layers, from each layer's hit curve h_l(C):

* ``lru``: every C from one pass over the trace (``lru_hits``): a pass's
  needed experts are resident at its start exactly when their depth in the
  LRU stack (most recent first, a pass's experts ordered by id, higher id
  nearer the top, as the simulator's ties evict the lower id) is below C;
  so one stack walk gives h(C) for all C. Checked against the simulator at
  every C by the tests.
* ``belady``: the simulator (``simulate_cache``) at each C from top_k up to the
  layer's distinct experts (h is flat beyond).

The split: marginal greedy (one slot at a time to the layer gaining most) is
exact when every curve is concave; otherwise (LRU curves need not be) a
dynamic programme over the layers, O(L x S x E). Against it: the even split
(S // L each, the first S % L layers one more, as sglang-kt's ``uniform``).
With ``fit``, the curves come from the fit passes and both splits are judged
on the test passes (``place --fit``'s split), which is the figure that counts.
Maximising hits over all layers is minimising misses (demand loads) over all
layers; with equal passes per layer, as a model capture has, that is the
misses per token ``turbospark cache`` reports.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Optional, Sequence, Union

import numpy as np

from .cache import _streams, simulate_cache
from ..capture.reader import Capture
from ..capture.sequences import exact_fraction, fit_mask

__all__ = ["BUDGET_POLICIES", "allocate", "budget_report", "even_split", "hit_curve", "lru_hits"]

BUDGET_POLICIES: tuple[str, ...] = ("lru", "belady")


def lru_hits(ids: np.ndarray, num_experts: int, streams: Optional[Sequence[np.ndarray]] = None) -> tuple[np.ndarray, int]:
    """Hits of a C-slot LRU cache for every C at once, for one layer's (P, K) ``ids``.

    ``streams``: the pass indices of each independent cache in serving order
    (default: all passes in order). Returns (hits, needed): ``hits[C]`` for
    C = 0..E (meaningful from C = top_k: a smaller cache cannot serve a pass)
    and the lookups (distinct ids per pass). Raises ``ValueError`` for ids
    outside 0..E-1.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"ids must be a (passes, top_k) array, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"ids hold an expert outside 0..{num_experts - 1}")
    rows = ids.tolist()
    depth_counts = [0] * (num_experts + 1)
    needed = 0
    for stream in (streams if streams is not None else [np.arange(ids.shape[0])]):
        stack: list[int] = []  # most recent first
        place: set[int] = set()
        for p in np.asarray(stream, dtype=np.int64).tolist():
            wanted = sorted(set(rows[p]), reverse=True)
            needed += len(wanted)
            for x in wanted:
                if x in place:
                    depth_counts[stack.index(x)] += 1
            for x in wanted:
                if x in place:
                    stack.remove(x)
            stack[:0] = wanted
            place.update(wanted)
    # A lookup at depth d hits every cache of more than d slots.
    hits = np.concatenate([[0], np.cumsum(depth_counts[:num_experts])]).astype(np.int64)
    return hits, needed


def hit_curve(ids: np.ndarray, num_experts: int, policy: str, low: int,
              streams: Optional[Sequence[np.ndarray]] = None) -> tuple[np.ndarray, int]:
    """(hits, needed): ``hits[C]`` for C = 0..E under ``policy`` (``lru`` or ``belady``), exact
    from C = ``low`` (top_k) up; entries below ``low`` are 0. Raises ``ValueError`` for an
    unknown policy."""
    if policy not in BUDGET_POLICIES:
        raise ValueError(f"unknown budget policy {policy!r}: choose from {', '.join(BUDGET_POLICIES)}")
    if policy == "lru":
        hits, needed = lru_hits(ids, num_experts, streams)
        hits[:low] = 0
        return hits, needed
    hits = np.zeros(num_experts + 1, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    served = [np.asarray(s, dtype=np.int64) for s in (streams if streams is not None else [np.arange(ids.shape[0])])]
    passes = np.concatenate(served) if served else np.zeros(0, dtype=np.int64)
    if passes.size == 0:
        return hits, 0
    needed = sum(len(set(row)) for row in ids[passes].tolist())
    distinct = int(np.unique(ids[passes]).shape[0])
    for c in range(max(low, 1), num_experts + 1):
        if c > max(distinct, low):  # every expert the window uses fits: nothing more to gain
            hits[c] = hits[c - 1]
            continue
        hits[c] = simulate_cache(ids, num_experts, c, "belady", streams=served)["hits"]
    return hits, needed


def even_split(total: int, layers: int, low: int, high: int) -> list[int]:
    """S // L slots per layer, the first S % L layers one more (``allocate``'s bounds checked)."""
    _check_total(total, layers, low, high)
    each, extra = divmod(total, layers)
    return [each + (1 if layer < extra else 0) for layer in range(layers)]


def _check_total(total: int, layers: int, low: int, high: int) -> None:
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)):
        raise ValueError(f"total slots must be a whole number, got {total!r}")
    if not layers * low <= total <= layers * high:
        raise ValueError(f"total slots {total} is outside {layers * low}..{layers * high}: each of the "
                         f"{layers} layers needs {low} (top_k) to {high} (experts) slots")


def concave(curve: np.ndarray) -> bool:
    """Whether ``curve`` (the hits from C = low up) has non-increasing increments."""
    steps = np.diff(np.asarray(curve, dtype=np.int64))
    return bool((np.diff(steps) <= 0).all())


def allocate(curves: np.ndarray, total: int, low: int) -> tuple[list[int], str]:
    """The per-layer sizes (sum ``total``, each ``low``..E) maximising the summed hits.

    ``curves``: (L, E + 1) hits per layer and size. Returns (sizes, method):
    ``"greedy"`` when every curve is concave from ``low`` (ties: the lower
    layer gets the slot), else ``"dp"`` (ties: the smaller size for the later
    layer). Raises ``ValueError`` when ``total`` is outside L x low .. L x E.
    """
    curves = np.asarray(curves, dtype=np.int64)
    layers, width = curves.shape
    high = width - 1
    _check_total(total, layers, low, high)
    if all(concave(row[low:]) for row in curves):
        sizes = [low] * layers
        for _ in range(total - layers * low):
            gains = [curves[l, sizes[l] + 1] - curves[l, sizes[l]] if sizes[l] < high else -1
                     for l in range(layers)]
            best = int(np.argmax(gains))
            sizes[best] += 1
        return sizes, "greedy"
    return _dp(curves, total, low), "dp"


def _dp(curves: np.ndarray, total: int, low: int) -> list[int]:
    layers, width = curves.shape
    high = width - 1
    choices = np.arange(low, high + 1)
    floor = np.iinfo(np.int64).min // 4
    best = np.full(total + 1, floor, dtype=np.int64)
    best[0] = 0
    picks = []
    for layer in range(layers):
        # new[s] = max over c of best[s - c] + curve[c]; rows s, columns c.
        s = np.arange(total + 1)[:, None]
        before = s - choices[None, :]
        valid = before >= 0
        value = np.where(valid, best[np.clip(before, 0, total)], floor)
        value = np.where(value > floor, value + curves[layer, choices][None, :], floor)
        pick = np.argmax(value, axis=1)
        best = value[np.arange(total + 1), pick]
        picks.append(choices[pick])
    sizes = []
    left = total
    for layer in range(layers - 1, -1, -1):
        c = int(picks[layer][left])
        sizes.append(c)
        left -= c
    return sizes[::-1]


def budget_report(capture: Capture, total: int, policy: str = "lru", *,
                  fit: Optional[Union[float, Fraction, str]] = None, shared: bool = False,
                  batch: Optional[int] = None) -> dict[str, Any]:
    """The ``turbospark offload --total-slots`` document (docs/offload.md) as plain Python values.

    ``total``: expert slots over all layers; ``policy``: ``lru`` or ``belady``;
    ``fit``: curves from that fraction of each layer's passes, both splits judged
    on the rest; ``shared``/``batch``: the cache streams of ``turbospark cache``.
    Raises ``ValueError`` without a trace, for a total outside L x top_k .. L x E,
    an unknown policy, a bad ``fit``, or ``batch`` without ``shared``.
    """
    if capture.trace is None:
        raise ValueError("the capture has no trace (record with trace=True): a cache is simulated pass by pass")
    if policy not in BUDGET_POLICIES:
        raise ValueError(f"unknown budget policy {policy!r}: choose from {', '.join(BUDGET_POLICIES)}")
    if batch is not None and not shared:
        raise ValueError("batch forms the serving iterations a shared cache sees: it needs shared=True (--shared)")
    exact = None
    if fit is not None:
        exact = exact_fraction(fit)
        if not 0 < exact < 1:
            raise ValueError(f"--fit must be strictly between 0 and 1, got {fit}")
    e, low = capture.num_experts, max(capture.top_k, 1)
    _check_total(total, capture.num_layers, low, e)
    fit_curves: list[np.ndarray] = []
    test_curves: list[np.ndarray] = []
    fit_need: list[int] = []
    test_need: list[int] = []
    fit_passes: list[int] = []
    test_passes: list[int] = []
    for layer in range(capture.num_layers):
        ids = np.ascontiguousarray(capture.trace[layer], dtype=np.int64)
        streams = _streams(capture, layer, shared, batch)
        keep = fit_mask(capture, layer, exact)[0] if exact is not None else np.ones(ids.shape[0], dtype=bool)
        for pick, curves, need, passes in ((keep, fit_curves, fit_need, fit_passes),
                                           (~keep, test_curves, test_need, test_passes)):
            if exact is None and curves is test_curves:
                continue
            window = [s[pick[s]] for s in streams]
            hits, needed = hit_curve(ids, e, policy, low, window)
            curves.append(hits)
            need.append(needed)
            passes.append(int(pick.sum()))
    fit_matrix = np.stack(fit_curves)
    sizes, method = allocate(fit_matrix, total, low)
    even = even_split(total, capture.num_layers, low, e)
    test_matrix = np.stack(test_curves) if exact is not None else None

    def judge(split: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"slots": split, "fit": _figures(fit_matrix, fit_need, fit_passes, split)}
        out["test"] = _figures(test_matrix, test_need, test_passes, split) if test_matrix is not None else None
        return out

    return {
        "num_layers": capture.num_layers, "num_experts": e, "top_k": capture.top_k,
        "total_slots": int(total), "policy": policy, "shared": bool(shared), "batch": batch,
        "fit": None if exact is None else str(exact),
        "method": method,
        "concave_layers": int(sum(concave(row[low:]) for row in fit_matrix)),
        "optimised": judge(sizes),
        "even": judge(even),
    }


def _figures(curves: np.ndarray, needed: list[int], passes: list[int], split: list[int]) -> dict[str, Any]:
    hits = [int(curves[layer, c]) for layer, c in enumerate(split)]
    lookups = sum(needed)
    misses = [(n - h) / p for h, n, p in zip(hits, needed, passes) if p]
    return {"hits": sum(hits), "needed": lookups,
            "hit_rate": sum(hits) / lookups if lookups else None,
            "misses_per_token": float(np.sum(misses)) if misses else None}
