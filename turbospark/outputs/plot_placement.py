"""``turbospark plot --placement FILE``: per-layer load imbalance of a placement, before and after,
in and out of sample, from the JSON document ``turbospark place`` writes.

Left: over the whole window (the passes the placement was chosen from, and
with ``--fit`` the passes after them). Right: per serving batch (with
``--batch``), averaged. The trivial placement (expert s mod E on slot s) is
the "before". The y axis is symmetric-log: a placement takes imbalance from
around 1 down to 1e-3 or below, and a linear axis would flatten the "after".
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..capture.reader import _shown
from .plot import _integer_ticks, agg_figure

__all__ = ["plot_placement", "read_document"]

_SERIES = (("before", "in_sample", "trivial, in sample", "tab:grey", "--o"),
           ("after", "in_sample", "placed, in sample", "tab:blue", "-o"),
           ("before", "out_of_sample", "trivial, out of sample", "tab:orange", "--s"),
           ("after", "out_of_sample", "placed, out of sample", "tab:red", "-s"))


# What the figure's heading reads from the document's inputs.
_HEADING_KEYS = ("num_layers", "num_experts", "slots", "gpus")


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a placement document; raises ``OSError``, or ``ValueError`` when it is not one
    (SGLang's and TensorRT-LLM's files hold no imbalance figures)."""
    with open(path, encoding="utf-8") as handle:
        try:
            doc = json.load(handle)
        except ValueError as exc:
            raise ValueError(f"not turbospark's placement JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list) or "inputs" not in doc:
        raise ValueError("not turbospark's placement JSON (write it with `turbospark place --format json`)")
    inputs = doc["inputs"]
    if not isinstance(inputs, dict):
        raise ValueError(f"the placement's inputs must be an object, got {_shown(inputs)}")
    missing = [key for key in _HEADING_KEYS if key not in inputs]
    if missing:
        raise ValueError(f"the placement's inputs lack {', '.join(missing)} (write it with "
                         "`turbospark place --format json`)")
    return doc


def plot_placement(doc: dict[str, Any], path: str | os.PathLike[str], *, title: str | None = None) -> None:
    """Draw the placement document ``doc`` into the image file ``path``.

    Raises ``MissingMatplotlib`` without matplotlib and ``OSError`` when ``path`` cannot be written.
    """
    figure = agg_figure((13, 5.5), 110)
    left, right = figure.subplots(1, 2, sharey=True)
    layers = doc["layers"]
    _panel(left, layers, "", "whole window: imbalance (max - mean) / mean of GPU loads")
    inputs = doc["inputs"]
    if inputs.get("batch"):
        _panel(right, layers, "batch_", f"per batch of {inputs['batch']} ({inputs['batches']}), mean over batches")
    else:
        right.set_title("per serving batch", fontsize=10)
        _empty(right, "no --batch in this placement")
    heading = (f"{inputs['num_layers']} layers x {inputs['num_experts']} experts on {inputs['slots']} slots, "
               f"{inputs['gpus']} GPUs" + (f", fit on the first {inputs['fit']:g} of passes" if inputs.get("fit") else ""))
    figure.suptitle(f"{title}: {heading}" if title else heading, fontsize=12)
    figure.savefig(path)


def _panel(axes: Any, layers: list[dict[str, Any]], prefix: str, heading: str) -> None:
    axes.set_title(heading, fontsize=10)
    axes.set_xlabel("layer")
    axes.set_ylabel("imbalance (0 = every GPU equal)")
    x = np.array([row["layer"] for row in layers])
    drawn = False
    for side, kind, label, colour, style in _SERIES:
        values = np.array([_imbalance(row[side][prefix + kind]) for row in layers], dtype=np.float64)
        if np.isnan(values).all():
            continue
        mean = np.nanmean(values)
        axes.plot(x, values, style, color=colour, markersize=4, label=f"{label} (mean {mean:.3g})")
        drawn = True
    if not drawn:
        _empty(axes, "no values (no layer has load)")
        return
    axes.set_yscale("symlog", linthresh=1e-3)
    axes.set_ylim(0, None)
    _integer_ticks(axes.xaxis, len(layers))
    axes.grid(alpha=0.3)
    # The band between "before" (around 1) and "after" (far below) is where nothing is drawn.
    axes.legend(fontsize=8, loc="center")


def _imbalance(entry: Any) -> float:
    if entry is None or entry.get("imbalance") is None:
        return np.nan
    return float(entry["imbalance"])


def _empty(axes: Any, text: str) -> None:
    # Not plot._note: clearing this panel's ticks would clear the shared y axis of the other.
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="grey")
    axes.set_axis_off()
