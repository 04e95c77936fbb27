"""The ``turbospark`` command: ``analyze``, ``plot``, ``demo``; ``place``, ``export`` (``_place``);
``compare``, ``merge`` (``_tools``); ``cache`` (``_cache``); ``offload`` (``_offload``); ``rebalance``
(``_rebalance``); ``llama-plan`` (``_llama_plan``).

Exit status: 0 when everything asked for holds; 1 when a capture check (or
``--self-test``) fails, the report still printed; 2 when the job could not be
done at all (unreadable or malformed capture, matplotlib missing for
``plot``, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence, TextIO

from .. import __version__
from ..metrics.layers import DEFAULT_WINDOWS, analyze, self_test
from ..capture.reader import Capture, load
from ..metrics.report import format_report
from ..capture.streamed import DamagedCapture
from ._io import add_verify, verify_requested

__all__ = ["main"]

EXIT_OK, EXIT_CHECK_FAILED, EXIT_UNUSABLE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Raises ``SystemExit`` for malformed arguments (status 2), ``--help`` and
    ``--version`` (status 0), as argparse does.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_UNUSABLE
    from ._io import verifying

    try:
        with verifying(getattr(args, "verify", False)):
            return int(args.run(args))
    except BrokenPipeError:
        # `turbospark analyze ... | head`: the reader left; exit quietly, and
        # point stdout at devnull so the interpreter's final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CHECK_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turbospark",
        description="Analyse Mixture-of-Experts router captures written by RouterHistogram.",
    )
    parser.add_argument("--version", action="version", version=f"turbospark {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    analyze_cmd = commands.add_parser(
        "analyze",
        aliases=["analyse"],
        help="per-layer concentration, window-distinct experts, reuse, pilot recall, LRU hit rate",
        description="Analyse a capture; prints a per-layer table and a summary, or JSON.",
    )
    analyze_cmd.add_argument("capture", metavar="CAPTURE", nargs="+",
                             help="capture JSON file; several: the report of their merge (turbospark merge), "
                             "computed per file and layer without merging")
    _add_analysis_options(analyze_cmd)
    add_verify(analyze_cmd)
    analyze_cmd.add_argument("--dask", metavar="ADDRESS",
                             help="run the per-(file, layer) tasks on a Dask cluster: a scheduler address "
                             "(tcp://host:8786), or local for a LocalCluster here (needs pip install "
                             "'turbospark[dask]'; see docs/dask.md)")
    analyze_cmd.add_argument(
        "--self-test",
        action="store_true",
        help="also require pilot recall 1.0 on every layer with predictions "
        "(a capture made with pilot='self' checks the probe's wiring)",
    )
    from ._analyze_extras import add_options
    from ._place import fraction

    add_options(analyze_cmd, _positive, fraction)
    analyze_cmd.set_defaults(run=_run_analyze)

    plot_cmd = commands.add_parser(
        "plot",
        help="heatmap, window-distinct curve and pilot recall in one PNG (needs matplotlib)",
        description="Draw a capture: layer x expert selection share, distinct experts per "
        "window of M passes against uniform routing, pilot recall per layer against random.",
    )
    plot_cmd.add_argument("capture", metavar="CAPTURE", nargs="?", help="capture JSON file")
    plot_cmd.add_argument(
        "-o", "--output", metavar="FILE.png", help="image to write (default: CAPTURE with .png)"
    )
    plot_cmd.add_argument(
        "--placement", metavar="FILE",
        help="instead of a capture, draw a placement's per-layer imbalance before and after, "
        "in and out of sample (turbospark place's JSON)",
    )
    plot_cmd.add_argument(
        "--cache", metavar="FILE",
        help="instead of a capture, draw hit rate against cache size per policy, Belady as the "
        "ceiling (turbospark cache's --json output)",
    )
    plot_cmd.add_argument(
        "--rebalance", metavar="FILE",
        help="instead of a capture, draw per-step imbalance over time and the sweep's Pareto front "
        "(turbospark rebalance's -o FILE)",
    )
    plot_cmd.add_argument(
        "--max-window", type=_positive, default=16, metavar="M",
        help="largest window M on the window-distinct curve (default 16)",
    )
    add_verify(plot_cmd)
    plot_cmd.set_defaults(run=_run_plot)

    from .demo import DEFAULTS  # light: no recorder import until the demo runs

    demo_cmd = commands.add_parser(
        "demo",
        help="simulate a MoE decode loop, record it, and analyse the capture",
        description="Simulate MoE routing (skewed expert popularity, pass-to-pass reuse, a "
        "one-layer-ahead predictor), record it with the real recorder (trace and pilot on), "
        "write the capture and print its analysis.",
    )
    demo_cmd.add_argument("--out", default=DEFAULTS["out"], metavar="PATH",
                          help=f"capture to write (default {DEFAULTS['out']})")
    demo_cmd.add_argument("--layers", type=_positive, default=DEFAULTS["layers"],
                          help=f"default {DEFAULTS['layers']}")
    demo_cmd.add_argument("--experts", type=_positive, default=DEFAULTS["experts"],
                          help=f"default {DEFAULTS['experts']}")
    demo_cmd.add_argument("--top-k", type=_positive, default=DEFAULTS["top_k"],
                          help=f"default {DEFAULTS['top_k']}")
    demo_cmd.add_argument("--passes", type=_positive, default=DEFAULTS["passes"],
                          help=f"decode passes (default {DEFAULTS['passes']})")
    demo_cmd.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                          help=f"default {DEFAULTS['seed']}")
    demo_cmd.add_argument("--pilot", choices=("next", "self"), default="next",
                          help="probe mode: predict the next layer (default) or, as a wiring "
                          "self-test, the layer itself")
    _add_analysis_options(demo_cmd)
    demo_cmd.add_argument("--drift", type=int, default=0, metavar="D",
                          help="reshuffle each layer's popular experts every D passes, so the hot experts move "
                          "(default 0: never; for turbospark rebalance, see docs/rebalance.md)")
    demo_cmd.set_defaults(run=_run_demo)

    from . import _cache, _llama_plan, _offload, _place, _rebalance, _tools

    _place.add_commands(commands, _positive)
    _tools.add_commands(commands)
    _cache.add_command(commands, _positive)
    _offload.add_command(commands, _positive)
    _rebalance.add_command(commands, _positive)
    _llama_plan.add_command(commands, _positive)
    _add_record_command(commands)
    return parser


def _add_record_command(commands: Any) -> None:
    record_cmd = commands.add_parser(
        "record",
        help="generate with a local transformers MoE checkpoint and record its routing (needs the transformers extra)",
        description="Load a transformers checkpoint from a local folder (nothing is downloaded), generate "
        "greedily from the prompts (do_sample=False, num_beams=1, whatever the checkpoint's generation_config "
        "says), write the capture and print its analysis. Progress goes to stderr.",
    )
    record_cmd.add_argument("model_dir", metavar="MODEL_DIR", help="folder written by save_pretrained (model and tokenizer)")
    source = record_cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="one prompt")
    source.add_argument("--prompts", metavar="FILE", help="a text file, one prompt per non-empty line")
    record_cmd.add_argument("--max-new-tokens", type=_positive, default=128, metavar="N", help="default 128")
    record_cmd.add_argument("--batch-size", type=_positive, default=1, metavar="B",
                            help="prompts per generate call, left-padded (default 1)")
    record_cmd.add_argument("--trace", action="store_true", help="keep every pass's ids (window, reuse, LRU need it)")
    record_cmd.add_argument("--pilot", choices=("next", "self"), help="run the pilot probe")
    record_cmd.add_argument("-o", "--output", required=True, metavar="CAPTURE", help="capture JSON to write")
    _add_analysis_options(record_cmd)
    record_cmd.set_defaults(run=_run_record)


def _run_record(args: argparse.Namespace) -> int:
    try:
        from ..transformers._cli import record
    except ImportError as exc:
        print(f"turbospark record: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if not record(args):
        return EXIT_UNUSABLE
    capture = _load(args.output)
    if capture is None:
        return EXIT_UNUSABLE
    return _report(capture, args, self_testing=args.pilot == "self")


def _add_analysis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window", type=_positive, action="append", metavar="M",
        help="window of M consecutive passes for distinct-expert counts; repeatable "
        f"(default {', '.join(map(str, DEFAULT_WINDOWS))})",
    )
    parser.add_argument(
        "--cache", type=_positive, action="append", metavar="C",
        help="simulate a C-slot LRU expert cache per layer; repeatable (needs the trace)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of the table")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _load(path: str) -> Capture | None:
    try:
        return load(path, verify=verify_requested())
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"turbospark: cannot read {path}: {detail}", file=sys.stderr)
        return None


def _run_analyze(args: argparse.Namespace) -> int:
    from ._analyze_extras import extras

    if args.dask is not None or len(args.capture) > 1:
        from ._analyze_many import analyze_many

        return analyze_many(args)
    capture = _load(args.capture[0])
    if capture is None:
        return EXIT_UNUSABLE
    try:
        extra = extras(capture, args)
    except ValueError as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        return _report(capture, args, self_testing=args.self_test, extra=extra)
    except DamagedCapture as exc:
        print(f"turbospark: cannot read {args.capture[0]}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE


def _report(capture: Capture, args: argparse.Namespace, *, self_testing: bool = False, extra: Any = None) -> int:
    """Analyse and print (with ``extra``: keys and lines from ``_analyze_extras``);
    returns the exit status the checks call for."""
    result = analyze(capture, args.window or DEFAULT_WINDOWS, args.cache or ())
    out = sys.stdout
    if extra is not None:
        result.update(extra.doc)
    if args.json:
        out.write(json.dumps(result) + "\n")
    else:
        out.write(format_report(capture, result))
        if extra is not None:
            out.write("".join(line + "\n" for line in extra.lines))
    ok = result["checks"]["counts_sum_ok"] and result["checks"]["trace_matches_counts"] is not False
    if self_testing:
        # With --json, stdout carries the document alone; the verdict goes to stderr.
        ok = _print_self_test(capture, result, sys.stderr if args.json else out) and ok
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def _print_self_test(capture: Capture, result: dict[str, Any], out: TextIO) -> bool:
    checked, failed = self_test(capture, result)
    if not checked:
        print(
            "SELF-TEST FAILED: no layer after layer 0 holds predictions "
            "(record with pilot='self' and trace=True)",
            file=out,
        )
        return False
    if failed:
        details = ", ".join(
            f"{layer} ({_recall(result['layers'][layer]['pilot_recall'])})" for layer in failed
        )
        print(
            f"SELF-TEST FAILED: pilot recall is not 100% on layer(s) {details}; "
            "in self mode the probe reproduces the router, so it is mis-wired there "
            "(or the capture was made with pilot='next')",
            file=out,
        )
        return False
    print(f"self-test: pilot recall 100% on all {len(checked)} layers with predictions: ok", file=out)
    return True


def _recall(value: float | None) -> str:
    return "no trace to compare" if value is None else f"{value:.1%}"


def _run_plot(args: argparse.Namespace) -> int:
    from ..outputs.plot import MissingMatplotlib, plot_capture

    if sum(x is not None for x in (args.capture, args.placement, args.cache, args.rebalance)) != 1:
        print("turbospark: plot takes a CAPTURE, --placement FILE, --cache FILE or --rebalance FILE (one of them)",
              file=sys.stderr)
        return EXIT_UNUSABLE
    if args.rebalance is not None:
        from ._io import draw_document
        from ..outputs.plot_rebalance import plot_rebalance, read_rebalance

        return draw_document(args.rebalance, args.output or _png_beside(args.rebalance), read_rebalance,
                             plot_rebalance)
    if args.cache is not None:
        from ._cache import draw_cache

        return draw_cache(args.cache, args.output or _png_beside(args.cache))
    if args.placement is not None:
        from ._place import draw_placement

        return draw_placement(args.placement, args.output or _png_beside(args.placement))
    capture = _load(args.capture)
    if capture is None:
        return EXIT_UNUSABLE
    output = args.output or _png_beside(args.capture)
    # matplotlib picks the format from the suffix and, without one, silently
    # appends ".png": add it here, so the message names the file written.
    added = not os.path.splitext(output)[1]
    if added:
        output += ".png"
    try:
        plot_capture(capture, output, title=os.path.basename(args.capture), max_window=args.max_window)
    except MissingMatplotlib as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except OSError as exc:
        print(f"turbospark: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except DamagedCapture as exc:
        print(f"turbospark: cannot read {args.capture}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except ValueError as exc:  # an image format matplotlib does not know
        print(f"turbospark: cannot write {output}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(f"wrote {output}" + (f" ({args.output!r} has no extension: PNG)" if added else ""))
    return EXIT_OK


def _png_beside(path: str) -> str:
    stem = path[: -len(".json")] if path.endswith(".json") else path
    return stem + ".png"


def _run_demo(args: argparse.Namespace) -> int:
    from ._progress import progress_on
    from .demo import NEXT_STEPS, CaptureNotWritten, run_demo

    if args.top_k > args.experts:
        print(f"turbospark: --top-k {args.top_k} exceeds --experts {args.experts}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.drift < 0:
        print(f"turbospark: --drift must be 0 or more passes, got {args.drift}", file=sys.stderr)
        return EXIT_UNUSABLE
    progress = progress_on(sys.stderr, args.passes, "demo: simulating and recording passes")
    try:
        capture = run_demo(
            args.out,
            layers=args.layers,
            experts=args.experts,
            top_k=args.top_k,
            passes=args.passes,
            seed=args.seed,
            pilot=args.pilot,
            progress=progress,
            drift=args.drift,
        )
    except CaptureNotWritten:
        return EXIT_UNUSABLE  # the recorder has said why, once
    except OSError as exc:
        print(f"turbospark: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        if progress is not None:
            progress.finish()
    status = _report(capture, args, self_testing=args.pilot == "self")
    # With --json, stdout carries the document alone.
    print("\n" + NEXT_STEPS, file=sys.stderr if args.json else sys.stdout)
    return status
