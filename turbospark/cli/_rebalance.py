"""``turbospark rebalance``: replay an engine's periodic expert rearrangement over a capture's steps
(``turbospark.rebalance``; docs/rebalance.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from ._io import UsageError, add_verify, emit, read_capture, run_guarded

__all__ = ["add_command"]


def _ints(low: int, name: str) -> Any:
    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
        bad = [v for v in values if v < low]
        if bad:
            raise argparse.ArgumentTypeError(f"{name} must be {low} or more, got {bad[0]}")
        return values

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_command(commands: Any, positive: Any) -> None:
    """Add ``rebalance`` to the subcommand set ``commands``; ``positive`` parses counts."""
    cmd = commands.add_parser(
        "rebalance", help="replay vLLM's periodic expert rearrangement (EPLB) over a capture's steps: per-step "
        "imbalance, bytes moved, routing drift, and the --eplb-config a sweep recommends",
        description="Replay the engine's own rebalancing, step by step, over the capture's engine steps (or "
        "steps of --batch B passes), and report per setting the per-step imbalance over time and the expert "
        "weights moved at each rearrangement. Comma-separated values with --sweep try every combination.")
    cmd.add_argument("capture", metavar="CAPTURE", help="capture JSON file with the trace (streamed captures too)")
    cmd.add_argument("--gpus", type=positive, required=True, metavar="G", help="expert-parallel ranks")
    cmd.add_argument("--engine", choices=("vllm", "turbospark"), default="vllm",
                     help="vllm: vLLM 0.33's DefaultEplbPolicy and schedule (default); turbospark: turbospark's "
                     "place --from --max-moves M under the same schedule and vLLM's router")
    cmd.add_argument("--batch", type=positive, metavar="B",
                     help="steps of B passes (as place --batch B forms them) when the capture records no steps")
    cmd.add_argument("--num-redundant-experts", type=_ints(0, "--num-redundant-experts"), default=[0],
                     metavar="R", help="spare slots (default 0)")
    cmd.add_argument("--window-size", type=_ints(1, "--window-size"), default=[1000], metavar="W",
                     help="steps of load the policy reads (default 1000, vLLM's)")
    cmd.add_argument("--step-interval", type=_ints(1, "--step-interval"), default=[3000], metavar="I",
                     help="steps between rearrangements (default 3000, vLLM's)")
    cmd.add_argument("--max-moves", type=_ints(0, "--max-moves"), metavar="M",
                     help="--engine turbospark: at most M moved slots per layer per rearrangement (default unbounded)")
    cmd.add_argument("--groups", type=positive, default=1, metavar="X",
                     help="the model's expert groups (vLLM's num_expert_groups; default 1)")
    cmd.add_argument("--nodes", type=positive, default=1, metavar="N", help="nodes the G GPUs span (default 1)")
    cmd.add_argument("--expert-bytes", type=positive, metavar="B", help="bytes of one expert's weights")
    cmd.add_argument("--step-time", type=_seconds, metavar="SECONDS",
                     help="mean seconds per engine step, for bytes moved per hour (default: per 1000 steps)")
    cmd.add_argument("--sweep", action="store_true",
                     help="every combination of the comma-separated values: a table, the Pareto front and "
                     "the recommended setting's flags")
    cmd.add_argument("--max-bytes", type=float, metavar="COST",
                     help="with --sweep: recommend only settings moving at most this (in the cost unit)")
    cmd.add_argument("--drift", type=_ints(1, "--drift"), metavar="W1,W2,...",
                     help="also report routing drift at these window sizes (in steps)")
    cmd.add_argument("--json", action="store_true", help="print the JSON document (docs/rebalance.md) instead")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the JSON document to FILE")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run, args))


def _run(args: argparse.Namespace) -> int:
    from ..rebalance.document import build, table_lines
    from ..rebalance.drift import drift
    from ..rebalance.steps import form_steps
    from ..rebalance.sweep import grid

    lists = {"--num-redundant-experts": args.num_redundant_experts, "--window-size": args.window_size,
             "--step-interval": args.step_interval, "--max-moves": args.max_moves or [None]}
    several = [name for name, values in lists.items() if len(values) > 1]
    if several and not args.sweep:
        raise UsageError(f"{several[0]} has several values: give --sweep to try every combination")
    if args.max_moves is not None and args.engine != "turbospark":
        raise UsageError("--max-moves applies to --engine turbospark (vLLM's policy moves what it moves)")
    if args.max_bytes is not None and not args.sweep:
        raise UsageError("--max-bytes applies to --sweep")
    capture, seqs = read_capture(args.capture, with_sequences=True)
    steps = form_steps(capture, args.batch, seqs)
    settings = grid(args.engine, args.num_redundant_experts, args.window_size, args.step_interval,
                    args.max_moves or [None])
    drifted: Optional[list[dict[str, Any]]] = None
    if args.drift is not None:
        drifted = drift(capture, steps, args.drift)
    doc = build(capture, args.capture, steps, args.gpus, settings, groups=args.groups, nodes=args.nodes,
                expert_bytes=args.expert_bytes, step_time=args.step_time, budget=args.max_bytes, drift=drifted)
    text = json.dumps(doc, separators=(",", ":")) + "\n"
    if args.output is not None:
        emit(text, args.output)
    if args.json:
        sys.stdout.write(text)
        return 0
    for line in table_lines(doc, settings) + _drift_lines(drifted):
        print(line)
    return 0


def _drift_lines(drifted: Optional[list[dict[str, Any]]]) -> list[str]:
    if not drifted:
        return []
    lines = ["routing drift (total variation between consecutive windows; hot = top experts of a layer):"]
    for row in drifted:
        d, hot = row["distance"], row["hot"]
        life = "longer than the capture" if hot["half_life_steps"] is None else f"{hot['half_life_steps']} steps"
        lag1 = hot["overlap"][0]
        lines.append(f"  window {row['window']} steps ({row['windows']} windows): model-wide "
                     f"{_fmt(d['model'])} mean, {_fmt(d['model_max'])} max; top-{hot['experts']} still hot one "
                     f"window later {_fmt(lag1)} (chance {hot['chance']:.3f}); half-life {life}")
    return lines


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"
