"""How the engines send a token to one replica of its expert: the three dispatch models.

A placement (``phy2log``, (L, S)) puts S / G consecutive slots on each of the
G GPUs. Where an expert has r > 1 replicas, the engine picks one per routed
token; the GPU loads, and so the imbalance, depend on that choice:

* ``even``: every replica receives 1/r of the expert's tokens (SGLang's
  ``--ep-dispatch-algorithm dynamic`` in expectation; DeepSeek's EPLB model).
* ``static``: SGLang's static dispatch (its default with an all-to-all
  backend such as DeepEP), following ``python/sglang/srt/eplb/expert_location.py``
  (``compute_logical_to_rank_dispatch_physical_map``) and
  ``python/sglang/srt/eplb/expert_location_dispatch.py``: source rank g sends
  *all* its tokens for expert e to one fixed slot, the lowest-numbered slot
  of e on GPU g when there is one; the source ranks without a local replica
  get slots from ``_fair_choices``: with a ``random.Random(42)`` shared by the
  whole map, layer by layer and expert by expert (ascending), the k ranks
  lacking a local copy receive the expert's slots (ascending) repeated
  k // r times plus ``sample(slots, k % r)``, shuffled, assigned to those
  ranks in ascending order. Python's ``random`` is the same here, so the map
  is SGLang's own, draw for draw. Needs per-source-rank counts.
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
  kernel call. From counts alone (no trace) each rank's n tokens of e are one
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

from .evaluate import gpu_loads

__all__ = ["DISPATCH", "Routing", "dispatch_loads", "known_loads", "routing", "source_counts", "static_layer", "static_layer_loads",
           "static_slots", "trtllm_block"]

DISPATCH = ("even", "static", "round-robin")

trtllm_block = 1024  # ids per block of moeComputeRouteKernel: 256 threads x 4 items
_ROUND_ROBIN_CHUNK = 1024 * trtllm_block  # ids the round-robin model handles at once: whole blocks
SGLANG_SEED = 42  # compute_logical_to_rank_dispatch_physical_map's default seed

STATIC_UNKNOWN = ("per-source-rank loads unknown: give one capture per rank (rank i = file i), "
                  "or --dispatch static to assume an even spread over the G ranks")
STATIC_ASSUMED = "assumed: each expert's tokens spread evenly over the {gpus} source ranks (one capture)"
STATIC_MEASURED = "measured: one capture per source rank ({ranks} ranks, rank i = file i)"


@dataclass(frozen=True)
class Routing:
    """Routed tokens by source rank: ``counts`` (R, L, E); ``traces`` None or, per rank,
    per layer, the (P, K) ids in pass order; ``measured``: True when the R ranks are
    real per-rank captures, False for one capture (R = 1, ranks unknown)."""

    counts: np.ndarray
    traces: Optional[tuple["LayerIds", ...]]
    measured: bool

    @property
    def total(self) -> np.ndarray:
        """(L, E) float64: the counts summed over source ranks."""
        return self.counts.sum(axis=0).astype(np.float64)


class LayerIds(Sequence):  # type: ignore[type-arg]
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


def routing(counts: Sequence[np.ndarray], traces: Optional[Sequence[Sequence[np.ndarray]]] = None) -> Routing:
    """A ``Routing`` from per-rank (L, E) counts (one entry: ranks unknown) and, optionally,
    per-rank per-layer (P, K) traces. Raises ``ValueError`` when the ranks differ in shape."""
    shapes = {np.shape(c) for c in counts}
    if len(shapes) != 1:
        raise ValueError(f"the per-rank counts differ in shape: {sorted(shapes)}")
    stacked = np.stack([np.asarray(c) for c in counts])
    kept = None if traces is None else tuple(rank if isinstance(rank, LayerIds) else LayerIds(rank) for rank in traces)
    return Routing(stacked, kept, len(stacked) > 1)


def static_slots(phy2log: np.ndarray, num_experts: int, gpus: int) -> np.ndarray:
    """(L, G, E) int64: the slot source rank g sends expert e's tokens to under SGLang's static dispatch."""
    rng = random.Random(SGLANG_SEED)
    return np.stack([static_layer(row, num_experts, gpus, rng) for row in phy2log])


def static_layer(row: np.ndarray, num_experts: int, gpus: int, rng: random.Random) -> np.ndarray:
    """(G, E) static dispatch slots of one layer's (S,) map, drawing from ``rng`` as SGLang does
    (its one generator runs through the layers in order, so a layer's draws depend on the earlier ones)."""
    slots = row.shape[0]
    # The lowest slot of each expert on each GPU; ``slots`` marks "no local copy".
    out = np.full((gpus, num_experts), slots, dtype=np.int64)
    np.minimum.at(out, (np.arange(slots) // (slots // gpus), row), np.arange(slots))
    out[out == slots] = -1
    candidates: list[list[int]] = [[] for _ in range(num_experts)]
    for slot, expert in enumerate(row.tolist()):
        candidates[expert].append(slot)
    for expert in range(num_experts):
        missing = np.flatnonzero(out[:, expert] < 0)
        if missing.size:  # k = 0 draws nothing from the generator, as in SGLang
            out[missing, expert] = _fair_choices(candidates[expert], int(missing.size), rng)
    return out


def static_layer_loads(row: np.ndarray, sent: np.ndarray, gpus: int, rng: random.Random) -> np.ndarray:
    """(G,) tokens each GPU receives at one layer under static dispatch; ``sent`` (G source, E)."""
    target = static_layer(row, sent.shape[1], gpus, rng) // (row.shape[0] // gpus)
    return np.bincount(target.ravel(), weights=sent.ravel(), minlength=gpus)


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
                   assume_even: bool = False) -> Optional[np.ndarray]:
    """(L, G) float64 tokens each GPU receives under dispatch ``model`` (one of ``DISPATCH``).

    ``static`` without measured ranks returns None unless ``assume_even``
    (each expert's tokens split evenly over G source ranks). Measured ranks
    must number G. Raises ``ValueError`` for an unknown model or rank count.
    """
    if model not in DISPATCH:
        raise ValueError(f"--dispatch must be one of {', '.join(DISPATCH)}, got {model!r}")
    if flow.measured and flow.counts.shape[0] != gpus:
        raise ValueError(f"{flow.counts.shape[0]} per-rank captures for --gpus {gpus}: "
                         "static and round-robin dispatch need one capture per GPU")
    if model == "even":
        return gpu_loads(phy2log, flow.total, gpus)
    if model == "static":
        if not flow.measured and not assume_even:
            return None
        return _static_loads(phy2log, flow, gpus)
    return _round_robin_loads(phy2log, flow, gpus)


def known_loads(model: str, phy2log: np.ndarray, flow: Routing, gpus: int, assume_even: bool = False) -> np.ndarray:
    """``dispatch_loads`` where the loads must be known; raises ``ValueError`` for static without
    per-rank counts and without ``assume_even``."""
    loads = dispatch_loads(model, phy2log, flow, gpus, assume_even)
    if loads is None:
        raise ValueError(STATIC_UNKNOWN)
    return loads


def _static_loads(phy2log: np.ndarray, flow: Routing, gpus: int) -> np.ndarray:
    sent = source_counts(flow, gpus)
    rng = random.Random(SGLANG_SEED)
    return np.stack([static_layer_loads(row, sent[:, layer], gpus, rng) for layer, row in enumerate(phy2log)])


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
                flat = flow.traces[rank][layer].reshape(-1)
                # Whole blocks at a time (a block's replicas depend on that block alone): the int64
                # temporaries are a chunk's, not the layer's (~8 arrays of 8 bytes per id).
                for lo in range(0, flat.size, _ROUND_ROBIN_CHUNK):
                    ids = flat[lo:lo + _ROUND_ROBIN_CHUNK].astype(np.int64)
                    block = (lo + np.arange(ids.size)) // trtllm_block
                    key = block * experts + ids
                    sort = np.argsort(key, kind="stable")
                    first = np.searchsorted(key[sort], key[sort])  # first index of each (block, expert) run
                    occurrence = np.empty(ids.size, dtype=np.int64)
                    occurrence[sort] = np.arange(ids.size) - first
                    replica = (occurrence + block + offset) % r[ids]
                    slot = order[layer, start[layer, ids] + replica]
                    loads[layer] += np.bincount(slot // per_gpu, minlength=gpus)
            else:
                # Slots in (expert, slot) order: the q-th copy of its expert gets the j = (q - g) mod r
                # occurrences j, j + r, ... of the expert's n tokens.
                expert = phy2log[layer, order[layer]]
                q = np.arange(slots) - start[layer, expert]
                n = flow.counts[rank, layer].astype(np.int64)[expert]
                got = (n - (q - offset) % r[expert] + r[expert] - 1) // r[expert]
                loads[layer] += np.bincount(order[layer] // per_gpu, weights=got, minlength=gpus)
    return loads
