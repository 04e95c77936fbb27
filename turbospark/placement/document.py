"""turbospark's placement document: inputs, map, replica counts and per-layer imbalance
before (the trivial placement) and after, in sample and out of sample, whole window and per batch.

Layout::

    {"inputs": {"capture", "num_layers", "num_experts", "top_k", "gpus", "slots",
                "nodes", "groups", "fit", "batch", "batches"},
     "physical_to_logical_map": [[S ints] x L], "replica_counts": [[E ints] x L],
     "dispatch": {"model", "source_ranks", "static", "why", "round_robin"},
     "layers": [{"layer", "fit_passes", "test_passes", "split", "published_max_load",
                 "before": EVAL, "after": EVAL, "imbalance": BY_MODEL, "trivial_imbalance": BY_MODEL}],
     "summary": {"routed_layers", "before": MEANS, "after": MEANS,
                 "imbalance": BY_MODEL, "trivial_imbalance": BY_MODEL}}

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

BY_MODEL = {"even", "static", "round-robin"}: the in-sample imbalance under
each dispatch model of ``turbospark.placement.dispatch`` (per layer; in the
summary, the mean over routed layers). ``static`` is null when the
per-source-rank loads are unknown (one capture and no ``--dispatch static``);
``dispatch.why`` then says so and how to give them. ``dispatch.model`` is the
model the placement was optimised for, ``dispatch.static`` how the source
ranks' loads were obtained (measured or assumed), ``dispatch.source_ranks``
the number of per-rank captures (1: one capture), ``dispatch.round_robin``
how round-robin's kernel calls were taken (a layer's passes as one call,
or with ``--batch`` one call per serving step). ``before`` and ``after``
are the even model.

``inputs.capture`` is the list of files when several per-rank captures were given.

With ``--from`` (a current placement): ``inputs`` adds ``from``,
``max_moves`` (null: unbounded) and ``expert_bytes``; each layer adds
``moved_slots`` (slots whose expert changes), ``moved_bytes`` (times
``expert_bytes``, else null) and ``current_imbalance`` (BY_MODEL of the
current placement); ``summary`` adds the totals ``moved_slots`` and
``moved_bytes`` and the mean ``current_imbalance``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any, Optional, Union

import numpy as np

from ..capture.sequences import Sequences, split_unit
from ..capture.reader import Capture
from ..capture.rows import layer_breaks
from . import Placement, place
from .dispatch import (DISPATCH, STATIC_ASSUMED, STATIC_MEASURED, STATIC_UNKNOWN, LayerIds, Routing, dispatch_loads,
                       gpu_loads, imbalance, layer_stats, replica_counts, round_robin_note, routing, trivial_map)
from .migrate import align, moved_slots, rebalance
from .samples import Split, batch_counts, serving_steps, split, window_breaks, window_sequences

__all__ = ["build", "summary_lines"]

_KINDS = ("in_sample", "out_of_sample", "batch_in_sample", "batch_out_of_sample")


def build(capture: Capture, *, gpus: int, slots: Optional[int] = None, nodes: int = 1,
          groups: Optional[int] = None, fit: Optional[Union[float, Fraction]] = None, batch: Optional[int] = None,
          seqs: Optional[Sequences] = None, source: Optional[str] = None, dispatch: str = "even",
          flow: Optional[Routing] = None, current: Optional[np.ndarray] = None,
          max_moves: Optional[int] = None, expert_bytes: Optional[int] = None,
          current_source: Optional[str] = None, first_layer: int = 0) -> tuple[dict[str, Any], Placement]:
    """Place ``capture``'s experts and evaluate the result; returns (document, placement).

    ``fit`` (0 < F < 1) and ``batch`` (B >= 1) need the trace; ``seqs`` is the
    capture's (seq, phase) or None; ``source`` names the capture in the
    inputs. ``dispatch`` is the model to optimise for; ``flow`` the per-rank
    routing when ``capture`` sums several per-rank captures (then no ``fit``
    or ``batch``). ``current``: the (L, S) placement served now (named
    ``current_source``): the result is the best reachable from it moving at
    most ``max_moves`` slots per layer (None: unbounded; see
    ``turbospark.placement.migrate``), ``expert_bytes`` the bytes of one
    expert's weights. Raises ``ValueError`` naming the problem for invalid settings.
    """
    if current is None and (max_moves is not None or expert_bytes is not None):
        raise ValueError("--max-moves and --expert-bytes need --from CURRENT_PLACEMENT")
    if current is not None and slots is not None and current.shape[1] != slots:
        raise ValueError(f"--slots {slots} but the current placement has {current.shape[1]} slots per layer")
    if max_moves is not None and (type(max_moves) is not int or max_moves < 0):
        raise ValueError(f"--max-moves must be 0 or more, got {max_moves!r}")
    if expert_bytes is not None and (type(expert_bytes) is not int or expert_bytes < 1):
        raise ValueError(f"--expert-bytes must be a positive integer, got {expert_bytes!r}")
    if flow is not None and (fit is not None or batch is not None):
        raise ValueError("--fit and --batch take one capture, not several per-rank captures")
    if batch is not None and (type(batch) is not int or batch < 1):
        raise ValueError(f"--batch must be a positive integer, got {batch!r}")
    if batch is not None and capture.trace is None:
        raise ValueError("--batch needs the capture's trace (record with trace=True): "
                         "counts alone do not say which passes were served together")
    parts = split(capture, fit)
    flow = _fit_flow(capture, parts, batch, seqs) if flow is None else flow
    assume = dispatch == "static" and not flow.measured
    placement = place(parts.fit, gpus, slots if current is None else current.shape[1], nodes, groups,
                      dispatch, flow, assume, first_layer)
    if current is not None:
        target = align(placement.phy2log, current, gpus, permute=dispatch == "even")
        moved = rebalance(current, parts.fit, gpus, max_moves, target)
        placement = replace(placement, phy2log=moved, replicas=replica_counts(moved, capture.num_experts))
    before = trivial_map(capture.num_layers, capture.num_experts, placement.phy2log.shape[1])
    evals = {"before": _evaluate(capture, parts, before, gpus, batch, seqs),
             "after": _evaluate(capture, parts, placement.phy2log, gpus, batch, seqs)}
    where = {"nodes": nodes, "first_layer": first_layer}
    by_model = {"after": by_dispatch(placement.phy2log, flow, gpus, assume, **where),
                "before": by_dispatch(before, flow, gpus, assume, **where)}
    if current is not None:
        by_model["current"] = by_dispatch(current, flow, gpus, assume, **where)
        moves = moved_slots(placement.phy2log, current)
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
            "imbalance": by_model["after"][layer],
            "trivial_imbalance": by_model["before"][layer],
        })
        if current is not None:
            count = int(moves[layer])
            layers[-1].update({"moved_slots": count,
                               "moved_bytes": None if expert_bytes is None else count * expert_bytes,
                               "current_imbalance": by_model["current"][layer]})
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
        "dispatch": dispatch_inputs(dispatch, flow, gpus, assume, batch_hint=True),
        "layers": layers,
        "summary": {
            "routed_layers": len(routed),
            "before": _means(routed, "before"),
            "after": _means(routed, "after"),
            "imbalance": model_means(routed, "imbalance"),
            "trivial_imbalance": model_means(routed, "trivial_imbalance"),
        },
    }
    if current is not None:
        total = int(moves.sum())
        doc["inputs"].update({"from": current_source, "max_moves": max_moves, "expert_bytes": expert_bytes})
        doc["summary"].update({"moved_slots": total, "moved_bytes": None if expert_bytes is None else total * expert_bytes,
                               "current_imbalance": model_means(routed, "current_imbalance")})
    return doc, placement


def _fit_flow(capture: Capture, parts: Split, batch: Optional[int] = None,
              seqs: Optional[Sequences] = None) -> Routing:
    """The in-sample routing of one capture: its fit counts and, with a trace, the fit passes;
    with ``batch``, each fit pass's serving step (round-robin runs one kernel call per step)."""
    if capture.trace is None:
        return routing([parts.fit])
    windows: list[Union[slice, np.ndarray]] = ([slice(None)] * capture.num_layers if parts.fit_masks is None
                                               else list(parts.fit_masks))
    # A streamed capture's gaps, as positions in each layer's fit passes: no call or step joins rows across one.
    cuts = [window_breaks(layer_breaks(capture, layer), which) for layer, which in enumerate(windows)]
    if batch is None:
        return routing([parts.fit], [capture.trace if parts.fit_masks is None
                                     else LayerIds(capture.trace, parts.fit_masks)], breaks=[cuts])
    trace = [ids[which] for ids, which in zip(capture.trace, windows)]
    steps = [serving_steps(ids.shape[0], batch, window_sequences(seqs, layer, which), cuts[layer])
             for layer, (ids, which) in enumerate(zip(trace, windows))]
    kind = "concurrent sequences" if seqs is not None else "consecutive passes"
    return routing([parts.fit], [trace], [steps], f"--batch {batch}, {kind}")


def by_dispatch(phy2log: np.ndarray, flow: Routing, gpus: int, assume_even: bool, *, nodes: int = 1,
                first_layer: int = 0) -> list[dict[str, Optional[float]]]:
    """Per layer, {model: imbalance} under each of ``DISPATCH`` (None: no load, or static unknown);
    ``nodes`` and ``first_layer`` as ``dispatch_loads`` takes them."""
    values = {}
    for model in DISPATCH:
        loads = dispatch_loads(model, phy2log, flow, gpus, assume_even, nodes=nodes, first_layer=first_layer)
        values[model] = [None] * phy2log.shape[0] if loads is None else [
            None if v != v else v for v in imbalance(loads)[0].tolist()]
    return [{model: values[model][layer] for model in DISPATCH} for layer in range(phy2log.shape[0])]


def dispatch_inputs(model: str, flow: Routing, gpus: int, assume_even: bool, batch_hint: bool = False) -> dict[str, Any]:
    """The document's ``dispatch`` object: the model, the source ranks, how static loads were known
    and how round-robin's kernel calls were taken (``batch_hint``: the command takes ``--batch``)."""
    if flow.measured:
        static: Optional[str] = STATIC_MEASURED.format(ranks=flow.counts.shape[0])
    else:
        static = STATIC_ASSUMED.format(gpus=gpus) if assume_even else None
    return {"model": model, "source_ranks": int(flow.counts.shape[0]), "static": static,
            "why": None if static is not None else STATIC_UNKNOWN, "round_robin": round_robin_note(flow, batch_hint)}


def model_means(rows: list[dict[str, Any]], key: str) -> dict[str, Optional[float]]:
    """Mean over ``rows`` of each model's value in ``row[key]`` (None where no row has one)."""
    out: dict[str, Optional[float]] = {}
    for model in DISPATCH:
        values = [row[key][model] for row in rows if row[key][model] is not None]
        out[model] = math.fsum(values) / len(values) if values else None
    return out


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
            breaks = layer_breaks(capture, layer)
            for key, which in windows.items():
                counts = batch_counts(ids[which], capture.num_experts, batch,
                                      window_sequences(seqs, layer, which), window_breaks(breaks, which))
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
    lines += dispatch_lines(doc["dispatch"], summary["trivial_imbalance"], summary["imbalance"],
                            f"trivial -> placed; optimised for {doc['dispatch']['model']}")
    if "moved_slots" in summary:
        limit = "unbounded" if inputs["max_moves"] is None else f"at most {inputs['max_moves']} per layer"
        moved = f"{summary['moved_slots']} slots moved ({limit})"
        if summary["moved_bytes"] is not None:
            moved += f", {summary['moved_bytes']} bytes of expert weights"
        cells = [f"{m} {_fmt(summary['current_imbalance'][m])} -> {_fmt(summary['imbalance'][m])}" for m in DISPATCH]
        lines.append(f"  from {inputs['from']}: {moved}; in sample, current -> placed: " + ", ".join(cells))
    return lines


def dispatch_lines(dispatch: dict[str, Any], before: dict[str, Optional[float]],
                   after: dict[str, Optional[float]], label: str) -> list[str]:
    """The summary's per-dispatch line (in sample, ``label`` in brackets) and how static loads were obtained."""
    cells = [f"{model} {_fmt(before[model])} -> {_fmt(after[model])}" for model in DISPATCH]
    lines = [f"  in sample by dispatch model ({label}): " + ", ".join(cells)]
    lines.append(f"  static dispatch: {dispatch['static'] or dispatch['why']}")
    lines.append(f"  round-robin dispatch: {dispatch['round_robin']}")
    return lines


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"
