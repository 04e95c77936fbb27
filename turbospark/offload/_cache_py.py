"""The expert-cache simulation in plain Python: the reference the compiled kernel must match.

``csrc/_cache.pyx`` (``turbospark.offload._cache_kernels``) implements the
same function with an indexed heap; this one keeps each resident expert's
eviction key in a dict and takes the minimum, which is slower (O(C) per
eviction) and easy to read. The definitions are in ``cache.py``'s docstring
and ``docs/cache.md``; the test suite checks both against brute-force
simulations written from those definitions alone.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["BELADY", "LFU", "LRU", "check_arguments", "simulate"]

LRU, LFU, BELADY = 0, 1, 2
_NEVER = 2**63 - 1
_PINNED = (float("inf"), float("inf"))


def simulate(
    ids: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
    num_experts: int,
    slots: int,
    policy: int,
    pred: Optional[np.ndarray] = None,
) -> tuple[int, int, int, int, int]:
    """Serve the passes ``ids[order]`` from a cache of ``slots`` experts under ``policy``.

    ``ids``: (P, K) int64 expert ids; ``order``: the pass indices in the order
    they are served; ``starts``: where in ``order`` each independent cache's
    stream begins (ascending, first 0), each starting empty. ``pred``: None or
    (P2, K2) predictions; pass p < P2 first prefetches the distinct ids of
    ``pred[p]`` (LRU and LFU only). The caller has validated everything
    Raises ``ValueError`` (``check_arguments``) for anything else.

    Returns (needed, hits, demand loads, prefetch loads, useful prefetches):
    needed counts each pass's distinct ids; a hit is one already resident when
    the pass starts (after its prefetch); a useful prefetch is one the same
    pass needs. A ``slots`` above ``num_experts`` serves as ``num_experts``:
    the extra slots never fill.
    """
    check_arguments(ids, order, starts, num_experts, slots, policy, pred)
    slots = min(slots, num_experts)
    ids_rows = ids.tolist()
    guesses = pred.tolist() if pred is not None else []
    serve = order.tolist()
    bounds = starts.tolist() + [len(serve)]
    needed = hits = loads = prefetched = useful = 0
    for run in range(len(bounds) - 1):
        lo, hi = bounds[run], bounds[run + 1]
        nxt = _next_uses(ids_rows, serve, lo, hi) if policy == BELADY else None
        key: dict[int, tuple[float, float]] = {}  # resident expert -> eviction key
        uses: dict[int, int] = {}
        for t in range(lo, hi):
            p = serve[t]
            if p < len(guesses):
                wanted = list(dict.fromkeys(guesses[p]))
                fetched = _admit(key, wanted, slots)
                prefetched += len(fetched)
                for x in wanted:
                    key[x] = _key(policy, x, 2 * t, uses.get(x, 0), 0)
            else:
                fetched = set()
            wanted = list(dict.fromkeys(ids_rows[p]))
            needed += len(wanted)
            resident = [x for x in wanted if x in key]
            hits += len(resident)
            useful += sum(1 for x in resident if x in fetched)
            loads += len(_admit(key, wanted, slots))
            for x in wanted:
                uses[x] = uses.get(x, 0) + 1
                key[x] = _key(policy, x, 2 * t + 1, uses[x], nxt[t][x] if nxt is not None else 0)
    return needed, hits, loads, prefetched, useful


def check_arguments(ids: np.ndarray, order: np.ndarray, starts: np.ndarray, num_experts: int, slots: int,
                    policy: int, pred: Optional[np.ndarray]) -> None:
    """Raise ``ValueError`` naming the first argument ``simulate`` cannot serve as given.

    Both kernels call this before reading anything, so no input can make the
    compiled one read out of bounds.
    """
    arrays = [("ids", ids, 2), ("order", order, 1), ("starts", starts, 1)]
    if pred is not None:
        arrays.append(("pred", pred, 2))
    for name, arr, ndim in arrays:
        if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != ndim \
                or not arr.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous {ndim}-D int64 array, got "
                             f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}")
    if policy not in (LRU, LFU, BELADY) or (policy == BELADY and pred is not None):
        raise ValueError(f"policy {policy} is not 0 (LRU), 1 (LFU) or 2 (Belady, without prefetch)")
    for name, value in (("num_experts", num_experts), ("slots", slots)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    width = max(ids.shape[1], pred.shape[1] if pred is not None else 0)
    if num_experts < 1 or slots < max(width, 1):
        raise ValueError(f"need num_experts >= 1 and slots >= {max(width, 1)}, got {num_experts} and {slots}")
    for name, arr, high in (("ids", ids, num_experts), ("pred", pred, num_experts),
                            ("order", order, ids.shape[0])):
        if arr is not None and arr.size and (int(arr.min()) < 0 or int(arr.max()) >= high):
            raise ValueError(f"{name} holds a value outside 0..{high - 1}")
    if starts.size == 0 or starts[0] != 0 or (np.diff(starts) < 0).any() or starts[-1] > order.shape[0]:
        raise ValueError(f"starts must ascend from 0 to at most {order.shape[0]}, got {starts.tolist()[:8]}")


def _admit(key: dict[int, tuple[float, float]], wanted: list[int], slots: int) -> set[int]:
    """Make every id of ``wanted`` resident, evicting others by key; returns the ids loaded."""
    for x in wanted:
        if x in key:
            key[x] = _PINNED
    loaded = set()
    for x in wanted:
        if x not in key:
            if len(key) == slots:
                del key[min(key, key=key.__getitem__)]
            key[x] = _PINNED
            loaded.add(x)
    return loaded


def _key(policy: int, expert: int, clock: int, uses: int, next_use: int) -> tuple[float, float]:
    if policy == LRU:
        return (clock, expert)
    if policy == LFU:
        return (uses, clock * (1 << 40) + expert)  # (uses, last use, expert), as one pair
    return (_NEVER - next_use, expert)


def _next_uses(rows: list[list[int]], serve: list[int], lo: int, hi: int) -> list[dict[int, int]]:
    """Per position t in lo..hi-1: each id of the pass -> run position of its next use, or never."""
    out: list[dict[int, int]] = [{} for _ in range(hi)]
    following: dict[int, int] = {}
    for t in range(hi - 1, lo - 1, -1):
        row = rows[serve[t]]
        out[t] = {x: following.get(x, _NEVER) for x in row}
        for x in row:
            following[x] = t
    return out
