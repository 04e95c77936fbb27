"""How evenly a placement spreads a layer's tokens over GPUs.

Definitions (docs/placement.md states them too): a placement maps the S physical
slots of a layer to logical experts, S / G consecutive slots per GPU. A
token routed to an expert with r replicas puts 1/r of a token on each
replica; a GPU's load is the sum over its slots. Per layer,
``imbalance = (max - mean) / mean`` and ``balancedness = mean / max`` over
the G GPU loads, both None (JSON null) when the layer has no load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gpu_loads", "layer_stats", "replica_counts", "trivial_map"]


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
