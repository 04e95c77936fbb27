"""The EPLB replay at scale: ``turbospark rebalance`` on a streamed capture of 2 M passes, 60 layers x 256
experts, top-8, with recorded engine steps; its time and peak memory, one setting and a sweep.

Run: ``python benchmarks/bench_rebalance_scale.py [--passes 2000000] [--batch 256] [--dir DIR]``.

The capture is recorded by ``RouterHistogram(..., trace="stream")`` in a child
process: each engine step is ``--batch`` passes of every layer (``record_many``
per layer), then ``mark_step()``, so the replay uses the recorded steps. The
routing drifts: every layer's expert popularity (Zipf) is reshuffled every
quarter of the capture; a step's rows come from a pool of 16 random blocks per
layer and quarter (drawing ids costs nothing in the timing). Then, each in a
fresh child process (its peak RSS, ``VmHWM``, is that command's alone, the
interpreter and numpy included):

* ``rebalance --gpus 8 --engine vllm`` with one setting (R = 32, W = 40, I = 100);
* ``rebalance --sweep`` of 8 settings (R in {0, 32} x W in {10, 40} x I in {100, 400});
* ``--engine sglang`` with the first setting.

The comparison is the replay's own rate: routed ids per second, and the
sidecar's bytes against each command's peak memory (bounded memory means the
peak does not grow with the passes: run with ``--passes 500000`` beside 2 M to see it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_scale  # noqa: E402 (its child runner and memory readings: one definition)
from bench_scale import _peak_mib, _status_mib  # noqa: E402

LAYERS, EXPERTS, TOP_K, POOL = 60, 256, 8, 16

COMMANDS = {
    "vllm, one setting": ["--engine", "vllm", "--num-redundant-experts", "32", "--window-size", "40",
                          "--step-interval", "100"],
    "vllm, sweep of 8": ["--engine", "vllm", "--sweep", "--num-redundant-experts", "0,32", "--window-size", "10,40",
                         "--step-interval", "100,400"],
    "sglang, one setting": ["--engine", "sglang", "--num-redundant-experts", "32", "--window-size", "40",
                            "--step-interval", "100"],
}


def _record(path: str, passes: int, batch: int) -> dict[str, float]:
    import numpy as np

    from turbospark import RouterHistogram

    rng = np.random.default_rng(0)
    weight = 1.0 / np.arange(1, EXPERTS + 1)
    pools = []
    for _ in range(4):  # per quarter of the capture, per layer: blocks drawn from a reshuffled popularity
        quarter = []
        for _ in range(LAYERS):
            p = rng.permutation(weight)
            keys = np.log(p / p.sum()) + rng.gumbel(size=(POOL, batch, EXPERTS))
            quarter.append(np.argpartition(-keys, TOP_K - 1, axis=2)[:, :, :TOP_K].astype(np.int64))
        pools.append(quarter)
    hist = RouterHistogram(path, LAYERS, EXPERTS, TOP_K, trace="stream")
    before = _status_mib("VmRSS")
    started = time.perf_counter()
    done = steps = 0
    while done < passes:
        rows = min(batch, passes - done)
        quarter = pools[min(3, 4 * done // passes)]
        for layer in range(LAYERS):
            hist.record_many(layer, quarter[layer][steps % POOL][:rows])
        hist.mark_step()
        done += rows
        steps += 1
    hist.close()
    took = time.perf_counter() - started
    size = os.path.getsize(path) + os.path.getsize(path + ".trace")
    return {"seconds": took, "steps": steps, "bytes": size, "rss": _peak_mib(), "grown": _peak_mib() - before}


def _command(path: str, name: str) -> dict[str, float]:
    from turbospark.cli import main

    out = path + ".rebalance.json"
    argv = ["rebalance", path, "--gpus", "8", "--json", "-o", out, *COMMANDS[name]]
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    took = time.perf_counter() - started
    with open(out) as handle:
        settings = len(json.load(handle)["settings"])
    os.remove(out)
    return {"status": status, "seconds": took, "rss": _peak_mib(), "settings": settings}


def _child(*args: str) -> dict[str, float]:
    return bench_scale._child(*args, script=__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dir", default=None, help="where the capture goes (default: a temporary directory)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path, *rest = args.child
        result = _record(path, int(rest[0]), int(rest[1])) if kind == "record" else _command(path, rest[0])
        print(json.dumps(result))
        return
    directory = args.dir or tempfile.mkdtemp(prefix="bench-rebalance-scale-")
    try:
        path = os.path.join(directory, "capture.json")
        made = _child("record", path, str(args.passes), str(args.batch))
        ids = LAYERS * args.passes * TOP_K
        print(f"capture: {LAYERS} layers x {EXPERTS} experts, top-{TOP_K}, {args.passes:,} passes in "
              f"{made['steps']:,} recorded steps of {args.batch}; streamed, {made['bytes'] / 2**20:,.0f} MiB on disk; "
              f"recorded in {made['seconds']:.1f} s, peak {made['rss']:.0f} MiB")
        print(f"{'command':<22} {'settings':>8} {'seconds':>8} {'s/setting':>9} {'M ids/s':>8} {'peak MiB':>9}")
        for name in COMMANDS:
            got = _child("command", path, name)
            assert got["status"] == 0, (name, got)
            per = got["seconds"] / got["settings"]
            print(f"{name:<22} {got['settings']:>8.0f} {got['seconds']:>8.1f} {per:>9.1f} "
                  f"{ids * got['settings'] / got['seconds'] / 1e6:>8.1f} {got['rss']:>9.0f}")
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
