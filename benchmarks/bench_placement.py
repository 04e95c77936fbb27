"""Expert placement: quality and speed against DeepSeek's published EPLB, in one process.

Run: ``python benchmarks/bench_placement.py [--repeats 5] [--published PATH/eplb.py]``.

Quality: mean over layers of the per-layer imbalance (max - mean) / mean of
GPU loads, ``turbospark.placement.place`` against ``published_eplb.py`` (the
faithful re-implementation of deepseek-ai/EPLB) on the same counts, G, S,
nodes and groups:

* skewed synthetic counts: 61 layers x 256 experts, Zipf-like popularity
  (exponent 1.0, shuffled per layer) plus Poisson noise, 288 slots on 36
  GPUs, globally and with 8 groups on 4 nodes (DeepSeek-V3's shape);
* the demo's routing: ``turbospark.cli.simulate`` (16 layers x 128 experts,
  top-8, 1,000 passes, seed 0, the demo's defaults), 160 slots on 8 GPUs.

Speed, the 61 x 256 x 288 x 36 global problem, minimum of the repeats,
interleaved: ``place`` (greedy and refinement) against the re-implementation
in the published code's loop form, and against the published file itself
when ``--published`` points at it and torch is installed (the file is not
shipped here). Last, the whole command ``turbospark place CAPTURE --gpus 36
--slots 288 -o FILE`` in a fresh interpreter (start-up included).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_eplb  # noqa: E402

from turbospark.placement import place  # noqa: E402
from turbospark.placement.evaluate import gpu_loads, imbalance  # noqa: E402
from turbospark.cli.simulate import RouterSimulator  # noqa: E402


def skewed_counts(layers: int = 61, experts: int = 256, tokens: int = 200_000, seed: int = 0) -> np.ndarray:
    """(layers, experts) int64 counts: a shuffled Zipf(1.0) popularity per layer, Poisson noise."""
    rng = np.random.default_rng(seed)
    prior = 1.0 / np.arange(1, experts + 1)
    rows = [rng.poisson(tokens * rng.permutation(prior) / prior.sum()) for _ in range(layers)]
    return np.stack(rows).astype(np.int64)


def demo_counts() -> np.ndarray:
    selected, _ = RouterSimulator(16, 128, 8, seed=0).run(1000)
    return np.stack([np.bincount(layer.ravel(), minlength=128) for layer in selected])


def mean_imbalance(phy2log: np.ndarray, counts: np.ndarray, gpus: int) -> float:
    return float(np.nanmean(imbalance(gpu_loads(phy2log, counts, gpus))[0]))


def quality(name: str, counts: np.ndarray, gpus: int, slots: int, nodes: int, groups: int | None) -> None:
    ours = place(counts, gpus, slots, nodes, groups)
    ref, _, _ = published_eplb.rebalance_experts(counts, slots, groups or 1, nodes if groups else 1, gpus)
    ours_max = gpu_loads(ours.phy2log, counts, gpus).max(axis=1)
    ref_max = gpu_loads(ref, counts, gpus).max(axis=1)
    trivial = np.broadcast_to(np.arange(slots) % counts.shape[1], (counts.shape[0], slots))
    print(f"{name}: mean imbalance trivial {mean_imbalance(trivial, counts, gpus):.4f}, "
          f"published EPLB {mean_imbalance(ref, counts, gpus):.4f}, turbospark {mean_imbalance(ours.phy2log, counts, gpus):.4f}; "
          f"layers lower {int((ours_max < ref_max).sum())}, equal {int((ours_max == ref_max).sum())}, "
          f"higher {int((ours_max > ref_max).sum())} of {counts.shape[0]}")


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def load_published(path: str | None) -> Any:
    if path is None:
        return None
    import torch

    spec = importlib.util.spec_from_file_location("eplb_published", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda w, *a: module.rebalance_experts(torch.tensor(w), *a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--published", metavar="PATH", help="the published eplb.py (needs torch)")
    args = parser.parse_args()

    counts = skewed_counts()
    print("quality (mean over layers of (max - mean) / mean of GPU loads; lower is better):")
    quality("  skewed 61x256, 288 slots, 36 GPUs, global", counts, 36, 288, 1, None)
    quality("  skewed 61x256, 288 slots, 36 GPUs, 8 groups on 4 nodes", counts, 36, 288, 4, 8)
    quality("  demo routing 16x128 top-8, 160 slots, 8 GPUs", demo_counts(), 8, 160, 1, None)

    print(f"speed, 61 layers x 256 experts -> 288 slots on 36 GPUs (best of {args.repeats}):")
    ours = best_of(lambda: place(counts, 36, 288), args.repeats)
    reimpl = best_of(lambda: published_eplb.rebalance_experts(counts, 288, 1, 1, 36), args.repeats)
    print(f"  turbospark place (greedy + refinement): {ours * 1e3:.1f} ms")
    print(f"  published algorithm re-implemented in its loop form (numpy scalars): {reimpl * 1e3:.1f} ms, "
          f"{reimpl / ours:.1f}x turbospark's time")
    published = load_published(args.published)
    if published is not None:
        torch_time = best_of(lambda: published(counts, 288, 1, 1, 36), max(1, args.repeats // 2))
        print(f"  published eplb.py itself (torch): {torch_time * 1e3:.0f} ms, {torch_time / ours:.1f}x turbospark's time")

    with tempfile.TemporaryDirectory() as tmp:
        capture = os.path.join(tmp, "capture.json")
        doc = {"num_layers": 61, "num_experts": 256, "top_k": 8, "counts": counts.tolist()}
        with open(capture, "w") as handle:
            json.dump(doc, handle, separators=(",", ":"))
        command = [sys.executable, "-m", "turbospark", "place", capture, "--gpus", "36", "--slots", "288",
                   "-o", os.path.join(tmp, "placement.json")]
        # The package import and interpreter start-up are part of what a user waits for.
        end_to_end = best_of(lambda: subprocess.run(command, check=True, capture_output=True), args.repeats)
        bare = best_of(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.repeats)
        print(f"  end to end, `turbospark place` (python -m, interpreter start included): {end_to_end * 1e3:.0f} ms "
              f"(a bare interpreter start: {bare * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
