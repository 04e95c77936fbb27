"""``turbospark analyze`` additions: ``--placement FILE`` (per-layer imbalance of a placement)
and ``--holdout F`` (coverage sets chosen on the first passes or sequences, judged on the rest)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Optional

from ..capture.reader import Capture
from ..placement.dispatch import DISPATCH, Routing, routing, trivial_map
from ..capture.rows import layer_breaks
from ..placement.document import by_dispatch, dispatch_inputs, dispatch_lines, evaluate_map, model_means
from ..placement.formats import read_placement_file

__all__ = ["Extras", "add_options", "extras"]


@dataclass
class Extras:
    """Keys added to the ``--json`` document, and lines appended to the text report."""

    doc: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def add_options(parser: argparse.ArgumentParser, positive: Any, fraction: Any) -> None:
    """Add ``--placement``, ``--gpus`` and ``--holdout`` to the analyze parser."""
    parser.add_argument("--placement", metavar="FILE",
                        help="also report per-layer GPU load imbalance of this placement "
                        "(turbospark's JSON, SGLang's or TensorRT-LLM's file)")
    parser.add_argument("--gpus", type=positive, metavar="G",
                        help="GPUs of a --placement file that does not say (SGLang's, TensorRT-LLM's)")
    parser.add_argument("--first-moe-layer", type=int, default=0, metavar="D",
                        help="decoder-layer index of MoE layer 0 in a --placement file (SGLang's map then has "
                        "D + L rows, TensorRT-LLM's keys run D..D+L-1; default 0)")
    parser.add_argument("--dispatch", choices=DISPATCH,
                        help="dispatch model of a --placement file's headline figures: even (default), static "
                        "(SGLang's; one capture: tokens assumed spread evenly over the G source ranks) or "
                        "round-robin (TensorRT-LLM's); --json gives all three either way")
    parser.add_argument("--per-step", action="store_true",
                        help="with --placement: also per-step imbalance (mean, p50, p99, max, token-weighted; "
                        "steps as the capture records them, else --batch B; see docs/rebalance.md)")
    parser.add_argument("--batch", type=positive, metavar="B",
                        help="with --per-step: steps of B passes when the capture records none")
    parser.add_argument("--holdout", type=fraction, metavar="F",
                        help="choose coverage sets on the first fraction F of each layer's passes "
                        "and report how they cover the rest (needs the trace); with sequence tags (seq), "
                        "on the first floor(F x S) of its S sequences in order of first appearance, whole")


def extras(capture: Capture, args: argparse.Namespace) -> Optional[Extras]:
    """The additions asked for by ``args``, or None. Raises ``ValueError`` naming the problem."""
    if args.gpus is not None and args.placement is None:
        raise ValueError("--gpus only applies to a --placement file")
    if args.dispatch is not None and args.placement is None:
        raise ValueError("--dispatch only applies to a --placement file")
    if args.first_moe_layer < 0:
        raise ValueError(f"--first-moe-layer must be 0 or more, got {args.first_moe_layer}")
    if (args.per_step or args.batch is not None) and args.placement is None:
        raise ValueError("--per-step and --batch apply to a --placement file")
    if args.batch is not None and not args.per_step:
        raise ValueError("--batch applies with --per-step")
    if args.placement is None and args.holdout is None:
        return None
    out = Extras()
    if args.placement is not None:
        _placement(capture, args.placement, args.gpus, args.dispatch or "even", args.first_moe_layer, out)
        if args.per_step:
            from ..rebalance.report import per_step_doc, per_step_lines

            phy2log, gpus = read_placement_file(args.placement, capture, args.gpus, args.first_moe_layer)
            doc = per_step_doc(capture, {"file": phy2log}, gpus, args.batch, None, args.dispatch or "even",
                               first_layer=args.first_moe_layer)
            out.doc["placement"]["per_step"] = doc
            out.lines += per_step_lines(doc)
    if args.holdout is not None:
        from ..metrics.holdout import holdout, holdout_lines

        doc = holdout(capture, args.holdout)
        out.doc["holdout"] = doc
        out.lines += holdout_lines(doc)
    return out


def whole_flow(capture: Capture) -> Routing:
    """One capture's routing: its counts and trace, ranks unknown."""
    if capture.trace is None:
        return routing([capture.counts])
    # A streamed capture's gaps end round-robin's per-layer call there (no block joins rows across one).
    return routing([capture.counts], [capture.trace],
                   breaks=[[layer_breaks(capture, layer) for layer in range(capture.num_layers)]])


def _placement(capture: Capture, path: str, gpus: Optional[int], dispatch: str, first_layer: int,
               out: Extras) -> None:
    phy2log, gpus = read_placement_file(path, capture, gpus, first_layer)
    stats = evaluate_map(capture, phy2log, gpus)
    flow = whole_flow(capture)
    assume = dispatch == "static"
    after = by_dispatch(phy2log, flow, gpus, assume, first_layer=first_layer)
    before = by_dispatch(trivial_map(phy2log.shape[0], capture.num_experts, phy2log.shape[1]), flow, gpus, assume,
                         first_layer=first_layer)
    rows = [{"layer": layer, **row, "imbalance": a, "trivial_imbalance": b}
            for layer, (row, a, b) in enumerate(zip(stats, after, before))]
    routed = [row for row, total in zip(rows, capture.totals.tolist()) if total > 0]
    info = dispatch_inputs(dispatch, flow, gpus, assume)
    del info["model"]
    out.doc["placement"] = {
        "file": path, "gpus": gpus, "slots": int(phy2log.shape[1]), "dispatch": dispatch, **info,
        "layers": rows,
        "mean_imbalance": model_means(routed, "imbalance"),
        "mean_trivial_imbalance": model_means(routed, "trivial_imbalance"),
    }
    out.lines += ["", f"placement {path}: {phy2log.shape[1]} slots on {gpus} GPUs; "
                  "GPU load imbalance (max - mean) / mean and balancedness mean / max per layer:",
                  "layer  imbalance  balancedness"]
    for layer, row in enumerate(stats):
        if row["imbalance"] is None:
            out.lines.append(f"{layer:>5}          -             -  (no load)")
        else:
            out.lines.append(f"{layer:>5}  {row['imbalance']:>9.3f}  {row['balancedness']:>12.3f}")
    values = [row["imbalance"] for row in stats if row["imbalance"] is not None]
    if values:
        out.lines.append(f"mean imbalance over {len(values)} loaded layers: {sum(values) / len(values):.3f}")
        doc = out.doc["placement"]
        out.lines += dispatch_lines(info, doc["mean_trivial_imbalance"], doc["mean_imbalance"],
                                    "mean, trivial -> this file")
