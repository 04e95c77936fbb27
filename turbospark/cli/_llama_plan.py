"""``turbospark llama-plan``: which layers' expert tensors stay on the GPU under llama.cpp, as ``-ot``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

__all__ = ["add_command"]


def add_command(commands: Any, positive: Callable[[str], int]) -> None:
    """Register ``llama-plan`` on the ``turbospark`` subparsers."""
    cmd = commands.add_parser(
        "llama-plan",
        help="llama.cpp: which layers' expert tensors fit in VRAM, as the exact -ot regex (and --n-cpu-moe N)",
        description="Plan llama.cpp's expert offload for a VRAM budget from a capture: keep on the GPU the layers "
        "whose expert tensors save the most CPU work per decode token, then the most prompt-processing copy "
        "traffic (distinct experts per ubatch, from the trace), and print the -ot regex sending the others to "
        "the CPU, beside --n-cpu-moe N for the same budget. See docs/llama_cpp.md.",
    )
    cmd.add_argument("capture", metavar="CAPTURE", help="capture JSON (a trace with seq/phase tags gives prompt costs)")
    sizes = cmd.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--gguf", metavar="MODEL.gguf", help="read each layer's expert tensor bytes from the model "
                       "(needs the gguf package)")
    sizes.add_argument("--expert-bytes", metavar="BYTES",
                       help="bytes of one expert of one layer (its gate, up and down slices), the same in every "
                       "routed layer; e.g. 6.5M")
    cmd.add_argument("--vram", required=True, metavar="BYTES",
                     help="VRAM left for expert tensors after everything else (e.g. 12G, 800M, 123456)")
    cmd.add_argument("--ubatch", type=positive, default=512, metavar="N", help="llama.cpp's -ub (default 512)")
    cmd.add_argument("--min-offload-batch", type=positive, default=32, metavar="N",
                     help="smallest ubatch llama.cpp computes a CPU layer on the GPU (GGML_OP_OFFLOAD_MIN_BATCH, "
                     "default 32)")
    cmd.add_argument("--prefer", choices=("decode", "prompt"), default="decode",
                     help="which cost decides first (default decode; the other breaks ties)")
    cmd.add_argument("--json", action="store_true", help="print JSON instead of the text report")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..offload import llama_plan as lp
    from ._io import UsageError, read_capture

    try:
        budget = lp.parse_bytes(args.vram)
        expert_bytes = None if args.expert_bytes is None else lp.parse_bytes(args.expert_bytes)
    except ValueError as exc:
        print(f"turbospark llama-plan: {exc}", file=sys.stderr)
        return 2
    try:
        capture, _ = read_capture(args.capture)
    except UsageError as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return 2
    try:
        if args.gguf is not None:
            sizes = lp.expert_tensor_bytes(args.gguf, capture.num_layers)
        else:
            assert expert_bytes is not None
            routed = capture.counts.sum(axis=1) > 0
            sizes = tuple(expert_bytes * capture.num_experts if r else 0 for r in routed.tolist())
        costs = lp.layer_costs(capture, sizes, ubatch=args.ubatch, min_offload_batch=args.min_offload_batch)
        chosen = lp.plan(costs, budget, prefer=args.prefer)
        baseline = lp.n_cpu_moe_plan(costs, budget)
    except (ImportError, OSError, ValueError) as exc:
        print(f"turbospark llama-plan: {exc}", file=sys.stderr)
        return 2
    layers = costs.expert_layers
    if args.json:
        document = {"plan": chosen.to_dict(layers), "n_cpu_moe_baseline": baseline.to_dict(layers),
                    "layer_tensor_bytes": list(costs.tensor_bytes), "ubatch": args.ubatch,
                    "min_offload_batch": args.min_offload_batch, "prefer": args.prefer}
        print(json.dumps(document, indent=1))
        return 0
    sys.stdout.write(format_plan(chosen, baseline, costs))
    return 0


def _number(value: Any, digits: int = 2) -> str:
    return "n/a (needs a trace with prompt ubatches)" if value is None else f"{float(value):,.{digits}f}"


def format_plan(chosen: Any, baseline: Any, costs: Any) -> str:
    """The text report: the plan's flags and costs, then --n-cpu-moe's for the same budget."""
    layers = costs.expert_layers
    total = sum(costs.tensor_bytes)
    lines = [f"expert layers: {len(layers)} ({total:,} bytes of expert tensors); VRAM budget {chosen.budget:,} bytes",
             f"GPU layers: {', '.join(map(str, chosen.gpu_layers)) or 'none'} ({chosen.gpu_bytes:,} bytes)",
             f"CPU layers: {', '.join(map(str, chosen.cpu_layers)) or 'none'}"]
    if chosen.override_argument is None:
        lines.append("llama.cpp flags: none (every expert tensor fits)")
    else:
        flags = f"-ot '{chosen.override_argument}'"
        n = chosen.n_cpu_moe(layers)
        if n is not None and chosen.cpu_layers == layers:
            flags += "   (same as --cpu-moe)"
        elif n is not None:
            flags += f"   (same as --n-cpu-moe {n})"
        lines.append(f"llama.cpp flags: {flags}")
    for title, p in (("plan", chosen), (f"--n-cpu-moe {baseline.n_cpu_moe(layers)}", baseline)):
        lines.append(
            f"{title}: decode {_number(p.cpu_experts_per_token)} CPU experts/token "
            f"({_number(p.cpu_bytes_per_token, 0)} bytes/token); prompt copy {_number(p.copy_experts_per_ubatch)} "
            f"experts/ubatch ({_number(p.copy_bytes_per_ubatch, 0)} bytes/ubatch of {costs.ubatch})"
        )
    change = []
    for what, mine, theirs in (("decode bytes", chosen.cpu_bytes_per_token, baseline.cpu_bytes_per_token),
                               ("prompt copy bytes", chosen.copy_bytes_per_ubatch, baseline.copy_bytes_per_ubatch)):
        if mine is not None and theirs:
            change.append(f"{what} {float((mine - theirs) / theirs):+.1%}")
    if change:
        lines.append(f"plan against --n-cpu-moe {baseline.n_cpu_moe(layers)}: {', '.join(change)}")
    return "\n".join(lines) + "\n"
