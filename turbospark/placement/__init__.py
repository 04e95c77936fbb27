"""Expert placement for expert parallelism, from a capture's counts.

``place(counts, gpus, slots, nodes, groups)`` puts the E logical experts of
each layer onto S >= E physical slots (S - E replicas of the experts with
the most load per replica), S / G consecutive slots per GPU. It runs
DeepSeek's EPLB greedy (replication, balanced packing, hierarchical by node
when ``groups`` is given) and then refines it by slot swaps between GPUs,
keeping per layer whichever of the two has the lower busiest-GPU load under
the chosen dispatch model (``turbospark.placement.dispatch``: even, static or
round-robin): never worse than the published algorithm under that model,
better where its greedy leaves room. For static dispatch two more candidates
join (without groups): replica counts that divide G on distinct GPUs
(``_static``), as packed and as refined, and the chosen map is improved by
slot swaps scored exactly under static dispatch; each source rank's random
generator runs through the layers (SGLang draws on every rank), so there the
choice runs layer by layer and the guarantee (against the published map and
the even-optimised one, both under static) is on the mean imbalance over layers.

``turbospark.placement.document`` evaluates a placement in and out of
sample; ``turbospark.placement.formats`` writes what SGLang and
TensorRT-LLM read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ._greedy import eplb
from ._refine import refine
from ._static import divisor_placement, static_search
from .dispatch import (DISPATCH, Routing, gpu_loads, imbalance, known_loads, replica_counts, routing, source_counts,
                       static_generators, static_layer_loads, trivial_map)

__all__ = ["DISPATCH", "Placement", "Routing", "check_geometry", "place", "routing", "trivial_map"]


@dataclass(frozen=True, eq=False)
class Placement:
    """A placement: ``phy2log`` (L, S) expert per slot (GPU g holds slots
    g*S/G .. (g+1)*S/G - 1), ``replicas`` (L, E) slots per expert, ``greedy``
    the published algorithm's map for the same inputs, and the settings. Layers
    without load get the trivial map (slot s holds expert s mod E)
    (``dispatch``: the model the per-layer choice was made under)."""

    phy2log: np.ndarray
    replicas: np.ndarray
    greedy: np.ndarray
    gpus: int
    nodes: int
    groups: Optional[int]
    dispatch: str = "even"


def check_geometry(num_experts: int, gpus: int, slots: Optional[int], nodes: int,
                   groups: Optional[int]) -> int:
    """Validate the settings for E experts; returns S (``slots`` or E).

    Raises ``ValueError`` naming the offending value: S < E, S not divisible
    by G, G not divisible by N, E not divisible by X, X not divisible by N,
    or a count below 1.
    """
    for name, value in (("gpus", gpus), ("nodes", nodes), ("groups", groups), ("slots", slots)):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"--{name} must be a positive integer, got {value!r}")
    if num_experts < 1:
        raise ValueError("the capture has no experts to place")
    if slots is not None and slots < num_experts:
        raise ValueError(f"--slots {slots} is fewer than the {num_experts} experts: every expert needs a slot")
    if (slots or num_experts) % gpus:
        named = f"--slots {slots}" if slots else f"the default {num_experts} slots (one per expert)"
        raise ValueError(f"{named} not divisible by --gpus {gpus}")
    slots = slots or num_experts
    if gpus % nodes:
        raise ValueError(f"--gpus {gpus} is not divisible by --nodes {nodes}")
    if groups is not None:
        if num_experts % groups:
            raise ValueError(f"the {num_experts} experts do not split into --groups {groups}")
        if groups % nodes:
            raise ValueError(f"--groups {groups} is not divisible by --nodes {nodes}")
    return slots


def place(counts: np.ndarray, gpus: int, slots: Optional[int] = None, nodes: int = 1,
          groups: Optional[int] = None, dispatch: str = "even", flow: Optional[Routing] = None,
          assume_even: bool = False, first_layer: int = 0) -> Placement:
    """Place each layer's experts for the (L, E) non-negative ``counts``.

    ``gpus`` G, ``slots`` S (default E; S - E replicas), ``nodes`` N and
    ``groups`` X: with groups, X consecutive expert groups are packed onto
    nodes and all replicas of a group's experts stay on its node; without,
    the placement is global (nodes then only have to divide G).
    ``dispatch`` (one of ``DISPATCH``) is the model each layer's busiest GPU
    is judged under; ``flow`` the per-source-rank routing behind ``counts``
    (default: ``counts`` as one unknown source); ``static`` without measured
    ranks needs ``assume_even`` (tokens spread evenly over the G ranks);
    static dispatch also depends on ``nodes`` (a rank prefers a same-node
    replica) and ``first_layer`` (the dense layers before MoE layer 0, whose
    trivial rows SGLang's generators run through first). Returns a ``Placement``; raises ``ValueError`` for invalid settings or counts.
    """
    if dispatch not in DISPATCH:
        raise ValueError(f"--dispatch must be one of {', '.join(DISPATCH)}, got {dispatch!r}")
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.dtype.kind not in "iuf" or (counts.size and counts.min() < 0):
        raise ValueError("counts must be a 2-D array of non-negative numbers (layers x experts)")
    layers, experts = counts.shape
    slots = check_geometry(experts, gpus, slots, nodes, groups)
    if layers == 0:
        raise ValueError("the capture has no layers to place")
    hierarchical = groups is not None
    greedy, _ = eplb(counts, slots, groups if hierarchical else 1, nodes if hierarchical else 1, gpus)
    weight = counts.astype(np.float64)
    refined = refine(greedy, weight, gpus, nodes if hierarchical else 1)
    flow = routing([counts]) if flow is None else flow
    if dispatch == "static" and not flow.measured and not assume_even:
        raise ValueError("--dispatch static needs per-source-rank counts (one capture per rank) "
                         "or the even-spread assumption (assume_even=True)")
    # A layer without load gets the trivial placement, the one an engine starts from.
    idle = counts.sum(axis=1) == 0
    refined[idle] = trivial_map(int(idle.sum()), experts, slots)
    published = greedy.copy()
    published[idle] = refined[idle]
    if dispatch == "static":
        shaped = []
        if not hierarchical:  # the divisor shape is global: it would break node groups
            shaped = [divisor_placement(weight, slots, gpus)]
            shaped.append(refine(shaped[0], weight, gpus, 1))
            for m in shaped:
                m[idle] = refined[idle]
        phy2log = _static_choice([refined, published, *shaped], flow, gpus, nodes, first_layer)
    else:
        scores = [known_loads(dispatch, m, flow, gpus).max(axis=1) for m in (refined, published)]
        phy2log = np.where((scores[0] <= scores[1])[:, None], refined, published)
    return Placement(phy2log, replica_counts(phy2log, experts), greedy, gpus, nodes, groups, dispatch)


def _static_choice(candidates: list[np.ndarray], flow: Routing, gpus: int, nodes: int,
                   first_layer: int) -> np.ndarray:
    """Under static dispatch each source rank's generator runs through the layers, so a layer's
    draws depend on the maps before it: choose layer by layer among ``candidates`` (the refined
    map, the published one, then any others) whichever has the lightest busiest GPU from the
    generator states the earlier choices leave (the first on ties), improve it by exactly scored
    swaps (``static_search``), then keep whichever of that map, the even-optimised one and the
    published one has the lowest mean imbalance."""
    refined, published = candidates[0], candidates[1]
    sent = source_counts(flow, gpus)
    rngs = static_generators(gpus, sent.shape[-1], published.shape[1], nodes, first_layer)
    chosen = published.copy()
    for layer in range(published.shape[0]):
        states = [rng.getstate() for rng in rngs]
        tried = []
        for m in candidates:
            for rng, state in zip(rngs, states):
                rng.setstate(state)
            tried.append(static_layer_loads(m[layer], sent[:, layer], gpus, rngs, nodes).max())
        pick = min(range(len(candidates)), key=lambda i: (tried[i], i))
        for rng, state in zip(rngs, states):
            rng.setstate(state)
        chosen[layer] = static_search(candidates[pick][layer], sent[:, layer], gpus, rngs, nodes)
    even_scores = [gpu_loads(m, flow.total, gpus).max(axis=1) for m in (refined, published)]
    even_optimised = np.where((even_scores[0] <= even_scores[1])[:, None], refined, published)
    finalists = (chosen, even_optimised, published)
    means = [_mean_imbalance(known_loads("static", m, flow, gpus, True, nodes=nodes, first_layer=first_layer))
             for m in finalists]
    return finalists[int(np.argmin(means))]


def _mean_imbalance(loads: np.ndarray) -> float:
    """Mean over the loaded layers of (max - mean) / mean (0 when none has load)."""
    values = imbalance(loads)[0]
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else 0.0
