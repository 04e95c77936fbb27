"""``turbospark rebalance``: replay an engine's periodic expert rearrangement over a capture's steps
(``turbospark.rebalance``; docs/rebalance.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from ..capture.sequences import sequences
from ._io import UsageError, add_verify, emit, read_capture, run_guarded, verify_requested

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
        "rebalance", help="replay vLLM's or SGLang's periodic expert rearrangement (EPLB) over a capture's steps: "
        "per-step imbalance, bytes moved, routing drift, and the engine flags a sweep recommends",
        description="Replay the engine's own rebalancing, step by step, over the capture's engine steps (or "
        "steps of --batch B passes), and report per setting the per-step imbalance over time and the expert "
        "weights moved at each rearrangement. Comma-separated values with --sweep try every combination.")
    cmd.add_argument("capture", metavar="CAPTURE", help="capture JSON file with the trace (streamed captures too)")
    cmd.add_argument("--gpus", type=positive, required=True, metavar="G", help="expert-parallel ranks")
    cmd.add_argument("--engine", choices=("vllm", "turbospark", "sglang"), default="vllm",
                     help="vllm: vLLM 0.33's DefaultEplbPolicy and schedule (default); turbospark: turbospark's "
                     "place --from --max-moves M under the same schedule and vLLM's router; sglang: SGLang 0.5.23's "
                     "EPLB loop, its deepseek algorithm and static dispatch under DeepEP")
    cmd.add_argument("--batch", type=positive, metavar="B",
                     help="steps of B passes (as place --batch B forms them) when the capture records no steps")
    cmd.add_argument("--num-redundant-experts", type=_ints(0, "--num-redundant-experts"), default=[0],
                     metavar="R", help="spare slots (default 0; SGLang's --ep-num-redundant-experts)")
    cmd.add_argument("--window-size", type=_ints(1, "--window-size"), metavar="W",
                     help="steps of load the policy reads (default 1000, vLLM's; SGLang: its "
                     "--expert-distribution-recorder-buffer-size, default the step interval)")
    cmd.add_argument("--step-interval", type=_ints(1, "--step-interval"), metavar="I",
                     help="steps between rearrangements (default 3000, vLLM's; SGLang: its "
                     "--eplb-rebalance-num-iterations, default 1000)")
    cmd.add_argument("--max-moves", type=_ints(0, "--max-moves"), metavar="M",
                     help="--engine turbospark: at most M moved slots per layer per rearrangement (default unbounded)")
    cmd.add_argument("--groups", type=positive, default=1, metavar="X",
                     help="the model's expert groups (vLLM's num_expert_groups; default 1)")
    cmd.add_argument("--nodes", type=positive, default=1, metavar="N", help="nodes the G GPUs span (default 1)")
    cmd.add_argument("--first-moe-layer", type=int, default=0, metavar="D",
                     help="--engine sglang: the dense layers before the first MoE layer (SGLang's map has a row "
                     "for each; its static dispatch draws for them first; default 0)")
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
    cmd.add_argument("--dask", metavar="ADDRESS",
                     help="replay the settings in parallel on a Dask cluster, a share of them per worker thread: "
                     "a scheduler address or 'local' (needs pip install 'turbospark[dask]'; the same output)")
    cmd.add_argument("--json", action="store_true", help="print the JSON document (docs/rebalance.md) instead")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the JSON document to FILE")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run, args))


# Unset: vLLM's window_size and step_interval; SGLang's interval, and its buffer the interval itself
# (arg_groups/parallel_hook.py 805-811: expert_distribution_recorder_buffer_size = eplb_rebalance_num_iterations).
_DEFAULTS = {"sglang": (None, 1000), "vllm": (1000, 3000), "turbospark": (1000, 3000)}


def _run(args: argparse.Namespace) -> int:
    from ..rebalance.document import build, table_lines
    from ..rebalance.drift import drift
    from ..rebalance.steps import form_steps
    from ..rebalance.sweep import grid

    window, interval = _DEFAULTS[args.engine]
    windows = args.window_size or (None if window is None else [window])
    intervals = args.step_interval or [interval]
    lists = {"--num-redundant-experts": args.num_redundant_experts, "--window-size": windows or [None],
             "--step-interval": intervals, "--max-moves": args.max_moves or [None]}
    several = [name for name, values in lists.items() if len(values) > 1]
    if several and not args.sweep:
        raise UsageError(f"{several[0]} has several values: give --sweep to try every combination")
    if args.max_moves is not None and args.engine != "turbospark":
        raise UsageError("--max-moves applies to --engine turbospark (vLLM's and SGLang's policies move what they move)")
    if args.first_moe_layer < 0:
        raise UsageError(f"--first-moe-layer must be 0 or more, got {args.first_moe_layer}")
    if args.first_moe_layer and args.engine != "sglang":
        raise UsageError("--first-moe-layer applies to --engine sglang (vLLM's map holds the MoE layers only)")
    if args.max_bytes is not None and not args.sweep:
        raise UsageError("--max-bytes applies to --sweep")
    settings = grid(args.engine, args.num_redundant_experts, windows, intervals, args.max_moves or [None])
    geometry = {"groups": args.groups, "nodes": args.nodes, "first_layer": args.first_moe_layer}
    client: Any = None
    cluster: Any = None
    try:
        results = None
        if args.dask is None:
            capture, seqs = read_capture(args.capture, with_sequences=True)
            steps = form_steps(capture, args.batch, seqs)
        else:
            from ..metrics.distributed import connect, dask_runner, load_version
            from ..rebalance.distributed import replay_settings, setting_task

            # The capture first: a file that cannot be read or settings that cannot run start no cluster.
            capture, version = load_version(args.capture, verify_requested())
            steps = form_steps(capture, args.batch, sequences(capture))
            for setting in settings:
                setting.check(capture.num_experts, args.gpus)
            try:
                client, cluster = connect(args.dask, "rebalance")
            except ImportError as exc:
                raise UsageError(str(exc)) from None
            # One task per worker thread: each replays its share of the settings in one pass over the layers.
            threads = sum(client.nthreads().values()) or 1
            results = replay_settings(dask_runner(client, setting_task), args.capture, verify_requested(), version,
                                      args.batch, args.gpus, settings, threads, **geometry)
        drifted: Optional[list[dict[str, Any]]] = None
        if args.drift is not None:
            drifted = drift(capture, steps, args.drift)
        doc = build(capture, args.capture, steps, args.gpus, settings, **geometry, expert_bytes=args.expert_bytes,
                    step_time=args.step_time, budget=args.max_bytes, drift=drifted, results=results)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
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
