"""``turbospark analyze FILES...`` and ``analyze --dask ADDRESS|local FILES...``: the report of the files'
merge from per-(file, layer) tasks, here or on a Dask cluster (``metrics/distributed.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..metrics.layers import DEFAULT_WINDOWS
from ..metrics.report import format_report

__all__ = ["analyze_many"]

# Options of analyze that read one whole capture; the report of many files does not decompose them.
_SINGLE = (("self_test", "--self-test"), ("placement", "--placement"), ("holdout", "--holdout"),
           ("gpus", "--gpus"), ("dispatch", "--dispatch"))


def analyze_many(args: argparse.Namespace) -> int:
    """Print the report (``--json``: the document) of ``args.capture``'s merge; returns the exit status:
    0, 1 when a check fails, 2 when the job cannot run (named on stderr)."""
    from ..metrics.distributed import analyze_files, connect, dask_runner

    given = [flag for name, flag in _SINGLE if getattr(args, name) not in (None, False)]
    if given or args.first_moe_layer:
        flags = ", ".join(given + (["--first-moe-layer"] if args.first_moe_layer else []))
        print(f"turbospark: {flags} read one whole capture: with several files or --dask, run them on the "
              "merged capture (turbospark merge FILES... -o merged.json)", file=sys.stderr)
        return 2
    client: Any = None
    cluster: Any = None
    try:
        if args.dask is not None:
            client, cluster = connect(args.dask)
        run = None if client is None else dask_runner(client)
        result, heading = analyze_files(args.capture, args.window or DEFAULT_WINDOWS, args.cache or (), run=run,
                                        verify=args.verify)
    except (ImportError, ValueError) as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(format_report(heading, result))
    ok = result["checks"]["counts_sum_ok"] and result["checks"]["trace_matches_counts"] is not False
    return 0 if ok else 1
