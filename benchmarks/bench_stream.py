"""The recording hot path with the trace streamed (``trace="stream"``) against kept in memory (``trace=True``).

Run: ``python benchmarks/bench_stream.py [--repeats 7]``.

One process, the compiled core (or whichever ``turbospark.BACKEND`` is).
Three calls, each timed over enough calls to cross many chunks, interleaved
(memory, stream, memory, ...) and the minimum of the repeats kept:

* ``record``: one pass of 8 ids from a list, layer after layer of 60;
* ``record_many``: a (64, 8) int64 block per layer;
* ``record_batch``: the same block with its seq ids and phase.

The streamed side includes everything the caller's thread does for the
stream: the spill check on every call, and at each chunk the copy out of the
core and the hand-over to the writer thread (``_spill``), whose share is
printed on its own. The writer thread's own work (narrowing, checksums,
writes) runs beside it on the other core. The issue's target: streaming
must not make the hot path slower (ratio stream / memory about 1).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Callable

import numpy as np

import turbospark
from turbospark import RouterHistogram

LAYERS, EXPERTS, TOP_K = 60, 128, 8


def _timed(make: Callable[[], Any], run: Callable[[Any], int]) -> tuple[float, float, int]:
    """(seconds per call, seconds inside _spill per call, calls) for one fresh recorder."""
    hist = make()
    spent = [0.0]
    if hist.streamed:
        inner = hist._spill

        def spill() -> None:
            started = time.perf_counter()
            inner()
            spent[0] += time.perf_counter() - started

        hist._spill = spill  # the core calls self._spill(): an instance attribute is found first
    started = time.perf_counter()
    calls = run(hist)
    elapsed = time.perf_counter() - started
    hist.discard()
    return elapsed / calls, spent[0] / calls, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lists = [rng.choice(EXPERTS, TOP_K, replace=False).tolist() for _ in range(LAYERS)]
    blocks = [np.argsort(rng.random((64, EXPERTS)), axis=1)[:, :TOP_K].astype(np.int64) for _ in range(LAYERS)]
    seq = np.arange(64, dtype=np.int64)

    def one(hist: Any) -> int:
        for _ in range(6000):
            for layer in range(LAYERS):
                hist.record(layer, lists[layer])
        return 6000 * LAYERS

    def many(hist: Any) -> int:
        for _ in range(300):
            for layer in range(LAYERS):
                hist.record_many(layer, blocks[layer])
        return 300 * LAYERS

    def batch(hist: Any) -> int:
        for _ in range(300):
            for layer in range(LAYERS):
                hist.record_batch(layer, blocks[layer], seq=seq, phase="decode")
        return 300 * LAYERS

    with tempfile.TemporaryDirectory() as directory:
        print(f"backend {turbospark.BACKEND}; {LAYERS} layers x {EXPERTS} experts, top-{TOP_K}; min of "
              f"{args.repeats}, interleaved")
        print(f"{'call':>13} {'memory':>10} {'stream':>10} {'ratio':>6} {'in _spill':>10} {'chunks':>7}")
        for name, run in (("record", one), ("record_many", many), ("record_batch", batch)):
            best = {"memory": (float("inf"), 0.0, 0), "stream": (float("inf"), 0.0, 0)}
            for _ in range(args.repeats):
                for mode, trace in (("memory", True), ("stream", "stream")):
                    path = os.path.join(directory, f"{mode}.json")
                    result = _timed(lambda: RouterHistogram(path, LAYERS, EXPERTS, TOP_K, trace=trace), run)
                    if result[0] < best[mode][0]:
                        best[mode] = result
            memory, stream = best["memory"], best["stream"]
            ids = stream[2] * (1 if name == "record" else 64) * TOP_K
            chunks = ids // (1 << 20)
            print(f"{name:>13} {memory[0] * 1e9:>8.0f}ns {stream[0] * 1e9:>8.0f}ns {stream[0] / memory[0]:>6.2f} "
                  f"{stream[1] * 1e9:>8.0f}ns {chunks:>7}")


if __name__ == "__main__":
    main()
