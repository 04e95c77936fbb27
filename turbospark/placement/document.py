"""turbospark's placement document: inputs, map, replica counts and per-layer imbalance
before (the trivial placement) and after, in sample and out of sample, whole window and per batch.

Layout::

    {"inputs": {"capture", "num_layers", "num_experts", "top_k", "gpus", "slots",
                "nodes", "groups", "fit", "batch", "batches"},
     "physical_to_logical_map": [[S ints] x L], "replica_counts": [[E ints] x L],
     "layers": [{"layer", "fit_passes", "test_passes", "split", "published_max_load",
                 "before": EVAL, "after": EVAL}],
     "summary": {"routed_layers", "before": MEANS, "after": MEANS}}

EVAL = {"in_sample": STATS, "out_of_sample": STATS or null,
"batch_in_sample": BATCH or null, "batch_out_of_sample": BATCH or null};
STATS = {"imbalance", "balancedness", "max_load", "mean_load"}; BATCH =
{"imbalance": mean over the batches with load, "batches": how many}; MEANS:
the mean of each imbalance over the routed layers (those with counts), null
when no layer has a value. ``published_max_load``: the in-sample busiest-GPU
load of DeepSeek's published greedy on the same inputs, for comparison.
``split``: with ``--fit``, how the layer's passes were split ("sequences":
whole sequences, in order of first appearance; "passes": by position; see
``turbospark.placement.samples``), else null.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Optional, Union

import numpy as np

from ..analysis.capture_sequences import Sequences, split_unit
from ..analysis.capture import Capture
from . import Placement, place
from .evaluate import gpu_loads, imbalance, layer_stats, trivial_map
from .samples import Split, batch_counts, split, window_sequences

__all__ = ["build", "summary_lines"]

_KINDS = ("in_sample", "out_of_sample", "batch_in_sample", "batch_out_of_sample")


def build(capture: Capture, *, gpus: int, slots: Optional[int] = None, nodes: int = 1,
          groups: Optional[int] = None, fit: Optional[Union[float, Fraction]] = None, batch: Optional[int] = None,
          seqs: Optional[Sequences] = None, source: Optional[str] = None) -> tuple[dict[str, Any], Placement]:
    """Place ``capture``'s experts and evaluate the result; returns (document, placement).

    ``fit`` (0 < F < 1) and ``batch`` (B >= 1) need the trace; ``seqs`` is the
    capture's (seq, phase) or None; ``source`` names the capture in the
    inputs. Raises ``ValueError`` naming the problem for invalid settings.
    """
    if batch is not None and (type(batch) is not int or batch < 1):
        raise ValueError(f"--batch must be a positive integer, got {batch!r}")
    if batch is not None and capture.trace is None:
        raise ValueError("--batch needs the capture's trace (record with trace=True): "
                         "counts alone do not say which passes were served together")
    parts = split(capture, fit)
    placement = place(parts.fit, gpus, slots, nodes, groups)
    before = trivial_map(capture.num_layers, capture.num_experts, placement.phy2log.shape[1])
    evals = {"before": _evaluate(capture, parts, before, gpus, batch, seqs),
             "after": _evaluate(capture, parts, placement.phy2log, gpus, batch, seqs)}
    published = gpu_loads(placement.greedy, parts.fit.astype(np.float64), gpus).max(axis=1)
    layers = []
    for layer in range(capture.num_layers):
        layers.append({
            "layer": layer,
            "fit_passes": None if parts.fit_passes is None else parts.fit_passes[layer],
            "test_passes": None if parts.test_passes is None else parts.test_passes[layer],
            "split": None if parts.kinds is None else parts.kinds[layer],
            "published_max_load": float(published[layer]),
            "before": evals["before"][layer],
            "after": evals["after"][layer],
        })
    routed = [row for row, total in zip(layers, capture.totals.tolist()) if total > 0]
    doc = {
        "inputs": {
            "capture": source, **capture.header, "gpus": gpus, "slots": placement.phy2log.shape[1],
            "nodes": nodes, "groups": groups, "fit": None if fit is None else float(fit), "batch": batch,
            "batches": None if batch is None else ("concurrent sequences" if seqs is not None
                                                   else "consecutive passes"),
        },
        "physical_to_logical_map": placement.phy2log.tolist(),
        "replica_counts": placement.replicas.tolist(),
        "layers": layers,
        "summary": {
            "routed_layers": len(routed),
            "before": _means(routed, "before"),
            "after": _means(routed, "after"),
        },
    }
    return doc, placement


def evaluate_map(capture: Capture, phy2log: np.ndarray, gpus: int) -> list[dict[str, Any]]:
    """Per-layer STATS of an (L, S) map on the capture's whole counts."""
    return layer_stats(gpu_loads(phy2log, capture.counts.astype(np.float64), gpus))


def _evaluate(capture: Capture, parts: Split, phy2log: np.ndarray, gpus: int,
              batch: Optional[int], seqs: Optional[Sequences]) -> list[dict[str, Any]]:
    inside = layer_stats(gpu_loads(phy2log, parts.fit.astype(np.float64), gpus))
    outside = (None if parts.test is None
               else layer_stats(gpu_loads(phy2log, parts.test.astype(np.float64), gpus)))
    rows = []
    for layer in range(capture.num_layers):
        row: dict[str, Any] = {"in_sample": inside[layer],
                               "out_of_sample": None if outside is None else outside[layer],
                               "batch_in_sample": None, "batch_out_of_sample": None}
        if batch is not None and capture.trace is not None:
            ids = capture.trace[layer]
            windows: dict[str, Any] = {"batch_in_sample": slice(None)}
            if parts.fit_masks is not None:
                mask = parts.fit_masks[layer]
                windows = {"batch_in_sample": mask, "batch_out_of_sample": ~mask}
            for key, which in windows.items():
                counts = batch_counts(ids[which], capture.num_experts, batch,
                                      window_sequences(seqs, layer, which))
                row[key] = _batch_mean(phy2log[layer], counts, gpus)
        rows.append(row)
    return rows


def _batch_mean(layer_map: np.ndarray, counts: np.ndarray, gpus: int) -> dict[str, Any]:
    loads = gpu_loads(layer_map[None, :], counts[:, None, :].astype(np.float64), gpus)[:, 0]
    values = imbalance(loads)[0]
    values = values[~np.isnan(values)]
    return {"imbalance": math.fsum(values.tolist()) / values.size if values.size else None,
            "batches": int(values.size)}


def _means(rows: list[dict[str, Any]], side: str) -> dict[str, Optional[float]]:
    means: dict[str, Optional[float]] = {}
    for kind in _KINDS:
        values = [row[side][kind]["imbalance"] for row in rows if row[side][kind] is not None]
        values = [v for v in values if v is not None]
        means[kind] = math.fsum(values) / len(values) if values else None
    return means


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """A few lines for the terminal: mean imbalance before and after, per kind present."""
    inputs, summary = doc["inputs"], doc["summary"]
    lines = [f"placement: {inputs['num_layers']} layers x {inputs['num_experts']} experts on "
             f"{inputs['slots']} slots, {inputs['gpus']} GPUs"
             + (f", {inputs['groups']} groups on {inputs['nodes']} nodes" if inputs["groups"] else "")
             + f"; mean imbalance (max - mean) / mean over {summary['routed_layers']} routed layers:"]
    unit = split_unit([row["split"] for row in doc["layers"] if row["split"] is not None])
    labels = {"in_sample": "in sample" + (f" (first {inputs['fit']:g} of {unit})" if inputs["fit"] else ""),
              "out_of_sample": "out of sample (the remaining " + ("sequences)" if unit != "passes" else "passes)"),
              "batch_in_sample": f"per batch of {inputs['batch']} ({inputs['batches']}), in sample",
              "batch_out_of_sample": f"per batch of {inputs['batch']}, out of sample"}
    for kind, label in labels.items():
        before, after = summary["before"][kind], summary["after"][kind]
        if before is None and after is None:
            continue
        lines.append(f"  {label}: {_fmt(before)} trivial -> {_fmt(after)} placed")
    return lines


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"
