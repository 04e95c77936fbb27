"""Local search after the greedy: swap slots between GPUs while the busiest GPU gets lighter.

Per layer and round: take the busiest GPU a (load La), and among every slot
pair (i on a, j on another GPU b of the same node, so node groups stay
whole) with d = w_i - w_j > 0, the swap minimising max(La - d, Lb + d). It
is applied only when that is below La, so the busiest GPU's load never
rises; a layer stops when its busiest GPU has no improving swap. Replica
counts never change, so every expert keeps its slots. All layers still
improving are handled together as one (n, G, S/G, S/G) array per round.
"""

from __future__ import annotations

import numpy as np

from .dispatch import replica_counts

__all__ = ["refine"]

# A swap must gain more than this share of La: float noise cannot loop.
_MIN_GAIN = 1e-12


def refine(phy2log: np.ndarray, weight: np.ndarray, num_gpus: int, num_nodes: int,
           max_rounds: int | None = None) -> np.ndarray:
    """Improve the (L, S) map ``phy2log`` for the (L, E) loads ``weight`` by slot swaps
    within nodes; returns a new map with the same replicas (the input is not changed)."""
    layers, slots = phy2log.shape
    per_gpu = slots // num_gpus
    gpus_per_node = num_gpus // num_nodes
    if per_gpu == 0 or gpus_per_node < 2:
        return phy2log.copy()
    result = phy2log.reshape(layers, num_gpus, per_gpu).copy()
    share = weight / np.maximum(replica_counts(phy2log, weight.shape[1]), 1)
    slot_load = np.take_along_axis(share, phy2log, axis=1).reshape(layers, num_gpus, per_gpu)
    loads = slot_load.sum(axis=2)
    slot_f32 = slot_load.astype(np.float32)
    node = np.arange(num_gpus) // gpus_per_node
    active = np.arange(layers)
    rounds = max_rounds if max_rounds is not None else 8 * num_gpus + 64
    for _ in range(rounds):
        if active.size == 0:
            break
        here = np.arange(active.size)
        load = loads[active]
        a = np.argmax(load, axis=1)
        top = load[here, a]
        # max(La - d, Lb + d) = mid_b + |d - half_b| with mid = (La + Lb) / 2 and
        # half = (La - Lb) / 2; it is below La exactly when |d - half_b| < half_b.
        # GPUs that may not take part (a itself, other nodes) get half = -1: never below.
        half = np.where(node[None, :] == node[a][:, None], (top[:, None] - load) / 2, -1.0)
        half[here, a] = -1.0
        # The search runs in float32 (half the memory traffic); the chosen swap
        # is checked again in float64 below before it is applied.
        slot = slot_f32[active]
        half4 = half.astype(np.float32)[:, :, None, None]
        off = np.subtract(slot[here, a][:, None, :, None], slot[:, :, None, :])  # d: (n, G, i, j)
        off -= half4
        np.abs(off, out=off)
        outside = off >= half4
        off += (half + load).astype(np.float32)[:, :, None, None]
        np.copyto(off, np.float32(np.inf), where=outside)
        best = np.argmin(off.reshape(active.size, -1), axis=1)
        b, rest = np.divmod(best, per_gpu * per_gpu)
        i, j = np.divmod(rest, per_gpu)
        d = slot_load[active, a, i] - slot_load[active, b, j]
        after = np.maximum(top - d, load[here, b] + d)
        improves = np.isfinite(off.reshape(active.size, -1)[here, best]) & (after < top * (1 - _MIN_GAIN))
        if not improves.any():
            break
        a, b, i, j, lay = a[improves], b[improves], i[improves], j[improves], active[improves]
        for grid in (result, slot_load, slot_f32):
            held = grid[lay, a, i].copy()
            grid[lay, a, i] = grid[lay, b, j]
            grid[lay, b, j] = held
        loads[lay, a] = slot_load[lay, a].sum(axis=1)
        loads[lay, b] = slot_load[lay, b].sum(axis=1)
        active = lay
    return result.reshape(layers, slots)
