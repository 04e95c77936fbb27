"""A layer's GPU loads under a dispatch model: how the engines send a token to one replica of its expert.

A placement (``phy2log``, (L, S)) puts S / G consecutive slots on each of the
G GPUs. Where an expert has r > 1 replicas, the engine picks one per routed
token; the GPU loads, and so the imbalance, depend on that choice. Per
layer, ``imbalance = (max - mean) / mean`` and ``balancedness = mean / max``
over the G GPU loads, both None (JSON null) when the layer has no load
(``layer_stats``; docs/placement.md states them too). The three models:

* ``even``: every replica receives 1/r of the expert's tokens (SGLang's
  ``--ep-dispatch-algorithm dynamic`` in expectation; DeepSeek's EPLB model):
  a GPU's load is the sum over its slots (``gpu_loads``).
* ``static``: SGLang's static dispatch (its default with an all-to-all
  backend such as DeepEP), following SGLang 0.5.23's
  ``python/sglang/srt/eplb/expert_location.py`` (``init_by_mapping``,
  ``_compute_logical_to_all_physical_map``, ``compute_logical_to_rank_dispatch_physical_map``,
  ``_find_nearest_expert``, ``_fair_choices``) and
  ``expert_location_dispatch.py``, as each source rank g computes its own
  map at start-up: source rank g sends *all* its tokens for expert e to one
  fixed slot. With one slot, that slot; else the lowest slot of e on GPU g;
  else, on several nodes, the lowest slot of e on g's node when that node
  holds some but not all of e's slots; else a draw: the k ranks with none
  of these (in ascending order) receive e's slots (ascending) repeated
  k // r times plus ``sample(slots, k % r)``, shuffled, and g takes its
  place in that list. Rank g draws from its *own* ``random.Random(42)``,
  which runs through the map's rows in order (the D trivial rows of the
  dense layers first, then the MoE layers), expert by expert, and draws
  only where g itself lacks a near copy: the ranks' generators diverge, so
  two ranks lacking the same expert may pick the same slot. Python's
  ``random`` is the same here, so every rank's map is SGLang's own, draw for
  draw (tests/placement/test_sglang_dispatch.py runs SGLang's code on our
  files). Needs per-source-rank counts.
* ``round-robin``: TensorRT-LLM's load balancer routing, following
  ``cpp/tensorrt_llm/kernels/moeLoadBalance/moeLoadBalanceKernels.cu``
  (``moeComputeRouteKernel``) and ``tensorrt_llm/_torch/modules/fused_moe``
  (``offset_by_ep_rank=use_dp``): a rank's (token, k) ids, flattened in pass
  order, are cut into blocks of 1,024 ids (256 threads x 4); in block b the
  j-th occurrence (0-based, in order) of expert e goes to its replica
  ``(j + b + g) mod r``, replicas in ascending global slot order (as
  ``cpp/tensorrt_llm/runtime/moeLoadBalancer/moeLoadBalancer.cpp`` fills
  ``globalSlotIds``), g the source rank
  (0 without attention DP: one capture). A layer's passes are taken as one
  kernel call, unless the routing carries engine steps (``place --batch B``):
  then each step is a call, its passes in recorder order, and the blocks
  restart at each. From counts alone (no trace) each rank's n tokens of e are one
  block: replica q receives ``ceil((n - (q - g) mod r) / r)`` of them.

Source ranks: ``Routing`` holds per-rank counts (R, L, E) and traces. With R
per-rank captures (attention data parallelism: each EP rank routes its own
requests), rank i is file i and R must equal G. With one capture, static
dispatch is unknown unless the caller assumes each expert's tokens spread
evenly over the G source ranks (``assume_even``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["DISPATCH", "Routing", "StaticPlan", "dispatch_loads", "gpu_loads", "known_loads", "layer_stats",
           "replica_counts", "round_robin_note", "routing", "source_counts", "static_generators", "static_layer",
           "static_layer_loads", "static_plan", "static_senders", "static_slots", "trivial_map", "trtllm_block"]

DISPATCH = ("even", "static", "round-robin")

trtllm_block = 1024  # ids per block of moeComputeRouteKernel: 256 threads x 4 items
_ROUND_ROBIN_CHUNK = 1024 * trtllm_block  # ids the round-robin model handles at once: whole blocks
SGLANG_SEED = 42  # compute_logical_to_rank_dispatch_physical_map's default seed

STATIC_UNKNOWN = ("per-source-rank loads unknown: give one capture per rank (rank i = file i), "
                  "or --dispatch static to assume an even spread over the G ranks")
STATIC_ASSUMED = "assumed: each expert's tokens spread evenly over the {gpus} source ranks (one capture)"
STATIC_MEASURED = "measured: one capture per source rank ({ranks} ranks, rank i = file i)"
ROUND_ROBIN_LAYER = ("assumed: each layer's passes are one kernel call (per-step calls restart the blocks and "
                     "raise the figure{hint})")
ROUND_ROBIN_HINT = "; --batch B models steps of B passes"
ROUND_ROBIN_STEPS = "modelled: one kernel call per serving step ({steps})"
ROUND_ROBIN_COUNTS = "assumed: from counts alone, each rank's tokens of an expert are one block (no trace)"


# ------------------------------------------------ the loads of a map, and their spread


def trivial_map(num_layers: int, num_experts: int, num_slots: int) -> np.ndarray:
    """The placement every runtime starts from: expert ``s mod E`` on slot s (SGLang's convention)."""
    return np.broadcast_to(np.arange(num_slots) % num_experts, (num_layers, num_slots)).copy()


def replica_counts(phy2log: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, E) int64: how many slots of each layer hold each expert."""
    layers = phy2log.shape[0]
    offset = (np.arange(layers) * num_experts)[:, None]
    flat = np.bincount((phy2log + offset).ravel(), minlength=layers * num_experts)
    return flat.reshape(layers, num_experts)


def gpu_loads(phy2log: np.ndarray, counts: np.ndarray, num_gpus: int) -> np.ndarray:
    """Tokens each GPU receives: (..., L, G) float64 for counts shaped (..., L, E).

    Takes the (L, S) map, the routed counts and G (which divides S); every
    expert must hold a slot (the caller checks).
    """
    layers, slots = phy2log.shape
    replicas = replica_counts(phy2log, counts.shape[-1])
    share = counts / replicas  # 1/r of a token per replica
    per_slot = np.take_along_axis(share, np.broadcast_to(phy2log, share.shape[:-1] + (slots,)), axis=-1)
    return per_slot.reshape(per_slot.shape[:-1] + (num_gpus, slots // num_gpus)).sum(axis=-1)


def imbalance(loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(imbalance, balancedness) over the last axis of GPU loads; NaN where there is no load."""
    top = loads.max(axis=-1)
    mean = loads.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, (top - mean) / mean, np.nan), np.where(top > 0, mean / top, np.nan)


def layer_stats(loads: np.ndarray) -> list[dict[str, Any]]:
    """Per layer of an (L, G) load array: {"imbalance", "balancedness", "max_load", "mean_load"},
    the first two None for a layer without load."""
    imb, bal = imbalance(loads)
    top, mean = loads.max(axis=-1), loads.mean(axis=-1)
    return [
        {
            "imbalance": _value(i), "balancedness": _value(b),
            "max_load": float(t), "mean_load": float(m),
        }
        for i, b, t, m in zip(imb.tolist(), bal.tolist(), top.tolist(), mean.tolist())
    ]


def _value(x: float) -> float | None:
    return None if x != x else x  # NaN -> None


# ------------------------------------------------ the dispatch models

@dataclass(frozen=True)
class Routing:
    """Routed tokens by source rank: ``counts`` (R, L, E); ``traces`` None or, per rank,
    per layer, the (P, K) ids in pass order; ``measured``: True when the R ranks are
    real per-rank captures, False for one capture (R = 1, ranks unknown); ``calls``
    None (each layer's passes are one kernel call) or, per rank, per layer, the (P,)
    engine step of each traced pass (round-robin runs one kernel call per step);
    ``steps`` says how the steps were formed; ``breaks`` None or, per rank, per layer,
    the positions in its traced passes where rows resume after a gap (a streamed
    capture's failed append): round-robin's per-layer call ends there and another
    starts, so no block joins rows across a gap."""

    counts: np.ndarray
    traces: Optional[tuple["LayerIds", ...]]
    measured: bool
    calls: Optional[tuple[tuple[np.ndarray, ...], ...]] = None
    steps: Optional[str] = None
    breaks: Optional[tuple[tuple[tuple[int, ...], ...], ...]] = None

    @property
    def total(self) -> np.ndarray:
        """(L, E) float64: the counts summed over source ranks."""
        return self.counts.sum(axis=0).astype(np.float64)


class LayerIds(Sequence[np.ndarray]):
    """One rank's per-layer (P, K) ids, each read when asked for (only the passes ``masks[layer]`` keeps,
    with masks): a streamed capture's layers are then never all held at once (issue 25)."""

    def __init__(self, rows: Sequence[Any], masks: Optional[Sequence[np.ndarray]] = None) -> None:
        self._rows = rows
        self._masks = masks

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, layer: Any) -> Any:
        if isinstance(layer, slice):
            return [self[i] for i in range(*layer.indices(len(self)))]
        ids = np.asarray(self._rows[layer])
        return ids if self._masks is None else ids[self._masks[layer]]


def routing(counts: Sequence[np.ndarray], traces: Optional[Sequence[Sequence[np.ndarray]]] = None,
            calls: Optional[Sequence[Sequence[np.ndarray]]] = None, steps: Optional[str] = None,
            breaks: Optional[Sequence[Sequence[Sequence[int]]]] = None) -> Routing:
    """A ``Routing`` from per-rank (L, E) counts (one entry: ranks unknown) and, optionally,
    per-rank per-layer (P, K) traces and (P,) engine steps of their passes (``steps``: how
    they were formed, for the output), and per-rank per-layer gap positions in the traces
    (``breaks``, see ``Routing``). Raises ``ValueError`` when the ranks differ in shape,
    or steps or breaks come without a trace, or steps do not match its passes."""
    shapes = {np.shape(c) for c in counts}
    if len(shapes) != 1:
        raise ValueError(f"the per-rank counts differ in shape: {sorted(shapes)}")
    stacked = np.stack([np.asarray(c) for c in counts])
    kept = None if traces is None else tuple(rank if isinstance(rank, LayerIds) else LayerIds(rank) for rank in traces)
    steps_kept = None
    if calls is not None:
        if kept is None:
            raise ValueError("engine steps need the trace they cut")
        steps_kept = tuple(tuple(np.asarray(c, dtype=np.int64) for c in rank) for rank in calls)
        if [[c.shape[0] for c in rank] for rank in steps_kept] != [[ids.shape[0] for ids in rank] for rank in kept]:
            raise ValueError("the engine steps do not match the trace's passes")
    kept_breaks = None
    if breaks is not None and any(len(b) for rank in breaks for b in rank):
        if kept is None:
            raise ValueError("gap positions need the trace they cut")
        kept_breaks = tuple(tuple(tuple(int(p) for p in layer) for layer in rank) for rank in breaks)
    return Routing(stacked, kept, len(stacked) > 1, steps_kept, steps if calls is not None else None, kept_breaks)


def round_robin_note(flow: Routing, batch_hint: bool = False) -> str:
    """How round-robin's kernel calls were taken for ``flow``: per step, per layer, or from counts;
    ``batch_hint``: say that ``--batch`` models steps (where one capture's command takes it)."""
    if flow.traces is None:
        return ROUND_ROBIN_COUNTS
    if flow.calls is not None:
        return ROUND_ROBIN_STEPS.format(steps=flow.steps)
    return ROUND_ROBIN_LAYER.format(hint=ROUND_ROBIN_HINT if batch_hint and not flow.measured else "")


def static_slots(phy2log: np.ndarray, num_experts: int, gpus: int, nodes: int = 1,
                 first_layer: int = 0) -> np.ndarray:
    """(L, G, E) int64: the slot source rank g sends expert e's tokens to under SGLang's static
    dispatch, each rank's map computed as that rank computes it (module docstring)."""
    rngs = static_generators(gpus, num_experts, phy2log.shape[1], nodes, first_layer)
    return np.stack([static_layer(row, num_experts, gpus, rngs, nodes) for row in phy2log])


def static_generators(gpus: int, num_experts: int, slots: int, nodes: int = 1,
                      first_layer: int = 0) -> list[random.Random]:
    """Each source rank's ``random.Random(42)`` as it stands at the first MoE layer: after the
    ``first_layer`` trivial rows (slot s holds expert s mod E) SGLang's map starts with."""
    rngs = [random.Random(SGLANG_SEED) for _ in range(gpus)]
    if first_layer:
        trivial = np.arange(slots) % num_experts
        for _ in range(first_layer):
            static_layer(trivial, num_experts, gpus, rngs, nodes)
    return rngs


@dataclass(frozen=True)
class StaticPlan:
    """What one layer's map fixes before any draw: ``candidates[e]``, the slots of expert e
    (ascending); ``nearest`` (G, E), the slot rank g takes without drawing (-1: it draws);
    ``draws`` (ascending) the experts some rank draws for, and ``remaining[e]`` those ranks."""

    candidates: list[list[int]]
    nearest: np.ndarray
    draws: list[int]
    remaining: dict[int, list[int]]

    def rank_draws(self, rank: int) -> list[int]:
        """The experts ``rank`` draws for, in the order its generator serves them."""
        return [e for e in self.draws if self.nearest[rank, e] < 0]


def static_plan(row: np.ndarray, num_experts: int, gpus: int, nodes: int = 1) -> StaticPlan:
    """SGLang's ``_find_nearest_expert`` for every (rank, expert) of one layer's (S,) map: an
    expert with one slot takes it; else the lowest slot on the rank's GPU; else, on several
    nodes, the lowest slot on the rank's node when the node holds some but not all of the
    expert's slots; else the rank draws (-1)."""
    slots = row.shape[0]
    per_gpu = slots // gpus
    per_node = per_gpu * (gpus // nodes)
    index = np.arange(slots)
    order = np.argsort(row, kind="stable")
    bounds = np.searchsorted(row[order], np.arange(num_experts + 1))
    candidates = [order[bounds[e]:bounds[e + 1]].tolist() for e in range(num_experts)]
    replicas = np.diff(bounds)
    local = np.full((gpus, num_experts), slots, dtype=np.int64)
    np.minimum.at(local, (index // per_gpu, row), index)
    nearest = np.where(local < slots, local, -1)
    if nodes > 1:
        node_low = np.full((nodes, num_experts), slots, dtype=np.int64)
        np.minimum.at(node_low, (index // per_node, row), index)
        node_count = np.zeros((nodes, num_experts), dtype=np.int64)
        np.add.at(node_count, (index // per_node, row), 1)
        node_of = np.arange(gpus) // (gpus // nodes)
        narrows = (node_count[node_of] > 0) & (node_count[node_of] < replicas)
        nearest = np.where((nearest < 0) & narrows, node_low[node_of], nearest)
    single = replicas == 1
    nearest[:, single] = order[bounds[:-1][single]]
    lacking = nearest < 0
    draws = np.flatnonzero(lacking.any(axis=0)).tolist()
    remaining = {e: np.flatnonzero(lacking[:, e]).tolist() for e in draws}
    return StaticPlan(candidates, nearest, draws, remaining)


def static_layer(row: np.ndarray, num_experts: int, gpus: int, rngs: Sequence[random.Random],
                 nodes: int = 1) -> np.ndarray:
    """(G, E) static dispatch slots of one layer's (S,) map; ``rngs[g]`` is rank g's generator,
    advanced as SGLang's on that rank (it draws only for the experts it has no near copy of)."""
    plan = static_plan(row, num_experts, gpus, nodes)
    out = plan.nearest.copy()
    for rank, rng in enumerate(rngs):
        for e in plan.rank_draws(rank):
            out[rank, e] = plan.candidates[e][fair_position(plan, e, rank, rng)]
    return out


def fair_position(plan: StaticPlan, expert: int, rank: int, rng: random.Random) -> int:
    """Which of ``expert``'s candidates ``rank`` gets from SGLang's ``_fair_choices``, drawn from ``rng``."""
    ranks = plan.remaining[expert]
    return _fair_choices(list(range(len(plan.candidates[expert]))), len(ranks), rng)[ranks.index(rank)]


def static_layer_loads(row: np.ndarray, sent: np.ndarray, gpus: int, rngs: Sequence[random.Random],
                       nodes: int = 1) -> np.ndarray:
    """(G,) tokens each GPU receives at one layer under static dispatch; ``sent`` (G source, E)."""
    target = static_layer(row, sent.shape[1], gpus, rngs, nodes) // (row.shape[0] // gpus)
    return np.bincount(target.ravel(), weights=sent.ravel(), minlength=gpus)


def static_senders(target: np.ndarray, gpus: int) -> np.ndarray:
    """(E, G) int64: how many of the G source ranks send expert e's tokens to GPU g, from the (G, E) GPU
    each rank's static dispatch sends each expert to. With each expert's tokens spread evenly over the
    ranks, ``counts @ static_senders(...)`` is G x the GPU loads, exactly (in integers: a float matmul's
    order would follow the machine's BLAS kernel)."""
    senders = np.zeros((target.shape[1], gpus), dtype=np.int64)
    np.add.at(senders, (np.broadcast_to(np.arange(target.shape[1]), target.shape), target), 1)
    return senders


def source_counts(flow: "Routing", gpus: int) -> np.ndarray:
    """(G, L, E) float64 tokens each source rank sends: measured, or the total split evenly over G."""
    if flow.measured:
        return flow.counts.astype(np.float64)
    total = flow.total
    return np.broadcast_to(total / gpus, (gpus,) + total.shape)


def _fair_choices(arr: list[int], k: int, rng: random.Random) -> list[int]:
    """SGLang's ``_fair_choices``: ``arr`` repeated k // len(arr) times plus a sample of the rest, shuffled."""
    quotient, remainder = divmod(k, len(arr))
    chosen = arr * quotient + rng.sample(arr, k=remainder)
    rng.shuffle(chosen)
    return chosen


def dispatch_loads(model: str, phy2log: np.ndarray, flow: Routing, gpus: int,
                   assume_even: bool = False, *, nodes: int = 1, first_layer: int = 0) -> Optional[np.ndarray]:
    """(L, G) float64 tokens each GPU receives under dispatch ``model`` (one of ``DISPATCH``).

    ``static`` without measured ranks returns None unless ``assume_even``
    (each expert's tokens split evenly over G source ranks); it depends on
    the ``nodes`` the G ranks span (a rank prefers a replica on its node)
    and on ``first_layer``, the dense layers whose trivial rows SGLang's
    generators run through first. Measured ranks must number G. Raises
    ``ValueError`` for an unknown model, a rank count other than G, or
    ``nodes`` not dividing G.
    """
    if model not in DISPATCH:
        raise ValueError(f"--dispatch must be one of {', '.join(DISPATCH)}, got {model!r}")
    if flow.measured and flow.counts.shape[0] != gpus:
        raise ValueError(f"{flow.counts.shape[0]} per-rank captures for --gpus {gpus}: "
                         "static and round-robin dispatch need one capture per GPU")
    if type(nodes) is not int or nodes < 1 or gpus % nodes:
        raise ValueError(f"--gpus {gpus} is not divisible by --nodes {nodes!r}")
    if type(first_layer) is not int or first_layer < 0:
        raise ValueError(f"--first-moe-layer must be 0 or more, got {first_layer!r}")
    if model == "even":
        return gpu_loads(phy2log, flow.total, gpus)
    if model == "static":
        if not flow.measured and not assume_even:
            return None
        return _static_loads(phy2log, flow, gpus, nodes, first_layer)
    return _round_robin_loads(phy2log, flow, gpus)


def known_loads(model: str, phy2log: np.ndarray, flow: Routing, gpus: int, assume_even: bool = False, *,
                nodes: int = 1, first_layer: int = 0) -> np.ndarray:
    """``dispatch_loads`` where the loads must be known; raises ``ValueError`` for static without
    per-rank counts and without ``assume_even``."""
    loads = dispatch_loads(model, phy2log, flow, gpus, assume_even, nodes=nodes, first_layer=first_layer)
    if loads is None:
        raise ValueError(STATIC_UNKNOWN)
    return loads


def _static_loads(phy2log: np.ndarray, flow: Routing, gpus: int, nodes: int, first_layer: int) -> np.ndarray:
    sent = source_counts(flow, gpus)
    experts = sent.shape[-1]
    rngs = static_generators(gpus, experts, phy2log.shape[1], nodes, first_layer)
    return np.stack([static_layer_loads(row, sent[:, layer], gpus, rngs, nodes)
                     for layer, row in enumerate(phy2log)])


def _slot_order(phy2log: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the slots sorted by (expert, slot) and each expert's first index into them."""
    order = np.argsort(phy2log * phy2log.shape[1] + np.arange(phy2log.shape[1]), axis=1, kind="stable")
    sorted_experts = np.take_along_axis(phy2log, order, axis=1)
    start = np.stack([np.searchsorted(row, np.arange(num_experts)) for row in sorted_experts])
    return order, start


def _round_robin_loads(phy2log: np.ndarray, flow: Routing, gpus: int) -> np.ndarray:
    layers, slots = phy2log.shape
    experts = flow.counts.shape[-1]
    per_gpu = slots // gpus
    order, start = _slot_order(phy2log, experts)
    replicas = np.diff(np.concatenate([start, np.full((layers, 1), slots)], axis=1), axis=1)
    loads = np.zeros((layers, gpus))
    for rank in range(flow.counts.shape[0]):
        offset = rank if flow.measured else 0  # offset_by_ep_rank = attention DP
        for layer in range(layers):
            r = replicas[layer]
            if flow.traces is not None:
                if flow.calls is not None:
                    passes = flow.traces[rank][layer]
                    width = passes.shape[1] if passes.ndim == 2 else 1
                    # One kernel call per step, its passes in recorder order: blocks restart each call.
                    step = flow.calls[rank][layer]
                    by_step = np.argsort(step, kind="stable")
                    ids = passes[by_step].reshape(-1).astype(np.int64)
                    call = np.repeat(step[by_step], width)
                    block = (np.arange(ids.size) - np.searchsorted(call, call)) // trtllm_block
                    group = call * (ids.size // trtllm_block + 1) + block
                    loads[layer] += _block_loads(ids, block, group * experts + ids, r, offset, order[layer],
                                                 start[layer], per_gpu, gpus)
                    continue
                passes = flow.traces[rank][layer]
                cuts = () if flow.breaks is None else flow.breaks[rank][layer]
                bounds = [0] + [b for b in cuts if 0 < b < passes.shape[0]] + [passes.shape[0]]
                # A gap ends the call: the rows after it are a call of their own (blocks restart).
                for a, b in zip(bounds[:-1], bounds[1:]):
                    flat = passes[a:b].reshape(-1)
                    # Whole blocks at a time (a block's replicas depend on that block alone): the int64
                    # temporaries are a chunk's, not the layer's (~8 arrays of 8 bytes per id).
                    for lo in range(0, flat.size, _ROUND_ROBIN_CHUNK):
                        ids = flat[lo:lo + _ROUND_ROBIN_CHUNK].astype(np.int64)
                        block = (lo + np.arange(ids.size)) // trtllm_block
                        loads[layer] += _block_loads(ids, block, block * experts + ids, r, offset, order[layer],
                                                     start[layer], per_gpu, gpus)
            else:
                # Slots in (expert, slot) order: the q-th copy of its expert gets the j = (q - g) mod r
                # occurrences j, j + r, ... of the expert's n tokens.
                expert = phy2log[layer, order[layer]]
                q = np.arange(slots) - start[layer, expert]
                n = flow.counts[rank, layer].astype(np.int64)[expert]
                got = (n - (q - offset) % r[expert] + r[expert] - 1) // r[expert]
                loads[layer] += np.bincount(order[layer] // per_gpu, weights=got, minlength=gpus)
    return loads


def _block_loads(ids: np.ndarray, block: np.ndarray, key: np.ndarray, r: np.ndarray, offset: Any,
                 order: np.ndarray, start: np.ndarray, per_gpu: int, gpus: int) -> np.ndarray:
    """Per-GPU loads of ``ids`` under round-robin within blocks: each (block, expert) run's n-th id goes to
    replica (n + block + offset) mod r of its expert (``key``: the run each id belongs to)."""
    sort = np.argsort(key, kind="stable")
    first = np.searchsorted(key[sort], key[sort])  # first index of each (block, expert) run
    occurrence = np.empty(ids.size, dtype=np.int64)
    occurrence[sort] = np.arange(ids.size) - first
    replica = (occurrence + block + offset) % r[ids]
    slot = order[start[ids] + replica]
    return np.bincount(slot // per_gpu, minlength=gpus)
