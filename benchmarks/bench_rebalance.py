"""The vLLM EPLB replay and the sweep: time per setting, ids per second, and two stated comparisons.

Run: ``python benchmarks/bench_rebalance.py [--layers 16] [--experts 128] [--passes 100000] [--batch 256]``.

A synthetic capture (random top-8 routing whose hot experts move every
quarter of the capture, held in memory) is cut into steps of ``--batch``
passes. Three measurements, in one process:

* replay: one vLLM setting (R = E / 8, W = 40, I = 100) with
  ``turbospark.rebalance.replay.replay``; its rate in routed ids per second;
* sweep: the 12 settings R in {0, E / 8} x W in {10, 40} x I in {25, 100, 400}
  in one ``replay`` call (each layer read once for all settings), against 12
  separate calls: the ratio is what running the settings together saves;
* against the transliteration: the token-at-a-time transcription of vLLM's
  ``EplbState`` in ``tests/vllm_eplb_harness.py`` (``simulate``, turbospark's
  policy) on the first ``--naive-passes`` passes of 2 layers, against the
  replay on the same input: the ratio is the vectorised replay's speed-up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from turbospark.capture.reader import Capture  # noqa: E402
from turbospark.rebalance.replay import Setting, replay  # noqa: E402
from turbospark.rebalance.steps import form_steps  # noqa: E402
from turbospark.rebalance.vllm_policy import rebalance_experts  # noqa: E402


def synthetic(layers: int, experts: int, top_k: int, passes: int, seed: int = 0) -> Capture:
    """Random routing, Zipf-skewed per layer, the popularity reshuffled every quarter of the passes."""
    rng = np.random.default_rng(seed)
    trace = []
    weight = 1.0 / np.arange(1, experts + 1)
    for _ in range(layers):
        rows = np.empty((passes, top_k), dtype=np.uint8 if experts <= 256 else np.uint16)
        for quarter in range(4):
            lo, hi = quarter * passes // 4, (quarter + 1) * passes // 4
            p = rng.permutation(weight)
            # Gumbel top-k: distinct ids per pass, drawn by popularity.
            keys = np.log(p / p.sum()) + rng.gumbel(size=(hi - lo, experts))
            rows[lo:hi] = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        trace.append(rows)
    counts = np.stack([np.bincount(t.ravel().astype(np.int64), minlength=experts) for t in trace])
    return Capture(layers, experts, top_k, counts, trace=tuple(trace))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--passes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--naive-passes", type=int, default=2_048)
    args = parser.parse_args()
    capture = synthetic(args.layers, args.experts, args.top_k, args.passes)
    steps = form_steps(capture, args.batch)
    ids = args.layers * args.passes * args.top_k
    spare = args.experts // 8
    print(f"capture: {args.layers} layers x {args.experts} experts, top-{args.top_k}, {args.passes:,} passes, "
          f"{steps.count:,} steps of {args.batch}; {args.gpus} GPUs")

    one = Setting("vllm", spare, 40, 100)
    start = time.perf_counter()
    (result,) = replay(capture, steps, args.gpus, [one], keep_maps=False)
    single = time.perf_counter() - start
    print(f"replay ({one.label()}): {single:.2f} s, {len(result.steps)} rearrangements, {ids / single / 1e6:.1f} M ids/s")

    grid = [Setting("vllm", r, w, i) for r in (0, spare) for w in (10, 40) for i in (25, 100, 400)]
    start = time.perf_counter()
    replay(capture, steps, args.gpus, grid, keep_maps=False)
    together = time.perf_counter() - start
    start = time.perf_counter()
    for setting in grid:
        replay(capture, steps, args.gpus, [setting], keep_maps=False)
    apart = time.perf_counter() - start
    print(f"sweep of {len(grid)} settings: {together:.2f} s in one call, {apart:.2f} s in {len(grid)} calls "
          f"(ratio {apart / together:.2f}x)")

    import vllm_eplb_harness

    small = Capture(2, args.experts, args.top_k, capture.counts[:2],
                    trace=tuple(t[:args.naive_passes].astype(np.int64) for t in capture.trace[:2]))
    slots = args.experts + spare
    naive_batch = max(1, args.naive_passes // 64)
    start = time.perf_counter()
    vllm_eplb_harness.simulate(
        lambda w, old: rebalance_experts(np.array(w, dtype=np.int32), slots, 1, 1, args.gpus, np.array(old)).tolist(),
        [t.tolist() for t in small.trace], args.experts, naive_batch, args.gpus, spare, 4, 8)
    naive = time.perf_counter() - start
    start = time.perf_counter()
    replay(small, form_steps(small, naive_batch), args.gpus, [Setting("vllm", spare, 4, 8)], keep_maps=False)
    fast = time.perf_counter() - start
    print(f"against the token-at-a-time transliteration ({args.naive_passes:,} passes x 2 layers, 64 steps): "
          f"{naive:.2f} s vs {fast:.3f} s (ratio {naive / fast:.0f}x)")


if __name__ == "__main__":
    main()
