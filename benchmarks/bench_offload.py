"""GPU-set selection and cache-budget split speed, against stated comparisons.

Run: ``python benchmarks/bench_offload.py [--repeats 5]`` (from the checkout root; with torch and
``TURBOSPARK_KT_WHEELS`` naming the kt-kernel/sglang-kt 0.7.2 wheels, the frequency comparison
runs kt-kernel's own code, else it says it is skipped).

1. ``frequency`` at DeepSeek-V3's size (58 MoE layers x 256 experts, N = 25% of them) from random
   activation counts: ``kt_frequency_mask`` (numpy lexsort, ties to the lower index) against
   kt-kernel 0.7.2's ``generate_gpu_experts_masks`` (torch.topk) on the same matrix, which must
   pick the same set (the values are distinct).
2. ``batch-aware`` and ``layer-aware`` from a simulated trace (the demo's router,
   ``turbospark.cli.simulate``, 16 layers x 128 experts, top-8, 4,000 passes, B = 16): the whole
   ``choose`` (step sets, occupancy, top-N), absolute time.
3. The budget split: ``allocate``'s DP against a brute force over every split (numpy, all
   compositions at once) for 4 layers x 32 experts, top-8, S = 64, on non-concave curves, both
   checked to reach the same total; then the DP alone at 60 layers x 256 experts, S = 60 x 64.
Timings: the minimum of ``--repeats`` runs, one process, one core.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from turbospark.cli.simulate import RouterSimulator
from turbospark.offload.budgets import allocate
from turbospark.offload.gpu_experts import Window, _window, choose, kt_frequency_mask


def best_of(repeats: int, job: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = job()
        times.append(time.perf_counter() - start)
    return min(times), out


def kt_engine() -> Any:
    directory = os.environ.get("TURBOSPARK_KT_WHEELS")
    if not directory:
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import kt_harness

    return kt_harness.load(directory, Path(tempfile.mkdtemp()))


def bench_frequency(repeats: int) -> None:
    rng = np.random.default_rng(0)
    freq = rng.random((58, 256)).astype(np.float32)
    budget = 58 * 256 // 4
    ours, mask = best_of(repeats, lambda: kt_frequency_mask(freq, budget))
    engine = kt_engine()
    if engine is None:
        print(f"frequency 58x256, N={budget}: turbospark {ours * 1e3:.3f} ms; kt-kernel comparison skipped "
              "(needs torch and TURBOSPARK_KT_WHEELS)")
        return
    import torch

    tensor = torch.from_numpy(freq)
    theirs, kt_mask = best_of(repeats, lambda: engine.experts_base.generate_gpu_experts_masks(tensor, budget))
    engine.close()
    assert kt_mask.numpy().tolist() == mask.tolist()
    print(f"frequency 58x256, N={budget}: turbospark {ours * 1e3:.3f} ms, kt-kernel {theirs * 1e3:.3f} ms "
          f"(same set); kt / turbospark = {theirs / ours:.2f}")


def bench_choose(repeats: int) -> None:
    selected, _ = RouterSimulator(16, 128, 8, seed=0).run(4000)
    pieces = [_window(np.ascontiguousarray(ids, dtype=np.int64), None, 16) for ids in selected]
    window = Window([p[0] for p in pieces], [p[1] for p in pieces], 16)
    for name in ("layer-aware", "batch-aware", "coactivation"):
        seconds, _ = best_of(repeats, lambda: choose(name, window, 128, 512))
        print(f"{name} 16x128 top-8, 4,000 passes, B=16, N=512: {seconds * 1e3:.1f} ms")


def brute(curves: np.ndarray, total: int, low: int) -> int:
    high = curves.shape[1] - 1
    sizes = np.array(list(itertools.product(range(low, high + 1), repeat=curves.shape[0])))
    sizes = sizes[sizes.sum(axis=1) == total]
    return int(curves[np.arange(curves.shape[0]), sizes].sum(axis=1).max())


def curves_of(rng: np.random.Generator, layers: int, experts: int, low: int) -> np.ndarray:
    steps = rng.integers(0, 50, size=(layers, experts - low))  # unsorted: not concave, so the DP
    out = np.zeros((layers, experts + 1), dtype=np.int64)
    out[:, low + 1:] = np.cumsum(steps, axis=1)
    return out


def bench_split(repeats: int) -> None:
    rng = np.random.default_rng(1)
    curves = curves_of(rng, 4, 32, 8)
    dp, (sizes, method) = best_of(repeats, lambda: allocate(curves, 64, 8))
    brute_s, optimum = best_of(repeats, lambda: brute(curves, 64, 8))
    assert method == "dp" and int(curves[np.arange(4), sizes].sum()) == optimum
    print(f"split 4x32, S=64 (non-concave): DP {dp * 1e3:.2f} ms, brute force {brute_s * 1e3:.1f} ms "
          f"(same optimum); brute / DP = {brute_s / dp:.0f}")
    big = curves_of(rng, 60, 256, 8)
    seconds, _ = best_of(max(1, repeats // 2), lambda: allocate(big, 60 * 64, 8))
    print(f"split 60x256, S=3840 (DP): {seconds:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    bench_frequency(args.repeats)
    bench_choose(args.repeats)
    bench_split(args.repeats)


if __name__ == "__main__":
    main()
