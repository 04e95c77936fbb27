"""Per-step GPU load imbalance of a placement under a dispatch model.

A step runs every MoE layer in turn, and each layer waits for its busiest
GPU. So for step t with GPU loads ``load[t, l, g]`` (tokens GPU g receives at
layer l in step t), the step's imbalance is

    imbalance[t] = (sum_l max_g load[t, l, g] - sum_l mean_g load[t, l, g]) / sum_l mean_g load[t, l, g]

the extra time the step takes over a perfectly balanced one, in units of the
balanced time (steps without load have none). Reported over the steps with
load: ``mean``, ``p50``, ``p99`` (numpy's linear-interpolation percentiles),
``max``, and ``token_weighted``, the mean weighted by each step's routed
tokens, which is the whole run's extra time: (sum_t sum_l max - sum_t sum_l
mean) / sum_t sum_l mean. The ``aggregate`` figure beside them is what
``place`` reports: the mean over routed layers of the imbalance of the
layer's loads summed over every step. Summing first lets one step's hot GPU
cancel against another step's, so the aggregate figure is never above the
token-weighted per-step one and often far below it.

Dispatch models (``STEP_DISPATCH``): ``even``, ``static`` (one capture:
each expert's tokens assumed spread evenly over the G source ranks) and
``round-robin`` as ``turbospark.placement.dispatch`` defines them, the last
with one kernel call per step; and ``vllm``: vLLM's router, which sends the
token at index i of the step to replica ``hash(i) % r``
(``turbospark.rebalance.vllm_policy.hash_replica``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..placement.dispatch import _slot_order, static_generators, static_layer, static_senders, trtllm_block
from ..placement.dispatch import gpu_loads, replica_counts
from .steps import Steps
from .vllm_policy import hash_replica, logical_to_physical

__all__ = ["STEP_DISPATCH", "LayerDispatch", "StepImbalance", "per_step_imbalance", "step_summary"]

STEP_DISPATCH = ("even", "static", "round-robin", "vllm")


@dataclass(frozen=True)
class StepImbalance:
    """Per step: ``busiest`` (T,) sum over layers of the busiest GPU's load, ``mean`` (T,) sum over layers
    of the mean GPU load; ``layer_loads`` (L, G) the loads summed over steps; ``how`` the steps' origin."""

    busiest: np.ndarray
    mean: np.ndarray
    layer_loads: np.ndarray
    how: str

    @property
    def series(self) -> np.ndarray:
        """(T,) float64 imbalance of each step, NaN for a step without load."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.mean > 0, (self.busiest - self.mean) / np.where(self.mean > 0, self.mean, 1), np.nan)

    def summary(self) -> dict[str, Any]:
        """{"steps", "mean", "p50", "p99", "max", "token_weighted", "aggregate"} (None where no step has load)."""
        out = step_summary(self.series, self.mean)
        top, mean = self.layer_loads.max(axis=1), self.layer_loads.mean(axis=1)
        routed = mean > 0
        out["aggregate"] = (math.fsum(((top[routed] - mean[routed]) / mean[routed]).tolist()) / int(routed.sum())
                            if routed.any() else None)
        return out


def step_summary(series: np.ndarray, weight: np.ndarray) -> dict[str, Any]:
    """The statistics of a per-step ``series`` (NaN: no load) weighted by ``weight`` for the token-weighted mean."""
    loaded = ~np.isnan(series)
    values = series[loaded]
    if not values.size:
        return {"steps": 0, "mean": None, "p50": None, "p99": None, "max": None, "token_weighted": None}
    w = weight[loaded]
    return {"steps": int(values.size), "mean": math.fsum(values.tolist()) / values.size,
            "p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max()),
            "token_weighted": math.fsum((values * w).tolist()) / math.fsum(w.tolist())}


class LayerDispatch:
    """(T, G) loads of one layer's passes under a dispatch model, layers taken in order (static dispatch's
    generators run through the layers as SGLang's do)."""

    def __init__(self, model: str, gpus: int, num_experts: int, slots: int, *, nodes: int = 1,
                 first_layer: int = 0) -> None:
        if model not in STEP_DISPATCH:
            raise ValueError(f"--dispatch must be one of {', '.join(STEP_DISPATCH)}, got {model!r}")
        self.model, self.gpus, self.experts, self.nodes = model, gpus, num_experts, nodes
        self._rngs = static_generators(gpus, num_experts, slots, nodes, first_layer) if model == "static" else None

    #: Passes taken at a time: a piece's int64 temporaries stay a few MB however long the layer is (a whole
    #: 2 M-pass top-8 layer at once made ~800 MB of them).
    PIECE = 1 << 16

    def loads(self, row: np.ndarray, ids: np.ndarray, step: np.ndarray, index: np.ndarray, steps: int) -> np.ndarray:
        """(``steps``, G) float64: tokens each GPU receives in each step from ``ids`` (P, K), the passes of
        the layer whose (S,) map is ``row``; ``step`` and ``index`` (P,) as ``Steps.layer`` gives them."""
        gpus, experts = self.gpus, self.experts
        per_gpu = row.shape[0] // gpus
        ids = np.asarray(ids)
        ids = ids[:, None] if ids.ndim == 1 else ids
        width = ids.shape[1]
        if self.model == "round-robin":
            return self._round_robin(row, ids.astype(np.int64), step, steps)
        pieces = range(0, ids.shape[0], self.PIECE)
        if self.model == "vllm":
            table, replicas = logical_to_physical(row[None, :], experts)
            sent = np.zeros(steps * gpus, dtype=np.int64)
            for lo in pieces:
                flat = ids[lo:lo + self.PIECE].astype(np.int64).ravel()
                replica = hash_replica(np.repeat(index[lo:lo + self.PIECE], width), replicas[0][flat])
                gpu = table[0][flat, replica] // per_gpu
                sent += np.bincount(np.repeat(step[lo:lo + self.PIECE], width) * gpus + gpu, minlength=steps * gpus)
            return sent.reshape(steps, gpus).astype(np.float64)
        counts = np.zeros(steps * experts, dtype=np.int64)
        for lo in pieces:
            counts += np.bincount((step[lo:lo + self.PIECE, None] * experts + ids[lo:lo + self.PIECE]).ravel(),
                                  minlength=steps * experts)
        if self.model == "even":
            return gpu_loads(row[None, :], counts.reshape(steps, 1, experts).astype(np.float64), gpus)[:, 0]
        assert self._rngs is not None
        target = static_layer(row, experts, gpus, self._rngs, self.nodes) // per_gpu  # (G source, E)
        return (counts.reshape(steps, experts) @ static_senders(target, gpus)) / gpus

    def _round_robin(self, row: np.ndarray, ids: np.ndarray, step: np.ndarray, steps: int) -> np.ndarray:
        # One kernel call per step, its passes in recorder order; blocks of 1,024 ids restart each call
        # (turbospark.placement.dispatch's round-robin model, the replica of the n-th id of an expert in
        # block b being (n + b) mod r, source rank 0: one capture).
        gpus, experts, slots = self.gpus, self.experts, row.shape[0]
        order, start = _slot_order(row[None, :], experts)
        order, start = order[0], start[0]
        r = replica_counts(row[None, :], experts)[0]
        width = ids.shape[1]
        by_step = np.argsort(step, kind="stable")
        flat = ids[by_step].reshape(-1)
        call = np.repeat(step[by_step], width)
        block = (np.arange(flat.size) - np.searchsorted(call, call)) // trtllm_block
        key = (call * (flat.size // trtllm_block + 1) + block) * experts + flat
        sort = np.argsort(key, kind="stable")
        first = np.searchsorted(key[sort], key[sort])
        occurrence = np.empty(flat.size, dtype=np.int64)
        occurrence[sort] = np.arange(flat.size) - first
        slot = order[start[flat] + (occurrence + block) % r[flat]]
        return np.bincount(call * gpus + slot // (slots // gpus),
                           minlength=steps * gpus).reshape(steps, gpus).astype(np.float64)


def per_step_imbalance(capture: Any, phy2log: np.ndarray, gpus: int, steps: Steps, model: str = "even", *,
                       nodes: int = 1, first_layer: int = 0, layers: Optional[Sequence[int]] = None) -> StepImbalance:
    """Per-step imbalance of the (L, S) placement ``phy2log`` on ``capture``'s traced passes cut into
    ``steps``, under dispatch ``model`` (one of ``STEP_DISPATCH``); layers read one at a time.

    Raises ``ValueError`` for an unknown model or a map that does not fit the capture."""
    if phy2log.shape[0] != capture.num_layers or phy2log.shape[1] % gpus:
        raise ValueError(f"a map of {phy2log.shape[0]} layers x {phy2log.shape[1]} slots does not fit "
                         f"{capture.num_layers} layers on {gpus} GPUs")
    dispatch = LayerDispatch(model, gpus, capture.num_experts, phy2log.shape[1], nodes=nodes, first_layer=first_layer)
    total = steps.count
    busiest, mean = np.zeros(total), np.zeros(total)
    layer_loads = np.zeros((capture.num_layers, gpus))
    for layer in (range(capture.num_layers) if layers is None else layers):
        step, index = steps.layer(layer)
        loads = dispatch.loads(phy2log[layer], capture.trace[layer], step, index, total)
        busiest += loads.max(axis=1)
        mean += loads.mean(axis=1)
        layer_loads[layer] = loads.sum(axis=0)
    return StepImbalance(busiest, mean, layer_loads, steps.how)
