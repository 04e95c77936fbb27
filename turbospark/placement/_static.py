"""A placement shaped for SGLang's static dispatch: replica counts that divide G, replicas on distinct GPUs.

Under static dispatch (``turbospark.placement.dispatch``) an expert with r
replicas on r distinct GPUs keeps the tokens of those r source ranks local
and deals the other k = G - r ranks over its r slots: k // r each, plus
``k mod r`` drawn at random. When r divides G the remainder is 0, so every
replica serves exactly G / r source ranks; with tokens spread evenly over
the ranks that is 1/r of the expert's tokens, the even model's share. The
even model's optimum is then also static's, and the random draws decide
only which ranks a replica serves.

``divisor_placement`` builds such a map per layer:

* replication: start from one slot per expert; while spare slots remain,
  raise the expert with the largest load per replica to its next divisor
  of G (1, 2, 4, ... for G = 8) if that fits in the spare slots, else the
  next such expert whose step fits; slots still left (no step fits) go one
  at a time to the expert with the largest load per replica (those experts
  then leave the divisor shape);
* packing: slots in descending load per replica (expert id on ties), each
  onto the lightest GPU with room that holds no replica of that expert
  (lowest GPU on ties), or the lightest GPU with room when none is left.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np

from .dispatch import _fair_choices

__all__ = ["divisor_placement", "static_search"]


def divisor_placement(weight: np.ndarray, slots: int, gpus: int) -> np.ndarray:
    """(L, S) map for the (L, E) loads ``weight`` with S slots on G GPUs (module docstring)."""
    return np.stack([_layer(row.astype(np.float64), slots, gpus) for row in weight])


def _layer(weight: np.ndarray, slots: int, gpus: int) -> np.ndarray:
    experts = weight.shape[0]
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    step = {d: next((n for n in divisors if n > d), None) for d in divisors}
    count = [1] * experts
    spare = slots - experts
    while spare > 0:
        order = sorted(range(experts), key=lambda e: (-weight[e] / count[e], e))
        grown = False
        for e in order:
            nxt = step.get(count[e])
            if nxt is not None and nxt - count[e] <= spare:
                spare -= nxt - count[e]
                count[e] = nxt
                grown = True
                break
        if not grown:
            count[order[0]] += 1
            spare -= 1
    items = sorted(((weight[e] / count[e], e) for e in range(experts) for _ in range(count[e])),
                   key=lambda item: (-item[0], item[1]))
    per_gpu = slots // gpus
    load = [0.0] * gpus
    filled: list[list[int]] = [[] for _ in range(gpus)]
    for share, e in items:
        room = [g for g in range(gpus) if len(filled[g]) < per_gpu]
        fresh = [g for g in room if e not in filled[g]] or room
        g = min(fresh, key=lambda h: (load[h], h))
        filled[g].append(e)
        load[g] += share
    return np.array([e for gpu in filled for e in gpu], dtype=np.int64)


def static_search(row: np.ndarray, sent: np.ndarray, gpus: int, rng: random.Random,
                  rounds: int = 16, width: int = 32) -> np.ndarray:
    """Improve one layer's (S,) map for static dispatch by slot swaps between GPUs, judged exactly.

    ``sent`` (G source, E) tokens; ``rng`` holds SGLang's generator state at this layer and is left
    where SGLang's would be after the returned row. Per round: the ``width`` swaps between the
    busiest GPU and another that look best by the even model's shares are scored exactly under
    static dispatch, and the best that lowers the busiest GPU is made; it stops after ``rounds``
    or when none does. A swap that keeps, for both experts, the number of GPUs holding them keeps
    every draw of the generator (their count depends only on each expert's replica and
    missing-rank counts), so only the two experts' choices are drawn again from their recorded
    states; any other swap is scored by drawing the whole layer again.
    """
    start = rng.getstate()
    per_gpu = row.shape[0] // gpus
    gpu_of = np.arange(row.shape[0]) // per_gpu
    best_row = row.copy()
    view = _Layer(best_row, sent, gpus, start)
    for _ in range(rounds):
        a = int(np.argmax(view.loads))
        top = view.loads[a]
        replicas = np.bincount(best_row, minlength=sent.shape[1])
        share = sent.sum(axis=0)[best_row] / replicas[best_row]
        mine = np.flatnonzero(gpu_of == a)
        others = np.flatnonzero(gpu_of != a)
        d = share[mine][:, None] - share[others][None, :]
        guess = np.maximum(top - d, view.loads[gpu_of[others]][None, :] + d)
        guess[best_row[mine][:, None] == best_row[others][None, :]] = np.inf
        found = None
        for flat in np.argsort(guess, axis=None, kind="stable")[:width].tolist():
            i, j = divmod(flat, others.size)
            if not np.isfinite(guess[i, j]):
                break
            trial = view.swapped(int(mine[i]), int(others[j]))
            if trial.loads.max() < top * (1 - _MIN_GAIN) and (found is None or trial.loads.max() < found.loads.max()):
                found = trial
        if found is None:
            break
        view = found
        best_row = view.row
    rng.setstate(view.end)
    return best_row


_MIN_GAIN = 1e-12  # a swap must lower the busiest GPU by more than this share of it


class _Layer:
    """One layer's static dispatch: the map, the generator state before each expert's draws,
    the (G, E) target GPUs, the GPU loads, and the generator state after the layer. With
    ``base`` (the same layer before a swap of the ``changed`` experts) and unchanged missing-rank
    counts for those, only their draws are made again; otherwise the whole layer is drawn."""

    states: list[tuple[Any, ...]]
    end: tuple[Any, ...]
    target: np.ndarray
    loads: np.ndarray

    def __init__(self, row: np.ndarray, sent: np.ndarray, gpus: int, start: tuple[Any, ...],
                 base: Optional["_Layer"] = None, changed: tuple[int, ...] = ()) -> None:
        self.row, self.sent, self.gpus, self.start = row, sent, gpus, start
        experts, slots = sent.shape[1], row.shape[0]
        self.per_gpu = slots // gpus
        self.local = np.full((gpus, experts), slots, dtype=np.int64)
        np.minimum.at(self.local, (np.arange(slots) // self.per_gpu, row), np.arange(slots))
        self.missing = (self.local == slots).sum(axis=0)
        rng = random.Random()
        if base is not None and all(self.missing[e] == base.missing[e] for e in changed):
            self.states, self.end = base.states, base.end
            self.target, self.loads = base.target.copy(), base.loads.copy()
            for e in changed:
                self.loads -= self._column_loads(e)
                rng.setstate(self.states[e])
                self.target[:, e] = self._draw(e, rng)
                self.loads += self._column_loads(e)
            return
        rng.setstate(start)
        self.states = []
        self.target = np.empty((gpus, experts), dtype=np.int64)
        for e in range(experts):
            self.states.append(rng.getstate())
            self.target[:, e] = self._draw(e, rng)
        self.end = rng.getstate()
        self.loads = sum((self._column_loads(e) for e in range(experts)), np.zeros(gpus))

    def _draw(self, expert: int, rng: random.Random) -> np.ndarray:
        """``expert``'s target GPU per source rank: its lowest local slot, else SGLang's fair choice."""
        column = self.local[:, expert].copy()
        lacking = np.flatnonzero(column == self.row.shape[0])
        if lacking.size:
            column[lacking] = _fair_choices(np.flatnonzero(self.row == expert).tolist(), int(lacking.size), rng)
        return column // self.per_gpu

    def _column_loads(self, expert: int) -> np.ndarray:
        return np.bincount(self.target[:, expert], weights=self.sent[:, expert], minlength=self.gpus)

    def swapped(self, s: int, t: int) -> "_Layer":
        """This layer with slots ``s`` and ``t`` exchanged, scored exactly."""
        row = self.row.copy()
        row[s], row[t] = row[t], row[s]
        return _Layer(row, self.sent, self.gpus, self.start, self, (int(self.row[s]), int(self.row[t])))
