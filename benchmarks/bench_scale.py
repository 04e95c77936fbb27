"""Long captures: in-memory (``trace=True``) against streamed (``trace="stream"``), at 100 K to 2 M passes.

Run: ``python benchmarks/bench_scale.py [--passes 100000 400000 2000000] [--dir DIR]``.

The shape is issue 18's: 60 layers x 128 experts, top-8, with the trace (no
probe). Every pass of a layer is recorded by ``record_many`` in blocks of
1,024 passes drawn from a pool of 16 random blocks per layer (so drawing
ids costs nothing in the timings). Each case runs in three fresh child
processes, so each peak RSS is that phase's alone:

* record + write: ``record`` is the recording calls, ``write`` the close
  (the JSON, or for a stream: the last chunks made durable and the summary);
  ``rss rec`` its peak resident memory, ``rec +`` that peak less the memory
  just before the first record (the interpreter, numpy and the benchmark's
  own pool of blocks, ~63 MiB, are the rest);
* load: ``turbospark.load`` plus building every layer's trace array (for a
  stream: the memory map's rows; in memory: the JSON parse), with ``MB/s``
  the capture's bytes on disk over that time and ``rss ld`` that process's
  peak (a streamed capture keeps its last 4 built layers);
* analyze (a child of its own): ``turbospark.analyze`` on a fresh load (the
  whole ``analyze --json`` document, default windows), with its rate in ids
  per second; ``rss an`` the peak of that process, load included.

With ``--tagged`` the captures are recorded by ``record_batch`` with
sequence tags instead (256 sequences in flight, each 512 passes of a layer
long, its first 4 passes prompt, the rest decode), streamed only, and every
command is run on each in a child process of its own, its peak RSS reported
(``turbospark.load`` + every layer's trace; ``analyze``; ``place --fit 0.5``;
``place --batch 256``; ``cache --slots 16 32``; ``merge`` of the capture with
itself; ``merge ranks``: ``turbospark merge`` of two rank files, the capture
and a second one recorded beside it from another seed; each from a fresh
load, its output written to the directory and removed).

The comparison is the in-memory capture at the same size, in the same run.
The 2 M case is streamed only (its in-memory trace would need ~4 GiB to
record and ~24 GiB to load). Files go to ``--dir`` (default: a temporary
directory, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

LAYERS, EXPERTS, TOP_K, BLOCK = 60, 128, 8, 1024


def _status_mib(field: str) -> float:
    """A /proc/self/status memory field in MiB: VmHWM (this process's peak: unlike ru_maxrss, not carried
    over exec from the parent) or VmRSS (now)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024


def _peak_mib() -> float:
    return _status_mib("VmHWM")


# --tagged: sequences in flight, and how many blocks of a layer one generation of them lasts.
IN_FLIGHT, GENERATION_BLOCKS = 256, 128


def _record(path: str, passes: int, trace: object, tagged: bool = False, seed: int = 0) -> dict[str, float]:
    import numpy as np

    from turbospark import RouterHistogram

    rng = np.random.default_rng(seed)
    pool = [[np.argsort(rng.random((BLOCK, EXPERTS)), axis=1)[:, :TOP_K].astype(np.int64) for _ in range(16)]
            for _ in range(LAYERS)]
    lanes = np.arange(BLOCK, dtype=np.int64) % IN_FLIGHT
    hist = RouterHistogram(path, LAYERS, EXPERTS, TOP_K, trace=trace)
    before = _status_mib("VmRSS")
    started = time.perf_counter()
    done = 0
    while done < passes:
        rows = min(BLOCK, passes - done)
        generation, step = divmod(done // BLOCK, GENERATION_BLOCKS)
        seq = (generation * IN_FLIGHT + lanes)[:rows]
        for layer in range(LAYERS):
            block = pool[layer][(done // BLOCK) % 16]
            block = block if rows == BLOCK else block[:rows]
            if tagged:
                hist.record_batch(layer, block, seq=seq, phase="prompt" if step == 0 else "decode")
            else:
                hist.record_many(layer, block)
        done += rows
    recorded = time.perf_counter()
    hist.close()
    written = time.perf_counter()
    size = os.path.getsize(path) + (os.path.getsize(path + ".trace") if trace == "stream" else 0)
    return {"record": recorded - started, "write": written - recorded, "bytes": size,
            "rss": _peak_mib(), "grown": _peak_mib() - before}


def _load(path: str) -> dict[str, float]:
    import turbospark

    started = time.perf_counter()
    capture = turbospark.load(path)
    for layer in range(capture.num_layers):
        capture.trace[layer]
    return {"load": time.perf_counter() - started, "rss_load": _peak_mib()}


def _analyze(path: str) -> dict[str, float]:
    import turbospark

    fresh = turbospark.load(path)
    begun = time.perf_counter()
    turbospark.analyze(fresh)
    analyzed = time.perf_counter()
    return {"analyze": analyzed - begun, "rss": _peak_mib()}


def _command(path: str, name: str) -> dict[str, float]:
    """One CLI command on the capture at ``path``, in this (fresh) process: its time and this process's peak."""
    import contextlib
    import io

    from turbospark.cli import main

    out = path + "." + name.replace(" ", "-") + ".out"
    argv = {
        "place --fit": ["place", path, "--gpus", "8", "--slots", "160", "--fit", "0.5", "-o", out],
        "place --batch": ["place", path, "--gpus", "8", "--slots", "160", "--batch", "256", "-o", out],
        "cache": ["cache", path, "--slots", "16", "32", "--json", "-o", out],
        "merge": ["merge", path, path, "-o", out],
        "merge ranks": ["merge", path, _rank1(path), "-o", out],
    }[name]
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    took = time.perf_counter() - started
    size = os.path.getsize(out) if os.path.exists(out) else 0
    for leftover in (out, out + ".trace"):
        if os.path.exists(leftover):
            os.remove(leftover)
    return {"status": status, "seconds": took, "rss": _peak_mib(), "bytes": size}


def _rank1(path: str) -> str:
    """The second rank's capture beside ``path`` (``merge ranks``)."""
    return path[: -len(".json")] + "-rank1.json"


def _child(*args: str, script: str = __file__) -> dict[str, float]:
    """``script --child ARGS`` in a fresh interpreter (its peak memory its own); the JSON it prints."""
    result = subprocess.run([sys.executable, os.path.abspath(script), "--child", *args], check=True,
                            stdout=subprocess.PIPE, text=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, nargs="+", default=[100_000, 400_000, 2_000_000])
    parser.add_argument("--dir", help="where the captures go (default: a temporary directory)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--tagged", action="store_true",
                        help="record_batch with sequence tags, streamed only; every command's peak RSS")
    parser.add_argument("--commands", nargs="+", default=list(_COMMANDS),
                        help="with --tagged: the commands to run after load and analyze (default: all)")
    args = parser.parse_args()
    if args.child:
        what, path = args.child[0], args.child[1]
        if what == "record":
            trace = "stream" if args.child[3] == "stream" else True
            seed = int(args.child[5]) if len(args.child) > 5 else 0
            print(json.dumps(_record(path, int(args.child[2]), trace, len(args.child) > 4, seed)))
        elif what == "command":
            print(json.dumps(_command(path, args.child[2])))
        else:
            print(json.dumps(_load(path) if what == "load" else _analyze(path)))
        return
    directory = args.dir or tempfile.mkdtemp(prefix="turbospark-scale-")
    if args.tagged:
        try:
            _tagged(args.passes, directory, args.commands)
        finally:
            if not args.dir:
                shutil.rmtree(directory, ignore_errors=True)
        return
    print(f"{LAYERS} layers x {EXPERTS} experts, top-{TOP_K}, trace on; one child process per phase")
    print(f"{'passes':>9} {'ids':>6} {'mode':>7} {'record':>7} {'write':>7} {'file':>9} {'rss rec':>8} {'rec +':>7} "
          f"{'load':>7} {'MB/s':>7} {'rss ld':>8} {'analyze':>8} {'M ids/s':>8} {'rss an':>8}")
    try:
        for passes in args.passes:
            for mode in ("memory", "stream"):
                if mode == "memory" and passes > 400_000:
                    continue
                path = os.path.join(directory, f"{mode}-{passes}.json")
                rec = _child("record", path, str(passes), mode)
                an = {**_child("load", path), **_child("analyze", path)}
                ids = passes * LAYERS * TOP_K
                print(f"{passes:>9} {ids / 1e6:>5.0f}M {mode:>7} {rec['record']:>6.2f}s {rec['write']:>6.2f}s "
                      f"{rec['bytes'] / 2**20:>6.0f}MiB {rec['rss']:>5.0f}MiB {rec['grown']:>4.0f}MiB {an['load']:>6.2f}s "
                      f"{rec['bytes'] / 1e6 / an['load']:>7.0f} {an['rss_load']:>5.0f}MiB {an['analyze']:>7.2f}s "
                      f"{ids / 1e6 / an['analyze']:>8.0f} {an['rss']:>5.0f}MiB", flush=True)
                for name in (path, path + ".trace"):
                    if os.path.exists(name):
                        os.remove(name)
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


_COMMANDS = ("place --fit", "place --batch", "cache", "merge", "merge ranks")


def _tagged(sizes: list[int], directory: str, commands: list[str]) -> None:
    print(f"{LAYERS} layers x {EXPERTS} experts, top-{TOP_K}, streamed, tagged ({IN_FLIGHT} sequences in flight, "
          f"{GENERATION_BLOCKS * BLOCK // IN_FLIGHT} passes each); one child process per command")
    print(f"{'passes':>9} {'command':>14} {'time':>8} {'peak RSS':>9} {'output':>9}")

    def row(passes: int, name: str, seconds: float, rss: float, size: int = 0) -> None:
        print(f"{passes:>9} {name:>14} {seconds:>7.2f}s {rss:>6.0f}MiB "
              f"{(f'{size / 2**20:.0f}MiB' if size else '-'):>9}", flush=True)

    for passes in sizes:
        path = os.path.join(directory, f"tagged-{passes}.json")
        rec = _child("record", path, str(passes), "stream", "tagged")
        row(passes, "record + close", rec["record"] + rec["write"], rec["rss"], int(rec["bytes"]))
        load = _child("load", path)
        row(passes, "load", load["load"], load["rss_load"])
        an = _child("analyze", path)
        row(passes, "analyze", an["analyze"], an["rss"])
        if "merge ranks" in commands:
            _child("record", _rank1(path), str(passes), "stream", "tagged", "1")
        for name in commands:
            got = _child("command", path, name)
            if got["status"] != 0:
                raise SystemExit(f"{name} exited {got['status']}")
            row(passes, name, got["seconds"], got["rss"], int(got["bytes"]))
        for name in (path, path + ".trace", _rank1(path), _rank1(path) + ".trace"):
            if os.path.exists(name):
                os.remove(name)


if __name__ == "__main__":
    main()
