"""``turbospark plot --cache FILE``: hit rate against cache size per policy, Belady's optimum as the ceiling,
from the JSON document ``turbospark cache --json`` writes.

Left: model-wide hit rate (mean over routed layers) against C for every
policy; Belady's curve is drawn as the ceiling of the demand policies, with
the region above it shaded (no demand policy reaches it; prefetch policies
can, by loading more). Right: what crosses the bus per token, bytes when the
document has them (``--expert-bytes``), demand misses otherwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .plot import agg_figure

__all__ = ["plot_cache", "read_cache_document"]

_STYLE = {"lru": ("tab:blue", "-o"), "lfu": ("tab:green", "-s"), "belady": ("black", "--"),
          "pilot+lru": ("tab:red", "-^"), "pilot+lfu": ("tab:purple", "-v")}


def read_cache_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a ``turbospark cache --json`` document; raises ``OSError``, or ``ValueError`` when it is not one."""
    with open(path, encoding="utf-8") as handle:
        try:
            doc = json.load(handle)
        except ValueError as exc:
            raise ValueError(f"not turbospark's cache JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict) or "slots" not in doc \
            or "policies" not in doc:
        raise ValueError("not turbospark's cache JSON (write it with `turbospark cache CAPTURE --json`)")
    return doc


def plot_cache(doc: dict[str, Any], path: str | os.PathLike[str], *, title: str | None = None) -> None:
    """Draw the cache document ``doc`` into the image file ``path``.

    Raises ``MissingMatplotlib`` without matplotlib and ``OSError`` when ``path`` cannot be written.
    """
    figure = agg_figure((13, 5.5), 110)
    left, right = figure.subplots(1, 2)
    model, slots = doc["model"], doc["slots"]
    _curves(left, slots, doc["policies"], model["hit_rate"], 100.0)
    ceiling = (model["hit_rate"] or {}).get("belady")
    if ceiling is not None:
        left.fill_between(slots, [100 * v for v in ceiling], 100, color="grey", alpha=0.12,
                          label="beyond any demand policy")
    left.set_ylim(0, 100)
    left.set_ylabel("hit rate, mean over routed layers (%)")
    left.set_title("hit rate against cache size (belady: the demand optimum)", fontsize=10)
    if model.get("bytes_per_token") is not None:
        _curves(right, slots, doc["policies"], model["bytes_per_token"], 1 / 2**20)
        right.set_ylabel("MiB loaded per token, all routed layers")
        right.set_title(f"bytes per token ({doc['expert_bytes']} bytes per expert; prefetch counted)", fontsize=10)
    else:
        _curves(right, slots, doc["policies"], model["misses_per_token"], 1.0)
        right.set_ylabel("demand misses per token, all routed layers")
        right.set_title("misses per token (add --expert-bytes for bytes)", fontsize=10)
    right.set_ylim(0, None)
    for axes in (left, right):
        axes.set_xlabel("cache slots per layer (C)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    if doc["shared"]:
        streams = "shared by all sequences"
    elif max((entry.get("streams", 0) for entry in doc.get("layers", [])), default=0) > 1:
        streams = "one per sequence"
    else:
        streams = "over the whole trace"
    heading = (f"{doc['num_layers']} layers x {doc['num_experts']} experts, top_k {doc['top_k']}, "
               f"a cache per layer, {streams}")
    figure.suptitle(f"{title}: {heading}" if title else heading, fontsize=12)
    figure.savefig(path)


def _curves(axes: Any, slots: list[int], names: list[str], values: dict[str, Any], scale: float) -> None:
    for name in names:
        row = values.get(name)
        if row is None:
            continue
        colour, style = _STYLE.get(name, ("tab:grey", "-"))
        axes.plot(slots, [float("nan") if v is None else v * scale for v in row], style, color=colour,
                  markersize=4, label=name)
