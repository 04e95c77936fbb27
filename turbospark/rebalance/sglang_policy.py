"""SGLang 0.5.23's expert rearrangement, in numpy: the placement its EPLB chooses from a window's loads, and
the slot each source rank's static dispatch then sends each expert's tokens to.

Followed from the SGLang 0.5.23 wheel (``pip download --no-deps sglang==0.5.23``), files under
``sglang/srt/eplb/``:

* ``eplb_algorithms/__init__.py``: ``compute_algorithm`` (lines 75-87): with
  ``--eplb-algorithm auto`` (the default) ``deepseek_hierarchical`` when the model
  has expert groups (``num_groups``, DeepSeek's ``n_group``; None for Qwen3-MoE)
  and they divide over the nodes, else ``deepseek``; ``rebalance_experts`` (19-35)
  sums the recorder's window over its steps (``tokens_per_expert.sum(dim=0)``,
  int64) and calls ``deepseek.rebalance_experts`` with ``num_gpus`` = EP size.
* ``eplb_algorithms/deepseek.py``, DeepSeek's EPLB as SGLang copies it:
  ``rebalance_experts`` (171-221: ``weight.float()``, float32; the non-hierarchical
  policy is the hierarchical one with one group on one node),
  ``rebalance_experts_hierarchical`` (86-168), ``replicate_experts`` (55-83: each
  spare slot to the expert with the most load per replica, float32, the first on
  ties) and ``balanced_packing`` (7-52: items in the order torch's CPU
  ``sort(descending=True)`` leaves them, each to the lightest pack with room; unlike
  the published EPLB, pack weights add up as Python floats, float64). The order of
  equal loads is libstdc++'s ``std::sort`` (``turbospark.placement._stdsort``
  replays it), for every tie: SGLang lists an expert's slots by replica rank
  (``log2phy``, 207-220), and that order reaches the dispatch below.
* ``expert_location.py``: ``init_by_eplb`` (177-222) turns the result into the new
  metadata, whose ``logical_to_rank_dispatch_physical_map`` is
  ``compute_logical_to_rank_dispatch_physical_map`` (612-672) run on ``log2phy``
  itself: one ``random.Random(42)`` for all ranks, through the map's rows (dense
  layers first) expert by expert; for each expert, each rank's
  ``_find_nearest_expert`` (699-737: the only slot; else the first slot, in
  replica order, on the rank's GPU; else on several nodes the first on its node
  when the node holds some but not all of them), and the ranks left without one
  share ``_fair_choices`` (740-744) of the expert's slots. At start-up
  (``init_by_mapping``) each rank instead collapses its own candidates first and
  draws from a generator of its own: ``turbospark.placement.dispatch.static_slots``
  models that map, this module the one every rearrangement installs.

Rows are independent in the policy, so it runs a layer at a time; the dispatch's
generator runs through the layers in order, so the caller carries it from one
layer to the next (``dispatch_layer``).
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np

from ..placement._greedy import hierarchical
from ..placement.dispatch import SGLANG_SEED, _fair_choices
from .vllm_policy import check_geometry

__all__ = ["algorithm", "dispatch_layer", "generator", "rebalance_experts", "replica_slots"]


def algorithm(groups: Optional[int], nodes: int) -> str:
    """The algorithm ``--eplb-algorithm auto`` picks: ``deepseek_hierarchical`` when ``groups`` is
    given and divides over ``nodes``, else ``deepseek`` (``compute_algorithm``)."""
    return "deepseek_hierarchical" if groups is not None and groups % nodes == 0 else "deepseek"


def rebalance_experts(weight: np.ndarray, slots: int, groups: Optional[int], nodes: int,
                      gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """(phy2log (L, ``slots``), log2phy (L, E, X)) SGLang's EPLB chooses for the (L, E) window loads
    ``weight``: the expert of each slot, and each expert's slots in replica order, -1 padded to X, the
    most replicas of any row (as ``eplb_algorithms.rebalance_experts`` returns them). ``groups``: the
    model's expert groups (None: none). Raises ``ValueError`` for a geometry SGLang asserts against."""
    weight = np.asarray(weight)
    experts = weight.shape[1]
    shape = (groups, nodes) if groups is not None and algorithm(groups, nodes) == "deepseek_hierarchical" else (1, 1)
    check_geometry(experts, slots, gpus, nodes, shape[0])
    # int64 window sums, then .float(): float32 rounding as torch's.
    phy2log, phyrank, logcnt = hierarchical(weight.astype(np.int64).astype(np.float32), slots, *shape, gpus,
                                            accumulate=np.float64, replicas_interchangeable=False)
    return phy2log, replica_slots(phy2log, phyrank, experts, int(logcnt.max(initial=1)))


def replica_slots(phy2log: np.ndarray, phyrank: np.ndarray, experts: int, width: int) -> np.ndarray:
    """(L, E, ``width``) int64: slot of replica r of each expert, -1 where it has fewer (``log2phy``)."""
    layers, slots = phy2log.shape
    table = np.full((layers, experts * width), -1, dtype=np.int64)
    np.put_along_axis(table, phy2log * width + phyrank, np.broadcast_to(np.arange(slots), (layers, slots)), axis=1)
    return table.reshape(layers, experts, width)


def generator() -> random.Random:
    """The generator ``compute_logical_to_rank_dispatch_physical_map`` starts from (seed 42)."""
    return random.Random(SGLANG_SEED)


def dispatch_layer(log2phy: np.ndarray, slots: int, gpus: int, nodes: int, rng: random.Random) -> np.ndarray:
    """(G, E) int64: the slot rank g sends expert e's tokens to in one layer whose (E, X) ``log2phy``
    lists each expert's slots in replica order; ``rng`` is advanced by the layer's draws."""
    experts, width = log2phy.shape
    per_gpu = slots // gpus
    per_node = per_gpu * (gpus // nodes)
    valid = log2phy >= 0
    count = valid.sum(axis=1)
    out = np.full((gpus, experts), -1, dtype=np.int64)
    for rank in range(gpus):
        near = _first(log2phy, valid & (log2phy // per_gpu == rank))
        if nodes > 1:
            on_node = valid & (log2phy // per_node == rank // (gpus // nodes))
            narrows = (on_node.sum(axis=1) > 0) & (on_node.sum(axis=1) < count)
            near = np.where((near < 0) & narrows, _first(log2phy, on_node), near)
        out[rank] = np.where(count == 1, log2phy[:, 0], near)
    for expert in np.flatnonzero((out < 0).any(axis=0)).tolist():
        ranks = np.flatnonzero(out[:, expert] < 0)
        candidates = log2phy[expert, :count[expert]].tolist()
        out[ranks, expert] = _fair_choices(candidates, len(ranks), rng)
    return out


def _first(table: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row, the first entry of ``table`` where ``mask`` holds, -1 where it never does."""
    return np.where(mask.any(axis=1), table[np.arange(table.shape[0]), mask.argmax(axis=1)], -1)
