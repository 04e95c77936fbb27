"""``turbospark cache``: expert-cache hit rates per policy and size, against Belady's optimum."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Callable

from ._io import UsageError, add_verify, draw_document, emit, read_capture, run_guarded
from ..offload.cache import DEFAULT_POLICIES, POLICIES, cache_report, parse_policies, parse_slots

__all__ = ["add_command", "cache_lines", "draw_cache", "parse_bytes"]

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "kb": 10**3, "mb": 10**6, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}
_BYTES = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"12582912"``, ``"12MiB"``, ``"12M"`` (10**6) as a whole number of bytes >= 1; raises ``ValueError``."""
    match = _BYTES.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or int(match.group(1)) < 1:
        raise ValueError(f"bad expert size {text!r}: give whole bytes >= 1, optionally with "
                         "k, M, G (powers of 1000) or KiB, MiB, GiB")
    return int(match.group(1)) * _UNITS[unit]


def add_command(commands: Any, positive: Callable[[str], int]) -> None:
    """Add ``cache`` to the subcommand set ``commands``."""
    cmd = commands.add_parser(
        "cache",
        help="hit rate of a per-layer expert cache of C slots per policy (LRU, LFU, pilot prefetch), "
        "against Belady's optimum",
        description="Simulate a GPU expert cache of C slots per layer on the capture's trace: a pass needs "
        "its top-k experts resident, a miss loads one, evicting by the policy. Reports hit rate, misses "
        "and bytes per token per policy and size; belady is the exact optimum of any demand policy. "
        "Needs the trace; pilot policies need predictions (docs/cache.md).",
    )
    cmd.add_argument("capture", metavar="CAPTURE", help="capture JSON file")
    cmd.add_argument("--slots", action="extend", nargs="+", metavar="C",
                     help="cache sizes: C, or a range A:B (every size) or A:B:S (step S); repeatable "
                     "(default top_k x 1, 2, 4, 8 and num_experts)")
    cmd.add_argument("--policy", default=",".join(DEFAULT_POLICIES), metavar="P[,P...]",
                     help=f"comma-separated, from {', '.join(POLICIES)}; pilot = pilot+lru "
                     f"(default {','.join(DEFAULT_POLICIES)})")
    cmd.add_argument("--expert-bytes", metavar="B",
                     help="bytes of one expert's weights (12MiB, 12M, 12582912): adds bytes per token")
    cmd.add_argument("--shared", action="store_true",
                     help="one cache per layer shared by all sequences, in serving order "
                     "(default: one cache per sequence)")
    cmd.add_argument("--batch", type=positive, metavar="B",
                     help="with --shared: serve the passes in the iterations continuous batching with "
                     "B rows forms, as place --batch does (default: the recorder's order)")
    cmd.add_argument("--json", action="store_true", help="print the JSON document instead of the tables")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the output to FILE instead of stdout")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run_cache, args))


def _run_cache(args: argparse.Namespace) -> int:
    try:
        slots = parse_slots(args.slots) if args.slots else None
        policies = parse_policies(args.policy)
        expert_bytes = parse_bytes(args.expert_bytes) if args.expert_bytes is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    capture, _ = read_capture(args.capture)
    doc = cache_report(capture, slots, policies, expert_bytes=expert_bytes, shared=args.shared,
                       batch=args.batch)
    if args.json:
        emit(json.dumps(doc) + "\n", args.output)
    else:
        emit("".join(line + "\n" for line in cache_lines(doc)), args.output)
    return 0


def draw_cache(path: str, output: str) -> int:
    """``plot --cache``: draw the cache document at ``path`` into ``output``; returns the exit status."""
    from ..outputs.plot_cache import plot_cache, read_cache_document

    return draw_document(path, output, read_cache_document, plot_cache)


def cache_lines(doc: dict[str, Any]) -> list[str]:
    """The text report of a ``cache_report`` document: one table per figure, sizes down, policies across."""
    model = doc["model"]
    streams = max((entry["streams"] for entry in doc["layers"]), default=0)
    if doc["shared"] and doc["batch"] and doc.get("batches") == "consecutive passes":
        how = (f"one cache per layer shared by all passes, in the recorder's order (no sequence tags: "
               f"iterations of {doc['batch']} consecutive passes keep it)")
    elif doc["shared"]:
        how = ("one cache per layer shared by all sequences, "
               + (f"in serving iterations of {doc['batch']} rows" if doc["batch"] else "in the recorder's order"))
    elif streams > 1:
        how = f"one cache per layer per sequence (up to {streams} sequences per layer)"
    else:
        how = "one cache per layer over the whole trace (no sequence tags)"
    lines = [f"expert cache: {model['routed_layers']} routed layers, {doc['num_experts']} experts, "
             f"top_k {doc['top_k']}; {how}"]
    names = doc["policies"]
    lines += _table("hit rate, mean over routed layers", doc["slots"], names, model["hit_rate"], _pct)
    lines += _table("demand misses per token, all routed layers", doc["slots"], names,
                    model["misses_per_token"], lambda v: f"{v:.2f}")
    if model["bytes_per_token"] is not None:
        lines += _table(f"bytes loaded per token (demand + prefetch), {_size(doc['expert_bytes'])} per expert",
                        doc["slots"], names, model["bytes_per_token"], _size)
    for name, figures in (model.get("prefetch") or {}).items():
        useful = ", ".join(f"{v:.2f}" for v in figures["useful_per_token"])
        wasted = ", ".join(f"{v:.2f}" for v in figures["wasted_per_token"])
        lines.append(f"{name} prefetches per token at each size: useful {useful}; wasted {wasted}")
    for name, reason in (model.get("why") or {}).items():
        lines.append(f"{name}: not computed: {reason}")
    lines.append("belady: the optimum of any demand policy (evicts the expert used farthest ahead); "
                 "prefetch policies load extra experts and can exceed it. Definitions: docs/cache.md.")
    return lines


def _table(title: str, sizes: list[int], names: list[str], values: dict[str, Any],
           fmt: Callable[[float], str]) -> list[str]:
    cells = [[_cell(values.get(name), i, fmt) for name in names] for i in range(len(sizes))]
    width = 2 + max([len(n) for n in names] + [len(cell) for row in cells for cell in row])
    first = max([5] + [len(str(c)) for c in sizes])  # a size wider than the heading widens its column
    out = [title + ":", "  " + "slots".rjust(first) + "".join(n.rjust(width) for n in names)]
    for c, row in zip(sizes, cells):
        out.append(f"  {c:>{first}}" + "".join(cell.rjust(width) for cell in row))
    return out


def _cell(row: Any, i: int, fmt: Callable[[float], str]) -> str:
    value = None if row is None else row[i]
    return "-" if value is None else fmt(value)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"
