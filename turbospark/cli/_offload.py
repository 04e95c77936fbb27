"""``turbospark offload``: GPU-resident expert sets for hybrid inference (KTransformers' strategies
and turbospark's, judged out of sample, written as KTransformers' file), and per-layer budgets for
a dynamic expert cache."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Optional

import numpy as np

from ._cache import parse_bytes
from ._io import UsageError, add_verify, emit, read_capture, run_guarded
from ._place import fraction
from ..offload.budgets import BUDGET_POLICIES, budget_report
from ..offload.gpu_experts import STRATEGIES, gpu_experts_report, parse_strategies

__all__ = ["add_command", "budget_lines", "gpu_lines"]


def add_command(commands: Any, positive: Callable[[str], int]) -> None:
    """Add ``offload`` to the subcommand set ``commands``."""
    cmd = commands.add_parser(
        "offload",
        help="which experts stay on the GPU in hybrid GPU+CPU inference (KTransformers' strategies and "
        "turbospark's, out of sample, KTransformers' file), or per-layer slots of an expert cache",
        description="--gpu-experts N: choose N (layer, expert) pairs to keep on the GPU by each strategy, "
        "scored by the CPU experts per token and the distinct CPU experts per serving step of B rows, "
        "in and out of sample; --kt-file writes the chosen set as KTransformers' .pt file with the "
        "flags that load it. --total-slots S: split S cache slots over the layers for the most hits "
        "(LRU or Belady), against an even split (docs/offload.md).",
    )
    cmd.add_argument("capture", metavar="CAPTURE", help="capture JSON file (with the trace)")
    what = cmd.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu-experts", type=int, metavar="N", help="GPU experts over all MoE layers")
    what.add_argument("--budget-bytes", metavar="X",
                      help="GPU bytes for experts (24GiB, 24G, plain bytes); with --expert-bytes: "
                      "N = X // expert bytes")
    what.add_argument("--total-slots", type=int, metavar="S",
                      help="expert-cache slots over all layers: the per-layer split with the most hits")
    cmd.add_argument("--expert-bytes", metavar="B", help="bytes of one expert's weights (12MiB, 12M, 12582912)")
    cmd.add_argument("--strategy", default="all", metavar="S[,S...]",
                     help=f"GPU set strategies, from {', '.join(STRATEGIES)} (default all)")
    cmd.add_argument("--batch", type=positive, metavar="B",
                     help="GPU sets: rows per serving step for the CPU union per step (default 1); "
                     "--total-slots: with --shared, serve in the iterations of B rows, as cache does")
    cmd.add_argument("--fit", type=fraction, metavar="F",
                     help="choose from the first fraction F of each layer's passes (whole sequences with "
                     "sequence tags), judge on the rest, as place --fit")
    cmd.add_argument("--policy", default="lru", choices=BUDGET_POLICIES,
                     help="--total-slots: the cache policy whose hit curves are split (default lru)")
    cmd.add_argument("--shared", action="store_true",
                     help="--total-slots: one cache per layer shared by all sequences, as cache --shared")
    cmd.add_argument("--kt-file", metavar="FILE.pt",
                     help="write the --kt-strategy set as KTransformers' --init-expert-location file "
                     "(needs torch) and print the sglang-kt flags that load it")
    cmd.add_argument("--kt-strategy", default="batch-aware", metavar="S",
                     help="the strategy whose set --kt-file writes (default batch-aware)")
    cmd.add_argument("--first-moe-layer", type=int, default=0, metavar="D",
                     help="--kt-file: decoder index of the capture's MoE layer 0 (DeepSeek-V3: 3, its "
                     "first_k_dense_replace); the file's first D rows are dense, zero (default 0)")
    cmd.add_argument("--num-hidden-layers", type=positive, metavar="H",
                     help="--kt-file: the model's num_hidden_layers (default D + the capture's layers); sglang-kt "
                     "takes every layer from D on as MoE, so layers past the capture's get no GPU expert")
    cmd.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the output to FILE instead of stdout")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run, args))


def _run(args: argparse.Namespace) -> int:
    if args.total_slots is not None:
        return _run_budgets(args)
    try:
        expert_bytes = parse_bytes(args.expert_bytes) if args.expert_bytes is not None else None
        names = parse_strategies(args.strategy)
        kt_name = parse_strategies([args.kt_strategy])[0]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.budget_bytes is not None:
        if expert_bytes is None:
            raise UsageError("--budget-bytes needs --expert-bytes (how many bytes one expert takes)")
        try:
            budget = parse_bytes(args.budget_bytes) // expert_bytes
        except ValueError as exc:
            raise UsageError(str(exc).replace("expert size", "budget")) from None
    else:
        budget = args.gpu_experts
        if budget < 0:
            raise UsageError(f"--gpu-experts must be >= 0, got {budget}")
    if args.shared:
        raise UsageError("--shared belongs to --total-slots (a dynamic cache); GPU sets are static")
    if args.kt_file is not None and kt_name not in names:
        names.append(kt_name)
    capture, _ = read_capture(args.capture)
    doc = gpu_experts_report(capture, budget, names, batch=args.batch or 1, fit=args.fit,
                             expert_bytes=expert_bytes)
    if args.kt_file is not None:
        doc["kt"] = _write_kt(args, doc, kt_name)
    if args.json:
        emit(json.dumps(doc) + "\n", args.output)
    else:
        emit("".join(line + "\n" for line in gpu_lines(doc)), args.output)
    return 0


def _write_kt(args: argparse.Namespace, doc: dict[str, Any], name: str) -> dict[str, Any]:
    from ..offload.ktransformers import write_kt_file

    mask = np.zeros((doc["num_layers"], doc["num_experts"]), dtype=bool)
    for layer, experts in enumerate(doc["results"][name]["experts"]):
        mask[layer, experts] = True
    try:
        flags = write_kt_file(args.kt_file, mask, first_moe_layer=args.first_moe_layer,
                              num_hidden_layers=args.num_hidden_layers)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.kt_file}: {exc.strerror or exc}") from None
    hidden = args.num_hidden_layers or args.first_moe_layer + doc["num_layers"]
    return {"file": args.kt_file, "strategy": name, "first_moe_layer": args.first_moe_layer,
            "num_hidden_layers": hidden, "flags": flags}


def _run_budgets(args: argparse.Namespace) -> int:
    for flag, given in (("--kt-file", args.kt_file), ("--expert-bytes", args.expert_bytes)):
        if given is not None:
            raise UsageError(f"{flag} belongs to GPU sets (--gpu-experts), not to --total-slots")
    if args.batch is not None and not args.shared:
        raise UsageError("--total-slots --batch forms the iterations a shared cache sees: add --shared")
    capture, _ = read_capture(args.capture)
    doc = budget_report(capture, args.total_slots, args.policy, fit=args.fit, shared=args.shared,
                        batch=args.batch)
    if args.json:
        emit(json.dumps(doc) + "\n", args.output)
    else:
        emit("".join(line + "\n" for line in budget_lines(doc)), args.output)
    return 0


def _fmt(value: Optional[float], pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def _window_words(doc: dict[str, Any]) -> str:
    if doc["fit"] is None:
        return "chosen and judged on the whole trace (in sample; --fit F judges out of sample)"
    split = "whole sequences" if doc.get("split") and "sequences" in doc["split"] else "passes"
    return f"chosen from the first {doc['fit']} of each layer's {split}, judged on the rest"


def gpu_lines(doc: dict[str, Any]) -> list[str]:
    """The text report of a ``gpu_experts_report`` document: one row per strategy."""
    total = doc["num_layers"] * doc["num_experts"]
    share = doc["gpu_experts"] / total
    size = f" ({doc['gpu_bytes']} bytes)" if doc["gpu_bytes"] is not None else ""
    lines = [f"GPU experts: {doc['gpu_experts']} of {doc['num_layers']} layers x {doc['num_experts']} "
             f"({100 * share:.1f}%){size}, top_k {doc['top_k']}, serving steps of {doc['batch']} "
             f"pass{'es' if doc['batch'] != 1 else ''}; "
             + _window_words(doc)]
    sample = "test" if doc["fit"] is not None else "fit"
    head = ["strategy", "per layer", "CPU/token fit", "CPU/token test", "union/step fit", "union/step test",
            "GPU share", "CPU-free steps"]
    rows = [["(all on CPU)", "0", _fmt(doc["all_cpu"]["fit"]["cpu_experts_per_token"]),
             _fmt((doc["all_cpu"]["test"] or {}).get("cpu_experts_per_token")),
             _fmt(doc["all_cpu"]["fit"]["cpu_union_per_step"]),
             _fmt((doc["all_cpu"]["test"] or {}).get("cpu_union_per_step")), "-", "-"]]
    for name in doc["strategies"]:
        res = doc["results"][name]
        test = res["test"] or {}
        low, high = min(res["per_layer"]), max(res["per_layer"])
        rows.append([name, str(low) if low == high else f"{low}-{high}",
                     _fmt(res["fit"]["cpu_experts_per_token"]), _fmt(test.get("cpu_experts_per_token")),
                     _fmt(res["fit"]["cpu_union_per_step"]), _fmt(test.get("cpu_union_per_step")),
                     _fmt(res[sample]["gpu_share"], True), _fmt(res[sample]["cpu_free_steps"], True)])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for row in [head] + rows:
        lines.append("  " + row[0].ljust(widths[0]) + "".join(c.rjust(w + 2) for c, w in zip(row[1:], widths[1:])))
    lines.append(f"CPU/token: CPU experts one token computes through all layers; union/step: distinct CPU "
                 f"experts per step of {doc['batch']}, summed over layers; GPU share and CPU-free steps "
                 f"{'out of' if doc['fit'] is not None else 'in'} sample. Definitions: docs/offload.md.")
    kt = doc.get("kt")
    if kt is not None:
        lines.append(f"wrote {kt['file']}: the {kt['strategy']} set as KTransformers' logical_count "
                     f"[1, {kt['num_hidden_layers']}, {doc['num_experts']}] (MoE layers from "
                     f"{kt['first_moe_layer']}); sglang-kt flags:")
        lines += ["  " + flag for flag in kt["flags"]]
    return lines


def budget_lines(doc: dict[str, Any]) -> list[str]:
    """The text report of a ``budget_report`` document: the optimised split against the even one."""
    lines = [f"expert cache budget: {doc['total_slots']} slots over {doc['num_layers']} layers "
             f"({doc['num_experts']} experts, top_k {doc['top_k']}), {doc['policy']}; split by "
             f"{'marginal greedy (every curve concave)' if doc['method'] == 'greedy' else 'dynamic programme'}"
             f" ({doc['concave_layers']} of {doc['num_layers']} curves concave); " + _window_words(doc)]
    head = ["split", "hit rate fit", "hit rate test", "misses/token fit", "misses/token test"]
    rows = []
    for name in ("optimised", "even"):
        part = doc[name]
        test = part["test"] or {}
        rows.append([name, _fmt(part["fit"]["hit_rate"], True), _fmt(test.get("hit_rate"), True),
                     _fmt(part["fit"]["misses_per_token"]), _fmt(test.get("misses_per_token"))])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for row in [head] + rows:
        lines.append("  " + row[0].ljust(widths[0]) + "".join(c.rjust(w + 2) for c, w in zip(row[1:], widths[1:])))
    lines.append("optimised slots per layer: " + " ".join(str(c) for c in doc["optimised"]["slots"]))
    return lines
