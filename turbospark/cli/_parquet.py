"""``turbospark export CAPTURE... --to parquet -o DIR``: the captures' passes as a hive-partitioned Parquet dataset."""

from __future__ import annotations

import argparse
import sys
from typing import Iterator

from ._io import UsageError, read_capture
from ..capture.reader import Capture

__all__ = ["export_parquet_command"]


def export_parquet_command(args: argparse.Namespace) -> int:
    """Run the export; returns 0. Raises ``UsageError`` (exit 2) naming what stops it."""
    from ..outputs.parquet import MissingPyarrow, export_parquet

    if args.output in (None, "-"):
        raise UsageError("--to parquet writes a directory of files: give -o DIR (like -o routing.parquet)")
    rank = 0 if args.rank is None else args.rank
    try:
        written = export_parquet(_captures(args.capture), args.output, first_rank=rank)
    except MissingPyarrow as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    for part in written:
        beyond = [(layer, n) for layer, n in enumerate(part.unaligned_predictions) if n]
        if beyond:
            listed = ", ".join(f"layer {layer} {n}" for layer, n in beyond)
            print(f"turbospark: note: {part.source} holds predictions beyond its passes, not exported "
                  f"(no pass to align them with; analyze ignores them too): {listed}", file=sys.stderr)
    rows = sum(sum(part.passes) for part in written)
    ranks = f"rank {written[0].rank}" if len(written) == 1 else f"ranks {written[0].rank}-{written[-1].rank}"
    print(f"wrote {args.output}: {rows} passes of {len(written)} capture{'s' if len(written) > 1 else ''} "
          f"({ranks}) x {len(written[0].passes)} layers, one file per rank and layer")
    return 0


def _captures(paths: list[str]) -> Iterator[tuple[str, Capture]]:
    # One capture loaded at a time: the export holds only the one it writes.
    for path in paths:
        yield path, read_capture(path)[0]
