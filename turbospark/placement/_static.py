"""A placement shaped for SGLang's static dispatch, and a swap search scored exactly under it.

Under static dispatch (``turbospark.placement.dispatch``) a source rank
sends an expert's tokens to its own copy when it holds one; an expert with
r replicas on r distinct GPUs leaves k = G - r ranks to SGLang's fair
choice, which hands each of them a slot from a list of k // r copies of
every slot plus ``k mod r`` sampled ones. When r divides G that list has no
sampled part, but each rank shuffles it with its *own* generator (which the
experts it holds have advanced differently) and takes its own place: two
ranks can take the same slot, so the replicas do not serve G / r ranks
each, and static is not the even model even for an even spread (on several
nodes a same-node copy is preferred as well). The divisor shape is one
candidate among others, each judged exactly.

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

``static_search`` improves a layer by slot swaps, each scored with every
source rank's generator as SGLang draws it.
"""

from __future__ import annotations

import random
from typing import Any, Optional, Sequence

import numpy as np

from .dispatch import StaticPlan, _fair_choices, static_plan

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


def static_search(row: np.ndarray, sent: np.ndarray, gpus: int, rngs: Sequence[random.Random], nodes: int = 1,
                  rounds: int = 16, width: int = 32) -> np.ndarray:
    """Improve one layer's (S,) map for static dispatch by slot swaps between GPUs, judged exactly.

    ``sent`` (G source, E) tokens; ``rngs[g]`` holds source rank g's SGLang generator at this
    layer and is left where it would be after the returned row. Per round: the ``width`` swaps
    between the busiest GPU and another that look best by the even model's shares are scored
    exactly under static dispatch, and the best that lowers the busiest GPU is made; it stops
    after ``rounds`` or when none does. A swap changes only the two experts' candidates: a rank
    whose draws for them keep their shape (it draws for each before and after, from as many
    slots for as many ranks, or for neither) keeps every draw of its generator, so only its
    picks of those two experts are read again from the recorded choices; the other ranks draw
    their whole layer again.
    """
    per_gpu = row.shape[0] // gpus
    gpu_of = np.arange(row.shape[0]) // per_gpu
    best_row = row.copy()
    view = _Layer(best_row, sent, gpus, [rng.getstate() for rng in rngs], nodes)
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
    for rng, state in zip(rngs, view.ends):
        rng.setstate(state)
    return best_row


_MIN_GAIN = 1e-12  # a swap must lower the busiest GPU by more than this share of it


class _Layer:
    """One layer's static dispatch: the map, its ``StaticPlan``, per source rank the generator
    state before each expert it draws for and the choices drawn (positions in the expert's
    candidates), the (G, E) target GPUs, the GPU loads, and each rank's generator state after
    the layer. With ``base`` (the same layer before a swap of the ``changed`` experts), a rank
    whose draws for those keep their shape reuses its draws; the others draw again."""

    plan: StaticPlan
    states: list[dict[int, tuple[Any, ...]]]
    choices: list[dict[int, list[int]]]
    ends: list[tuple[Any, ...]]
    target: np.ndarray
    loads: np.ndarray

    def __init__(self, row: np.ndarray, sent: np.ndarray, gpus: int, starts: list[tuple[Any, ...]], nodes: int = 1,
                 base: Optional["_Layer"] = None, changed: tuple[int, ...] = ()) -> None:
        self.row, self.sent, self.gpus, self.starts, self.nodes = row, sent, gpus, starts, nodes
        self.per_gpu = row.shape[0] // gpus
        self.plan = plan = static_plan(row, sent.shape[1], gpus, nodes)
        slots = plan.nearest.copy()
        self.states, self.choices, self.ends = [], [], []
        rng = random.Random()
        for rank in range(gpus):
            if base is not None and all(_shape(plan, rank, e) == _shape(base.plan, rank, e) for e in changed):
                states, choices = base.states[rank], base.choices[rank]
                end = base.ends[rank]
            else:
                rng.setstate(starts[rank])
                states, choices = {}, {}
                for e in plan.rank_draws(rank):
                    states[e] = rng.getstate()
                    choices[e] = _fair_choices(list(range(len(plan.candidates[e]))), len(plan.remaining[e]), rng)
                end = rng.getstate()
            for e, drawn in choices.items():
                slots[rank, e] = plan.candidates[e][drawn[plan.remaining[e].index(rank)]]
            self.states.append(states)
            self.choices.append(choices)
            self.ends.append(end)
        self.target = slots // self.per_gpu
        self.loads = np.bincount(self.target.ravel(), weights=sent.ravel(), minlength=gpus)

    def swapped(self, s: int, t: int) -> "_Layer":
        """This layer with slots ``s`` and ``t`` exchanged, scored exactly."""
        row = self.row.copy()
        row[s], row[t] = row[t], row[s]
        return _Layer(row, self.sent, self.gpus, self.starts, self.nodes, self, (int(self.row[s]), int(self.row[t])))


def _shape(plan: StaticPlan, rank: int, expert: int) -> Optional[tuple[int, int]]:
    """What ``rank``'s generator consumes for ``expert``: None (no draw) or (slots, ranks drawing)."""
    if plan.nearest[rank, expert] >= 0:
        return None
    return len(plan.candidates[expert]), len(plan.remaining[expert])
