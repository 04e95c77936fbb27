"""Expert-cache simulation speed: ids per second per policy, compiled kernel against its pure-Python twin.

Run: ``python benchmarks/bench_cache.py [--passes 50000] [--repeats 5]``.

The trace is the demo's router (``turbospark.cli.simulate``: skewed
popularity, pass-to-pass reuse, a predictor with ~89% recall) at 128
experts, top-8, one layer of ``--passes`` passes, with its one-layer-ahead
predictions. For each policy and cache size C (16 and 64) the compiled
kernel (``turbospark.offload._cache_kernels``) serves the whole layer; the
pure-Python reference twin (``_cache_py``) serves its first tenth, and both
are checked to agree on that slice first. Timings are the minimum of
``--repeats`` interleaved runs, on one core (the kernels are single-threaded).
Prefetch policies are counted in trace ids (predictions are extra work
per pass, so their rate is lower). Target (the issue): >= 20 M ids/s for
every policy.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Optional

import numpy as np

from turbospark.offload import _cache_kernels, _cache_py
from turbospark.cli.simulate import RouterSimulator

EXPERTS, TOP_K = 128, 8
TARGET = 20e6
POLICIES = (("lru", 0, False), ("lfu", 1, False), ("belady", 2, False), ("pilot+lru", 0, True),
            ("pilot+lfu", 1, True))


def trace(passes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Layer 1 of the demo router: (passes, top_k) ids and the predictions made for them."""
    selected, predicted = RouterSimulator(2, EXPERTS, TOP_K, seed=seed).run(passes)
    return (np.ascontiguousarray(selected[1], dtype=np.int64),
            np.ascontiguousarray(predicted[1], dtype=np.int64))


def best_of(repeats: int, job: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = job()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ids, pred = trace(args.passes)
    head = args.passes // 10
    one = np.zeros(1, dtype=np.int64)
    order, order_head = np.arange(args.passes, dtype=np.int64), np.arange(head, dtype=np.int64)
    print(f"one layer: {args.passes} passes x top-{TOP_K} of {EXPERTS} experts = {ids.size / 1e6:.2f} M ids; "
          f"python twin on the first {head} passes; min of {args.repeats}")
    print(f"{'policy':>10} {'C':>4} {'hit rate':>9} {'compiled':>14} {'python':>13} {'ratio':>7}  target 20 M ids/s")
    worst = float("inf")
    for name, code, prefetch in POLICIES:
        for slots in (16, 64):
            guess: Optional[np.ndarray] = pred if prefetch else None
            head_guess = pred[:head] if prefetch else None
            compiled_head = _cache_kernels.simulate(ids[:head], order_head, one, EXPERTS, slots, code, head_guess)
            twin_head = _cache_py.simulate(ids[:head], order_head, one, EXPERTS, slots, code, head_guess)
            assert compiled_head == twin_head, (name, slots, compiled_head, twin_head)
            fast, result = best_of(args.repeats, lambda: _cache_kernels.simulate(
                ids, order, one, EXPERTS, slots, code, guess))
            slow, _ = best_of(max(1, args.repeats // 2), lambda: _cache_py.simulate(
                ids[:head], order_head, one, EXPERTS, slots, code, head_guess))
            rate = ids.size / fast
            slow_rate = head * TOP_K / slow
            worst = min(worst, rate)
            print(f"{name:>10} {slots:>4} {result[1] / result[0]:>8.1%} {rate / 1e6:>9.1f} M/s "
                  f"{slow_rate / 1e6:>8.2f} M/s {rate / slow_rate:>6.0f}x  {'ok' if rate >= TARGET else 'BELOW'}")
    print(f"slowest policy: {worst / 1e6:.1f} M ids/s ({worst / TARGET:.2f}x the 20 M ids/s target)")


if __name__ == "__main__":
    main()
