"""vLLM 0.33's expert rearrangement, in numpy: the placement ``DefaultEplbPolicy`` returns and the replica
its router sends each token to.

Followed from the vLLM 0.33.0 wheel (``pip download --no-deps vllm==0.33.0``):

* ``vllm/distributed/eplb/policy/default.py``: ``balanced_packing`` (lines
  21-72: items by descending weight, ``np.argsort(-weight)``, each to the
  lightest pack that is not full), ``replicate_experts`` (74-100: each spare
  slot to the expert with the largest load per replica, ``np.argmax``, first
  on ties), ``rebalance_experts_hierarchical`` (102-188: groups packed to
  nodes, replication within a node, replicas packed to the node's GPUs),
  ``preserve_intragpu_slots`` (190-270: on each GPU, an expert that stays
  keeps the slot it had; the others fill the freed slots in order) and
  ``rebalance_experts`` (272-332: the load window as ``weight.float()``,
  float32; hierarchical when ``num_groups % num_nodes == 0``, else one group
  on one node; then ``preserve_intragpu_slots`` against the map served now,
  which ``EplbState.rearrange`` always passes, ``eplb_state.py`` 868-875).
  The operations here are the same numpy calls on the same dtypes (the sort
  order of equal loads is numpy's, as in vLLM), so the maps are equal, not
  close (tests/rebalance/test_vllm_wheel_policy.py runs the wheel's module).
* ``vllm/distributed/eplb/eplb_state.py`` ``compute_logical_maps`` (1264-1340):
  an expert's replicas in ascending slot order.
* ``vllm/model_executor/layers/fused_moe/router/base_router.py``
  ``_eplb_map_and_record_i32_kernel`` (lines 18-90): the (token, k) ids of a
  forward flattened, ``token_idx = offset // top_k``; replica
  ``((token_idx * 2654435769) & 0xFFFFFFFF) % replica_count`` (Knuth's
  multiplicative hash), the same replica for every k of a token.

vLLM's numbering: ``physical_to_logical_map`` (L, S), S / G consecutive slots per
EP rank, as turbospark's placement files.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["KNUTH_MULTIPLIER", "balanced_packing", "check_geometry", "hash_replica", "logical_to_physical",
           "preserve_slots", "rebalance_experts", "replicate"]

KNUTH_MULTIPLIER = 2654435769  # base_router.py: floor(2^32 / phi)


def balanced_packing(weight: np.ndarray, packs: int) -> tuple[np.ndarray, np.ndarray]:
    """(pack, rank in pack), each (X, n) int64, of n weighted items per row put n / packs to a pack:
    heaviest first, each to the lightest pack with room. ``packs`` divides n."""
    rows, items = weight.shape
    per_pack = items // packs
    if per_pack == 1:
        index = np.tile(np.arange(items, dtype=np.int64), (rows, 1))
        return index, np.zeros_like(index)
    # Same call as vLLM's (default sort kind): equal weights come out in the same order.
    heaviest = np.argsort(-weight, axis=-1)
    pack = np.full((rows, items), -1, dtype=np.int64)
    rank = np.full((rows, items), -1, dtype=np.int64)
    for row in range(rows):
        load = np.zeros(packs, dtype=np.float64)
        filled = np.zeros(packs, dtype=np.int64)
        values = weight[row]
        for item in heaviest[row]:
            chosen = int(np.argmin(load))
            pack[row, item] = chosen
            rank[row, item] = filled[chosen]
            load[chosen] += values[item]
            filled[chosen] += 1
            if filled[chosen] == per_pack:
                load[chosen] = np.inf  # full: never the lightest again
    return pack, rank


def replicate(weight: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot -> expert (X, slots), replicas per expert (X, n)): slot i < n holds expert i, each further
    slot the expert with the most load per replica at that point (the first such on ties)."""
    rows, experts = weight.shape
    phy2log = np.tile(np.arange(slots, dtype=np.int64), (rows, 1))
    count = np.ones((rows, experts), dtype=np.int64)
    every = np.arange(rows, dtype=np.int64)
    for slot in range(experts, slots):
        busiest = np.argmax(weight / count, axis=-1)
        phy2log[:, slot] = busiest
        count[every, busiest] += 1
    return phy2log, count


def _inverse(perm: np.ndarray) -> np.ndarray:
    out = np.empty_like(perm)
    out[np.arange(perm.shape[0])[:, None], perm] = np.arange(perm.shape[1], dtype=np.int64)
    return out


def _hierarchical(weight: np.ndarray, slots: int, groups: int, nodes: int, gpus: int) -> np.ndarray:
    layers, experts = weight.shape
    group_size = experts // groups
    per_gpu = slots // gpus
    group_load = weight.reshape(layers, groups, group_size).sum(axis=-1)
    group_pack, group_rank = balanced_packing(group_load, nodes)
    # Experts renumbered node by node, in the order their groups were packed.
    to_node_order = ((group_pack * (groups // nodes) + group_rank)[..., None] * group_size
                     + np.arange(group_size, dtype=np.int64)).reshape(layers, experts)
    from_node_order = _inverse(to_node_order)
    node_load = np.take_along_axis(weight, from_node_order, axis=1).reshape(-1, experts // nodes)
    slot_expert, replicas = replicate(node_load, slots // nodes)
    slot_load = np.take_along_axis(node_load / replicas, slot_expert, axis=1)
    pack, rank = balanced_packing(slot_load, gpus // nodes)
    placed = _inverse(pack * per_gpu + rank)
    node_slots = np.take_along_axis(slot_expert, placed, axis=1)
    node_slots = (node_slots.reshape(layers, nodes, -1)
                  + np.arange(0, experts, experts // nodes, dtype=np.int64)[None, :, None]).reshape(layers, -1)
    return np.take_along_axis(from_node_order, node_slots, axis=1)


def preserve_slots(new: np.ndarray, gpus: int, old: np.ndarray) -> np.ndarray:
    """``new`` with each GPU's slots reordered: an expert the GPU held keeps its old slot (old slots
    scanned in order, each taking the first unclaimed new slot of the same expert); the rest fill the
    remaining slots in order."""
    slots = new.shape[1]
    if gpus <= 0 or slots % gpus:
        return new
    per_gpu = slots // gpus
    out = new.copy()
    for gpu in range(gpus):
        lo = gpu * per_gpu
        mine, theirs = new[:, lo:lo + per_gpu], old[:, lo:lo + per_gpu]
        for layer in range(new.shape[0]):
            used = np.zeros(per_gpu, dtype=bool)
            kept = np.zeros(per_gpu, dtype=bool)
            for position in range(per_gpu):
                match = np.flatnonzero((mine[layer] == theirs[layer, position]) & ~used)
                if match.size:
                    out[layer, lo + position] = mine[layer, match[0]]
                    used[match[0]] = True
                    kept[position] = True
            sources, targets = np.flatnonzero(~used), np.flatnonzero(~kept)
            take = min(sources.size, targets.size)
            out[layer, lo + targets[:take]] = mine[layer, sources[:take]]
    return out


def check_geometry(experts: int, slots: int, gpus: int, nodes: int, groups: int = 1) -> None:
    """Raises ``ValueError`` for what the engines' EPLB policies assert: ``slots`` below E or not a multiple
    of ``gpus``, ``gpus`` not a multiple of ``nodes``, E not a multiple of ``groups``."""
    if slots < experts or slots % gpus:
        raise ValueError(f"{slots} slots for {experts} experts on {gpus} GPUs: need at least one slot per "
                         "expert and the same number per GPU")
    if gpus % nodes:
        raise ValueError(f"{gpus} GPUs do not split over {nodes} nodes")
    if experts % groups:
        raise ValueError(f"{experts} experts do not split into {groups} expert groups")


def rebalance_experts(weight: np.ndarray, slots: int, groups: int, nodes: int, gpus: int,
                      old: Optional[np.ndarray] = None) -> np.ndarray:
    """(L, ``slots``) int64 physical_to_logical_map vLLM 0.33's ``DefaultEplbPolicy.rebalance_experts``
    returns for the (L, E) window ``weight`` (taken as float32, as ``weight.float()``) and, when given,
    the (L, S) map ``old`` served now.

    Raises ``ValueError`` when ``slots`` is not a multiple of ``gpus`` or below E, ``gpus`` not a
    multiple of ``nodes``, or E not a multiple of ``groups`` where the hierarchical policy runs (vLLM
    asserts these)."""
    weight = np.asarray(weight).astype(np.float32)
    experts = weight.shape[1]
    if groups % nodes == 0:
        check_geometry(experts, slots, gpus, nodes, groups)
        chosen = _hierarchical(weight, slots, groups, nodes, gpus)
    else:
        check_geometry(experts, slots, gpus, nodes)
        chosen = _hierarchical(weight, slots, 1, 1, gpus)
    if old is not None:
        chosen = preserve_slots(chosen, gpus, np.asarray(old, dtype=np.int64))
    return chosen


def logical_to_physical(phy2log: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(slots of each expert, (L, E, max replicas), -1 padded, ascending; replicas (L, E)), as
    ``compute_logical_maps`` builds them."""
    layers, slots = phy2log.shape
    order = np.argsort(phy2log, axis=1, kind="stable")  # by expert, then by slot
    replicas = np.stack([np.bincount(row, minlength=num_experts) for row in phy2log])
    start = np.concatenate([np.zeros((layers, 1), dtype=np.int64), np.cumsum(replicas, axis=1)[:, :-1]], axis=1)
    table = np.full((layers, num_experts, int(replicas.max(initial=1))), -1, dtype=np.int64)
    for layer in range(layers):
        expert = phy2log[layer, order[layer]]
        table[layer, expert, np.arange(slots) - start[layer, expert]] = order[layer]
    return table, replicas


def hash_replica(token_index: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    """The replica (0-based, of ``replicas``) vLLM's router picks for the token at ``token_index`` in
    its forward: ``((token_index * 2654435769) & 0xFFFFFFFF) % replicas``."""
    hashed = (np.asarray(token_index, dtype=np.int64) * KNUTH_MULTIPLIER) & 0xFFFFFFFF
    return hashed % np.asarray(replicas, dtype=np.int64)
