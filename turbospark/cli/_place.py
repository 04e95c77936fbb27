"""``turbospark place`` and ``turbospark export``: expert placement from a capture, in the runtimes' formats."""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any, Optional

import numpy as np

from ._io import UsageError, add_verify, draw_document, emit, read_capture, run_guarded
from .._atomic import atomic_output
from ..capture.sequences import exact_fraction
from ..capture.reader import Capture
from ..outputs.replay import routed_experts, save_routed_experts
from ..capture.rows import layer_breaks
from ..placement.dispatch import DISPATCH, Routing, routing
from ..placement.document import build, summary_lines
from ..placement.dispatch import trivial_map
from ..placement.formats import FORMATS, read_placement_file, render

__all__ = ["add_commands", "draw_placement", "fraction"]


def add_commands(commands: Any, positive: Any) -> None:
    """Add ``place`` and ``export`` to the subcommand set ``commands``; ``positive`` parses counts."""
    cmd = commands.add_parser(
        "place",
        help="place experts on GPUs for expert parallelism (EPLB, refined), with imbalance in and out of sample",
        description="Compute per layer a placement of the experts onto S slots on G GPUs "
        "(S - E replicas of the busiest experts), evaluate its load imbalance, and write it as "
        "turbospark's JSON, SGLang's --init-expert-location file or TensorRT-LLM's EPLB YAML.",
    )
    cmd.add_argument("capture", metavar="CAPTURE", nargs="+",
                     help="capture JSON file; or G files, one per source rank (attention data parallelism: "
                     "rank i = file i), for static and round-robin dispatch")
    cmd.add_argument("--gpus", type=positive, required=True, metavar="G", help="GPUs (expert-parallel ranks)")
    cmd.add_argument("--dispatch", choices=DISPATCH, default="even",
                     help="how the engine picks a replica, the model to optimise for (default even): even = "
                     "1/r of the tokens per replica; static = SGLang's static dispatch (local replica first; "
                     "with one capture, tokens assumed spread evenly over the G source ranks); round-robin = "
                     "TensorRT-LLM's load balancer routing (see docs/placement.md)")
    cmd.add_argument("--slots", type=positive, metavar="S", help="physical expert slots per layer (default: E)")
    cmd.add_argument("--nodes", type=positive, default=1, metavar="N",
                     help="nodes the G GPUs span (default 1); static dispatch prefers a same-node replica, "
                     "as SGLang's --nnodes N")
    cmd.add_argument("--groups", type=positive, metavar="X",
                     help="expert groups; all replicas of a group's experts stay on one node")
    cmd.add_argument("--fit", type=fraction, metavar="F",
                     help="choose from the first fraction F of each layer's passes, judge on the rest (needs the "
                     "trace); with sequence tags (seq), from the first floor(F x S) of its S sequences in order "
                     "of first appearance, whole, so both halves hold prompt and decode")
    cmd.add_argument("--batch", type=positive, metavar="B",
                     help="also report imbalance per serving batch of B passes (needs the trace)")
    cmd.add_argument("--from", dest="current", metavar="CURRENT",
                     help="the placement served now (any placement file): rebalance from it, moving few slots")
    cmd.add_argument("--max-moves", type=int, metavar="M",
                     help="with --from: move at most M slots per layer (default unbounded: the from-scratch "
                     "placement, relabelled to move as few slots as its loads allow); 0 keeps the current one")
    cmd.add_argument("--expert-bytes", type=positive, metavar="B",
                     help="with --from: bytes of one expert's weights, to report the bytes moved")
    cmd.add_argument("--format", choices=FORMATS, default="json", help="output format (default json)")
    cmd.add_argument("--first-moe-layer", type=int, default=0, metavar="D",
                     help="decoder-layer index of the capture's MoE layer 0, for models whose first D layers "
                     "are dense (DeepSeek-V3: 3): SGLang's map gets D trivial rows first, TensorRT-LLM's keys "
                     "run D..D+L-1 (default 0)")
    cmd.add_argument("--mtp-layers", type=int, default=0, metavar="M",
                     help="--format trtllm: the model's M MTP (nextn) layers, which TensorRT-LLM's load balancer "
                     "keys num_hidden_layers + i (D + L + i here) and fails the build on without a row: each gets "
                     "the trivial placement (default 0; DeepSeek-V3 with MTP: 1)")
    cmd.add_argument("-o", "--output", metavar="FILE",
                     help="file to write, - for stdout (default: stdout when it is not a terminal; "
                     "on a terminal only the summary is printed)")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run_place, args))

    export = commands.add_parser(
        "export", help="write a capture's counts for a runtime's balancer, its routing for replay in RL "
        "training, or its passes as a Parquet dataset",
        description="--to sglang: the per-layer expert counts as SGLang's "
        '--init-expert-location {"logical_count": ...} file. --to routed-experts: the trace per token, '
        "(tokens, layers, top_k) per sequence, ragged with cu_seqlens, as an .npz for routing replay "
        "(vLLM's routed_experts layout; see docs/replay.md). --to parquet: one row per pass (rank, layer, "
        "pass, seq, phase, ids, pred), a directory partitioned rank=R/layer=L/ that DuckDB, polars, "
        "pyarrow and Spark read (needs pyarrow: pip install 'turbospark[parquet]'; see docs/exports.md). "
        "--to json: the capture as the reference's JSON document, byte for byte what the in-memory recorder "
        "writes (for a streamed capture: what it would have written with trace=True; see docs/stream.md).",
    )
    export.add_argument("capture", metavar="CAPTURE", nargs="+",
                        help="capture JSON file; --to parquet takes several, one per rank (rank i = file i)")
    export.add_argument("--to", choices=("sglang", "routed-experts", "parquet", "json"), required=True,
                        help="sglang (counts), routed-experts (the trace per token), parquet (a row per "
                        "pass; these two need the trace) or json (the whole capture as the reference's JSON)")
    export.add_argument("-o", "--output", metavar="FILE",
                        help="file to write (default: stdout; routed-experts needs a FILE, it is binary; "
                        "parquet a directory that does not exist or is empty)")
    export.add_argument("--rank", type=int, metavar="N",
                        help="--to parquet: the rank of the first CAPTURE (default 0); the i-th gets N + i")
    add_verify(export)
    export.set_defaults(run=lambda args: run_guarded(_run_export, args))


def fraction(text: str) -> Fraction:
    """argparse type: a number strictly between 0 and 1, read exactly (``0.29`` is 29/100)."""
    try:
        value = exact_fraction(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def read_ranks(paths: list[str], gpus: int) -> tuple[Capture, Any, Optional[Routing]]:
    """One capture (its sequences, no routing), or G per-rank captures: their summed counts as one
    capture, no sequences, and their ``Routing`` (rank i = file i). Raises ``UsageError``
    naming the files when there are not G of them or their geometry differs."""
    if len(paths) == 1:
        capture, seqs = read_capture(paths[0], with_sequences=True)
        return capture, seqs, None
    if len(paths) != gpus:
        raise UsageError(f"{len(paths)} per-rank captures for --gpus {gpus}: give one capture, "
                         f"or one per source rank ({gpus})")
    captures = [read_capture(path)[0] for path in paths]
    first = captures[0]
    for path, capture in zip(paths[1:], captures[1:]):
        if capture.header != first.header:
            raise UsageError(f"{path} ({_geometry(capture)}) does not fit {paths[0]} ({_geometry(first)})")
    traces = [c.trace for c in captures if c.trace is not None]
    whole = len(traces) == len(captures)
    # Each rank's gaps (a streamed capture's failed appends) end round-robin's calls there.
    breaks = [[layer_breaks(c, layer) for layer in range(c.num_layers)] for c in captures] if whole else None
    flow = routing([c.counts for c in captures], traces if whole else None, breaks=breaks)
    total = Capture(first.num_layers, first.num_experts, first.top_k, flow.counts.sum(axis=0))
    return total, None, flow


def _geometry(capture: Capture) -> str:
    return f"{capture.num_layers} layers x {capture.num_experts} experts, top-{capture.top_k}"


def _run_place(args: argparse.Namespace) -> int:
    if args.first_moe_layer < 0:
        raise UsageError(f"--first-moe-layer must be 0 or more, got {args.first_moe_layer}")
    if args.mtp_layers < 0:
        raise UsageError(f"--mtp-layers must be 0 or more, got {args.mtp_layers}")
    if args.mtp_layers and args.format != "trtllm":
        raise UsageError(f"--mtp-layers applies to --format trtllm only (got --format {args.format}): SGLang's "
                         "draft layers need no rows, turbospark's JSON holds the capture's MoE layers")
    if args.format == "sglang" and args.output not in (None, "-") and not args.output.endswith(".json"):
        # SGLang parses an --init-expert-location that does not end in .json (or .pt) as JSON text.
        raise UsageError(f"-o {args.output}: SGLang reads --init-expert-location as a file only when "
                         "its name ends in .json; name it like placement.json")
    capture, seqs, flow = read_ranks(args.capture, args.gpus)
    source = args.capture[0] if len(args.capture) == 1 else args.capture
    current = None
    if args.current is not None:
        current = read_placement_file(args.current, capture, args.gpus, args.first_moe_layer)[0]
    doc, placement = build(capture, gpus=args.gpus, slots=args.slots, nodes=args.nodes,
                           groups=args.groups, fit=args.fit, batch=args.batch, seqs=seqs,
                           source=source, dispatch=args.dispatch, flow=flow, current=current,
                           max_moves=args.max_moves, expert_bytes=args.expert_bytes, current_source=args.current,
                           first_layer=args.first_moe_layer)
    # Without -o on a terminal, the document (often hundreds of KB) would bury
    # the summary: print only the summary and how to save the file.
    held_back = args.output is None and sys.stdout.isatty()
    if not held_back:
        emit(render(args.format, doc, placement.phy2log, args.first_moe_layer, args.mtp_layers), args.output)
    # The document goes to stdout without -o (or with -o -); the summary then goes to stderr.
    out = sys.stderr if args.output in (None, "-") and not held_back else sys.stdout
    lines = summary_lines(doc) + _per_step(capture, seqs, args, placement.phy2log)
    for line in lines + engine_lines(args.format, doc, args.output, args.first_moe_layer, args.mtp_layers):
        print(line, file=out)
    if held_back:
        print(f"placement not written ({args.format}): give -o FILE to save it, or -o - to print it here", file=out)
    elif args.output != "-" and args.output is not None:
        print(f"wrote {args.output} ({args.format})", file=out)
    return 0


def _per_step(capture: Capture, seqs: Any, args: argparse.Namespace, phy2log: np.ndarray) -> list[str]:
    """Summary lines of the per-step imbalance (issue 28), trivial and placed, on the whole capture, when
    steps can be had (recorded, or --batch) from one capture; none otherwise."""
    from ..rebalance.report import can_form, per_step_doc, per_step_lines

    if not can_form(capture, args.batch) or len(args.capture) > 1:
        return []
    trivial = trivial_map(capture.num_layers, capture.num_experts, phy2log.shape[1])
    doc = per_step_doc(capture, {"trivial": trivial, "placed": phy2log}, args.gpus, args.batch, seqs,
                       args.dispatch, nodes=args.nodes, first_layer=args.first_moe_layer)
    return per_step_lines(doc)


def engine_lines(fmt: str, doc: dict[str, Any], output: Optional[str], first_layer: int,
                 mtp_layers: int = 0) -> list[str]:
    """What the engine needs beside the file: EP size, slot count, flags, the layers placed trivially."""
    inputs = doc["inputs"]
    gpus, slots, experts, layers = inputs["gpus"], inputs["slots"], inputs["num_experts"], inputs["num_layers"]
    idle = [row["layer"] for row in doc["layers"] if row["after"]["in_sample"]["mean_load"] == 0]
    lines = []
    if idle:
        shown = ", ".join(map(str, idle[:8])) + (", ..." if len(idle) > 8 else "")
        lines.append(f"  {len(idle)} MoE layers without passes ({shown}): the trivial placement (slot s holds expert s mod E)")
    name = output if output not in (None, "-") else "FILE"
    spare = f"{slots} slots = {experts} experts + {slots - experts} redundant"
    decoder = f"decoder layers {first_layer}..{first_layer + layers - 1}"
    nodes = inputs["nodes"]
    if fmt == "sglang":
        rows = f"{first_layer} trivial rows for the dense layers, then " if first_layer else ""
        imb = doc["summary"]["imbalance"]
        # DeepEP sets SGLang's ep_size to tp_size: without --tp G the map is read for another EP size.
        multi = f" --nnodes {nodes}" if nodes > 1 else ""
        lines.append(f"SGLang: --tp {gpus} --ep-size {gpus} --moe-a2a-backend deepep "
                     f"--ep-num-redundant-experts {slots - experts} "
                     f"--init-expert-location {name if name.endswith('.json') else name + '.json'}{multi} "
                     f"({spare}; {rows}{layers} MoE rows" + (f"; each node adds --node-rank, --dist-init-addr"
                                                             if nodes > 1 else "") + ")")
        static = "unknown (no per-rank captures)" if imb["static"] is None else f"{imb['static']:.3f}"
        lines.append(f"  SGLang's dispatch: static (the default with DeepEP) gives imbalance {static}, "
                     f"--ep-dispatch-algorithm dynamic about {_fmt(imb['even'])} "
                     f"(optimised for {doc['dispatch']['model']})")
    elif fmt == "trtllm":
        if mtp_layers:
            decoder += f", then {mtp_layers} MTP layers {first_layer + layers}..{first_layer + layers + mtp_layers - 1} " \
                       "placed trivially"
        lines.append(f"TensorRT-LLM: moe_config: {{load_balancer: {name}}} with enable_attention_dp: true, "
                     f"trtllm-serve --tp_size {gpus} --ep_size {gpus} ({spare}; keys are {decoder})")
        if not mtp_layers:
            lines.append(f"  with MTP (nextn) layers give --mtp-layers M: TensorRT-LLM keys them "
                         f"{first_layer + layers} and up and fails the build (KeyError) without a row")
    return lines


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def _run_export(args: argparse.Namespace) -> int:
    if args.rank is not None and (args.to != "parquet" or args.rank < 0):
        raise UsageError(f"--rank {args.rank}: " + ("a rank is 0 or more" if args.to == "parquet"
                                                    else "only --to parquet takes a rank"))
    if args.to == "parquet":
        from ._parquet import export_parquet_command

        return export_parquet_command(args)
    if len(args.capture) > 1:
        raise UsageError(f"--to {args.to} takes one capture, got {len(args.capture)}: "
                         f"{', '.join(args.capture)} (merge them first: turbospark merge)")
    args.capture = args.capture[0]
    if args.to == "routed-experts":
        return _export_routed_experts(args)
    if args.to == "json":
        return _export_json(args)
    capture, _ = read_capture(args.capture)
    if capture.num_experts == 0:
        raise UsageError(f"{args.capture} has no experts to export")
    counts: np.ndarray = capture.counts
    emit(json.dumps({"logical_count": counts.tolist()}, separators=(",", ":")) + "\n", args.output)
    return 0


def _export_routed_experts(args: argparse.Namespace) -> int:
    if args.output in (None, "-"):
        raise UsageError("--to routed-experts writes a binary .npz: give -o FILE (like routed_experts.npz)")
    capture, _ = read_capture(args.capture)
    if capture.trace is None:
        raise UsageError(f"{args.capture} has counts but no trace: routed experts need the order of the passes "
                         "(record with trace=True, or TURBOSPARK_ROUTER_TRACE=1)")
    replay = routed_experts(capture)
    try:
        save_routed_experts(replay, args.output)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    ids = replay.routed_experts
    plural = "" if replay.num_seqs == 1 else "s"
    print(f"wrote {args.output}: {replay.num_seqs} sequence{plural}, {ids.shape[0]} tokens x {ids.shape[1]} layers "
          f"({replay.routed_layers.shape[0]} routed) x top-{ids.shape[2]}, {ids.dtype}, fill {replay.fill}")
    return 0


def _export_json(args: argparse.Namespace) -> int:
    from ..outputs.export_json import write_json

    capture, _ = read_capture(args.capture)
    if args.output in (None, "-"):
        write_json(capture, sys.stdout.buffer, args.capture)
        sys.stdout.buffer.flush()
        return 0
    try:
        with atomic_output(args.output) as out:
            write_json(capture, out, args.capture)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0


def draw_placement(path: str, output: str) -> int:
    """``plot --placement``: draw the placement document at ``path`` into ``output``; returns the exit status."""
    from ..outputs.plot_placement import plot_placement, read_document

    return draw_document(path, output, read_document, plot_placement)
