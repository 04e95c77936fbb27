"""``turbospark compare`` and ``turbospark merge``: two captures side by side, and per-rank captures joined."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._io import UsageError, add_verify, emit, emit_pieces, read_capture, run_guarded
from ..metrics.compare import compare, compare_lines, geometry_mismatch

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    """Add ``compare`` and ``merge`` to the subcommand set ``commands``."""
    cmd = commands.add_parser(
        "compare", help="per-layer divergence between two captures, and whether A's expert sets serve B",
        description="Compare two captures of the same model (e.g. two workloads): per layer, the "
        "Jensen-Shannon divergence of the expert distributions, the overlap of the sets holding 90% "
        "of selections, and the share of B's selections and whole passes that A's 90% set covers.",
    )
    cmd.add_argument("a", metavar="A", help="capture JSON file")
    cmd.add_argument("b", metavar="B", help="capture JSON file")
    cmd.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    add_verify(cmd)
    cmd.set_defaults(run=lambda args: run_guarded(_run_compare, args))

    merge = commands.add_parser(
        "merge", help="join the per-rank captures of one run into one capture",
        description="Merge captures of one run (one per rank): counts are summed; traces, "
        "predictions and sequence ids are kept apart as separate sequences (counts-only captures "
        "keep sequence ids only when all of them have some). Any grouping of merges gives the same bytes.",
    )
    merge.add_argument("inputs", metavar="CAPTURE", nargs="+", help="capture JSON files (at least two)")
    merge.add_argument("-o", "--output", metavar="FILE", required=True, help="merged capture to write")
    add_verify(merge)
    merge.set_defaults(run=lambda args: run_guarded(_run_merge, args))


def _run_compare(args: argparse.Namespace) -> int:
    a, _ = read_capture(args.a)
    b, _ = read_capture(args.b)
    problem = geometry_mismatch(a, b, args.a, args.b)
    if problem is not None:
        raise UsageError(problem)
    doc = compare(a, b)
    if args.json:
        sys.stdout.write(json.dumps({"a": args.a, "b": args.b, **doc}) + "\n")
    else:
        sys.stdout.write("".join(line + "\n" for line in compare_lines(doc, args.a, args.b)))
    return 0


def _run_merge(args: argparse.Namespace) -> int:
    from ..capture.merge import dropped_sequences, merged_pieces

    if len(args.inputs) < 2:
        raise UsageError("merge needs at least two captures")
    inputs = []
    for path in args.inputs:
        capture, seqs = read_capture(path, with_sequences=True)
        inputs.append((path, capture, seqs))
    emit_pieces(merged_pieces(inputs), args.output)
    dropped = dropped_sequences(inputs)
    if dropped is not None:
        print(f"turbospark: note: {', '.join(dropped)} hold no sequence tags (seq/phase), so the merged "
              "counts-only capture carries none", file=sys.stderr)
    print(f"merged {len(args.inputs)} captures into {args.output}")
    return 0
