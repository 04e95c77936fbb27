"""Expert placement for expert parallelism, from a capture's counts.

``place(counts, gpus, slots, nodes, groups)`` puts the E logical experts of
each layer onto S >= E physical slots (S - E replicas of the experts with
the most load per replica), S / G consecutive slots per GPU. It runs
DeepSeek's EPLB greedy (replication, balanced packing, hierarchical by node
when ``groups`` is given) and then refines it by slot swaps between GPUs,
keeping per layer whichever of the two has the lower busiest-GPU load: never
worse than the published algorithm, better where its greedy leaves room.

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
from .evaluate import gpu_loads, replica_counts, trivial_map

__all__ = ["Placement", "check_geometry", "place", "trivial_map"]


@dataclass(frozen=True, eq=False)
class Placement:
    """A placement: ``phy2log`` (L, S) expert per slot (GPU g holds slots
    g*S/G .. (g+1)*S/G - 1), ``replicas`` (L, E) slots per expert, ``greedy``
    the published algorithm's map for the same inputs, and the settings."""

    phy2log: np.ndarray
    replicas: np.ndarray
    greedy: np.ndarray
    gpus: int
    nodes: int
    groups: Optional[int]


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
          groups: Optional[int] = None) -> Placement:
    """Place each layer's experts for the (L, E) non-negative ``counts``.

    ``gpus`` G, ``slots`` S (default E; S - E replicas), ``nodes`` N and
    ``groups`` X: with groups, X consecutive expert groups are packed onto
    nodes and all replicas of a group's experts stay on its node; without,
    the placement is global (nodes then only have to divide G). Returns a
    ``Placement``; raises ``ValueError`` for invalid settings or counts.
    """
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
    better = gpu_loads(refined, weight, gpus).max(axis=1) <= gpu_loads(greedy, weight, gpus).max(axis=1)
    phy2log = np.where(better[:, None], refined, greedy)
    return Placement(phy2log, replica_counts(phy2log, experts), greedy, gpus, nodes, groups)
