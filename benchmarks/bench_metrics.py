"""``turbospark.analyze`` (the compiled sums kernel) against the whole-array numpy analysis it replaced, in one process.

Run: ``python benchmarks/bench_metrics.py [--passes 50000] [--repeats 3]``.

The capture is issue 18's shape, 60 layers x 128 experts, top-8, with the
trace and one-layer-ahead predictions, in memory: each layer's passes drawn
from 4,096 random top-8 rows (as ``bench_scale.py`` records them). The
comparison is the previous per-layer code, still in ``metrics/layers.py`` and ``metrics/_primitives.py`` as the
numpy twin's building blocks (bitsets, sparse-table windows, popcounts,
stack distances); both are checked to give the same document first, then
timed interleaved, minimum of the repeats, for int64 ids (what a JSON
capture loads as) and uint8 ids (what a streamed capture maps), with the
default windows and with ``--cache 16 --cache 64``. Target: >= 100 M ids/s
for the default report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from typing import Any, Callable

import numpy as np

from turbospark.metrics import layers as metrics
from turbospark.capture.reader import Capture

LAYERS, EXPERTS, TOP_K, POOL = 60, 128, 8, 4096


def build(passes: int, dtype: Any) -> Capture:
    rng = np.random.default_rng(0)
    pool = np.argsort(rng.random((POOL, EXPERTS)), axis=1)[:, :TOP_K]
    trace = tuple(np.ascontiguousarray(pool[rng.integers(0, POOL, passes)]).astype(dtype) for _ in range(LAYERS))
    pred = (np.zeros((0, TOP_K), dtype=dtype),) + tuple(
        np.ascontiguousarray(pool[rng.integers(0, POOL, passes)]).astype(dtype) for _ in range(1, LAYERS))
    counts = np.stack([np.bincount(t.ravel(), minlength=EXPERTS) for t in trace]).astype(np.int64)
    return Capture(LAYERS, EXPERTS, TOP_K, counts, trace, pred)


def previous(capture: Capture, caches: list[int]) -> dict[str, Any]:
    """The previous ``analyze`` of an untagged capture: whole-array bitsets per layer."""
    # The count metrics and the document's frame: cheap, and the same code either way.
    doc = metrics.analyze(dataclasses.replace(capture, trace=None, pred=None))
    e = capture.num_experts
    assert capture.trace is not None and capture.pred is not None
    for layer, entry in enumerate(doc["layers"]):
        ids = capture.trace[layer]
        bits = metrics.pass_bitsets(ids, e)
        entry["window_distinct"] = {str(m): v for m, v in metrics._window_distinct(bits, [1, 2, 4, 8]).items()}
        entry["reuse"] = metrics._reuse(bits)
        if layer:
            entry["pilot_recall"], entry["pilot_exact"] = metrics._pilot(metrics.pass_bitsets(capture.pred[layer], e), bits)
        if caches:
            entry["lru_hit_rate"] = {str(c): v for c, v in metrics._lru(ids, e, caches).items()}
    doc["checks"]["trace_matches_counts"] = not metrics.trace_mismatches(capture)
    return doc


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ids = LAYERS * args.passes * TOP_K
    print(f"{LAYERS} layers x {EXPERTS} experts, top-{TOP_K}, {args.passes} passes, trace + predictions "
          f"({ids / 1e6:.0f} M ids); min of {args.repeats}, interleaved")
    for dtype in (np.int64, np.uint8):
        capture = build(args.passes, dtype)
        for caches in ([], [16, 64]):
            new_doc, old_doc = metrics.analyze(capture, caches=caches), previous(capture, caches)
            assert json.dumps(new_doc) == json.dumps(old_doc), "the two analyses differ"
            best_new = best_old = math.inf
            for _ in range(args.repeats):
                best_new = min(best_new, timed(lambda: metrics.analyze(capture, caches=caches)))
                best_old = min(best_old, timed(lambda: previous(capture, caches)))
            label = "defaults" if not caches else "--cache 16 --cache 64"
            verdict = "" if caches else f" (target >= 100: {'met' if ids / best_new >= 1e8 else 'MISSED'})"
            print(f"{np.dtype(dtype).name:>5} ids, {label:<22} new {best_new:6.3f} s = {ids / best_new / 1e6:5.0f} M ids/s"
                  f"{verdict}; previous {best_old:6.3f} s = {ids / best_old / 1e6:4.0f} M ids/s; "
                  f"ratio {best_old / best_new:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
