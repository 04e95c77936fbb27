"""Rebalancing from the placement a server runs now, moving at most M slots per layer.

A **move** is a slot whose expert changes: the new expert's weights are
copied into it (``--expert-bytes`` B each). ``moved_slots(new, current)``
counts them per layer.

``rebalance(current, weight, gpus, max_moves, target)`` returns, per layer:

* the from-scratch ``target``, relabelled to move as few slots as possible
  without changing its loads (``align``), when that needs at most M moves
  (always with M = None, unbounded);
* otherwise a greedy local search from ``current``: each step makes the
  change that lowers the layer's busiest GPU load (the even model) the most
  per slot moved, either giving a slot of the busiest GPU to another expert
  (one move; the slot's expert keeps at least one replica) or swapping a
  slot of the busiest GPU with a slot of another GPU (two moves); a slot
  changes at most once, and a step is taken only when it lowers the busiest
  GPU, within the budget. M = 0 is the current placement.

``align``: within a GPU the order of slots changes no load under any
dispatch model (a GPU's slots are consecutive, so replicas keep their GPU
order), so each GPU keeps the current expert of as many of its slots as the
multisets allow; under the even model the GPUs' numbering is free too, and
``permute`` first matches new GPUs to current ones by the most experts in
common (greedily, largest overlap first).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["align", "moved_slots", "rebalance"]

_MIN_GAIN = 1e-12  # a step must lower the busiest GPU by more than this share of it


def moved_slots(new: np.ndarray, current: np.ndarray) -> np.ndarray:
    """(L,) int64: per layer, the slots whose expert differs between two (L, S) maps."""
    return (new != current).sum(axis=1)


def align(new: np.ndarray, current: np.ndarray, gpus: int, permute: bool) -> np.ndarray:
    """``new`` relabelled (slots within each GPU reordered, GPUs renumbered when ``permute``)
    to keep as many of ``current``'s slots as it can; loads are unchanged (see the module docstring)."""
    layers, slots = new.shape
    per_gpu = slots // gpus
    out = np.empty_like(new)
    for layer in range(layers):
        mine = new[layer].reshape(gpus, per_gpu)
        theirs = current[layer].reshape(gpus, per_gpu)
        order = _match_gpus(mine, theirs) if permute else np.arange(gpus)
        for target, source in enumerate(order):
            out[layer, target * per_gpu:(target + 1) * per_gpu] = _keep_positions(mine[source], theirs[target])
    return out


def _match_gpus(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """For each current GPU, the new GPU that goes there: largest expert overlap first."""
    gpus = mine.shape[0]
    overlap = np.array([[_common(mine[a], theirs[b]) for b in range(gpus)] for a in range(gpus)])
    order = np.full(gpus, -1)
    taken = np.zeros(gpus, dtype=bool)
    # Pairs by overlap, descending; ties by new GPU then current GPU (stable).
    for flat in np.argsort(-overlap, axis=None, kind="stable"):
        a, b = divmod(int(flat), gpus)
        if not taken[a] and order[b] < 0:
            order[b] = a
            taken[a] = True
    return order


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the multiset intersection of two rows of expert ids."""
    values, counts = np.unique(a, return_counts=True)
    other = dict(zip(*np.unique(b, return_counts=True)))
    return int(sum(min(int(c), int(other.get(v, 0))) for v, c in zip(values, counts)))


def _keep_positions(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """``mine``'s experts arranged so each slot holding the same expert in ``theirs`` keeps it."""
    left = list(mine.tolist())
    row: list[Optional[int]] = [None] * len(theirs)
    for position, expert in enumerate(theirs.tolist()):
        if expert in left:
            left.remove(expert)
            row[position] = expert
    rest = iter(left)
    return np.array([next(rest) if value is None else value for value in row], dtype=mine.dtype)


def rebalance(current: np.ndarray, weight: np.ndarray, gpus: int, max_moves: Optional[int],
              target: np.ndarray) -> np.ndarray:
    """The placement reachable from ``current`` (L, S) by at most ``max_moves`` moves per layer
    (None: unbounded) for loads ``weight`` (L, E); ``target`` the aligned from-scratch map."""
    out = current.copy()
    needed = moved_slots(target, current)
    for layer in range(current.shape[0]):
        if max_moves is None or needed[layer] <= max_moves:
            out[layer] = target[layer]
        elif max_moves > 0 and weight[layer].sum() > 0:
            out[layer] = _local_search(current[layer], weight[layer].astype(np.float64), gpus, max_moves)
    return out


def _local_search(row: np.ndarray, weight: np.ndarray, gpus: int, budget: int) -> np.ndarray:
    row = row.copy()
    slots, experts = row.shape[0], weight.shape[0]
    per_gpu = slots // gpus
    gpu_of = np.arange(slots) // per_gpu
    fixed = np.zeros(slots, dtype=bool)  # slots already moved: each changes once
    while budget > 0:
        held = np.zeros((experts, gpus))
        np.add.at(held, (row, gpu_of), 1.0)
        replicas = held.sum(axis=1)
        share = weight / replicas
        # Summed slot by slot, in slot order: a float matmul's order (and so a near tie between two
        # moves) would follow the machine's BLAS kernel.
        loads = np.bincount(gpu_of, weights=share[row], minlength=gpus)
        a = int(np.argmax(loads))
        top = loads[a]
        best: Optional[tuple[float, int, tuple[int, ...]]] = None  # (gain per move, cost, change)
        mine = [s for s in range(a * per_gpu, (a + 1) * per_gpu) if not fixed[s]]
        # One move: slot s of GPU a, expert x (another replica left), becomes expert y.
        gained = held * share[:, None]  # (E, G): load each expert puts on each GPU now
        for s in mine:
            x = int(row[s])
            if replicas[x] < 2:
                continue
            lose = held[x].copy()
            lose[a] -= 1
            after_x = loads - gained[x] + lose * weight[x] / (replicas[x] - 1)
            gain_y = held.copy()
            gain_y[:, a] += 1
            after = after_x[None, :] - gained + gain_y * (weight / (replicas + 1))[:, None]
            after[x] = np.inf
            peak = after.max(axis=1)
            y = int(np.argmin(peak))
            if peak[y] < top * (1 - _MIN_GAIN) and (best is None or top - peak[y] > best[0]):
                best = (top - peak[y], 1, (s, y))
        # Two moves: swap slot s of GPU a with slot t of another GPU (replica counts unchanged).
        if budget >= 2:
            # The busiest GPU other than a and b, for every b: the second largest load unless b is it.
            ranked = np.argsort(-loads, kind="stable")
            rest = np.delete(ranked, np.flatnonzero(ranked == a))
            second = loads[rest[0]] if rest.size else 0.0
            third = loads[rest[1]] if rest.size > 1 else 0.0
            beyond = np.where(np.arange(gpus) == (rest[0] if rest.size else -1), third, second)
            for s in mine:
                t = np.flatnonzero((gpu_of != a) & ~fixed & (row != row[s]))
                if not t.size:
                    continue
                d = share[row[s]] - share[row[t]]
                b = gpu_of[t]
                peak = np.maximum(np.maximum(top - d, loads[b] + d), beyond[b])
                k = int(np.argmin(peak))
                gain = (top - peak[k]) / 2
                if peak[k] < top * (1 - _MIN_GAIN) and (best is None or gain > best[0]):
                    best = (gain, 2, (s, int(t[k])))
        if best is None:
            break
        _, cost, change = best
        if cost == 1:
            s, y = change
            row[s] = y
            fixed[s] = True
        else:
            s, other = change
            row[s], row[other] = row[other], row[s]
            fixed[s] = fixed[other] = True
        budget -= cost
    return row
