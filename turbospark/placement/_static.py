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

import numpy as np

__all__ = ["divisor_placement"]


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
