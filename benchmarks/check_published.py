"""Check ``published_eplb.py`` and ``turbospark.placement``'s greedy against the published EPLB file itself.

Run: ``python benchmarks/check_published.py PATH/eplb.py [--cases 400]`` (needs
torch; the published file, deepseek-ai/EPLB's ``eplb.py``, is not shipped).

Random cases (1-3 layers, 1-8 groups, 1-4 nodes, 1-12 GPUs, 0-2 spare slots
per GPU), half with distinct loads and half with small integer loads full of
ties; then torch's sort order against ``_stdsort.argsort_desc`` on rows that
exercise every branch of ``std::sort`` (ties, sorted, reversed, organ-pipe,
periodic rows up to 5,000 items: the heapsort fallback). Prints the number
of cases that agree; exits 1 if any does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_eplb  # noqa: E402

from turbospark.placement._greedy import eplb  # noqa: E402
from turbospark.placement._stdsort import argsort_desc  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("published", metavar="PATH/eplb.py")
    parser.add_argument("--cases", type=int, default=400)
    args = parser.parse_args()
    import torch

    spec = importlib.util.spec_from_file_location("eplb_published", args.published)
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    rng = np.random.default_rng(1)
    agree = vectorised = 0
    for case in range(args.cases):
        nodes = int(rng.choice([1, 2, 4]))
        groups = nodes * int(rng.choice([1, 2]))
        experts = groups * int(rng.integers(2, 12))
        gpus = nodes * int(rng.integers(1, 4))
        slots = gpus * (-(-experts // gpus) + int(rng.integers(0, 3)))
        layers = int(rng.integers(1, 4))
        if case % 2:
            weight = rng.integers(0, 6, size=(layers, experts)).astype(np.float64)
        else:
            weight = rng.permutation(layers * experts).reshape(layers, experts) * 7.0 + 3
        expected = [t.numpy() for t in real.rebalance_experts(torch.tensor(weight), slots, groups, nodes, gpus)]
        ours = published_eplb.rebalance_experts(weight, slots, groups, nodes, gpus)
        agree += all(np.array_equal(x, y) for x, y in zip(expected, ours))
        phy2log, logcnt = eplb(weight, slots, groups, nodes, gpus)
        vectorised += np.array_equal(phy2log, expected[0]) and np.array_equal(logcnt, expected[2])
    print(f"published_eplb.py == published eplb.py (phy2log, log2phy, logcnt): {agree} of {args.cases}")
    print(f"turbospark greedy == published eplb.py (phy2log, logcnt): {vectorised} of {args.cases}")
    rows = sort_rows(rng)
    same = sum(np.array_equal(torch.tensor(r).sort(-1, descending=True).indices.numpy(), argsort_desc(r)) for r in rows)
    print(f"argsort_desc == torch.sort(descending=True): {same} of {len(rows)} row sets")
    return 0 if agree == vectorised == args.cases and same == len(rows) else 1


def sort_rows(rng: np.random.Generator) -> list[np.ndarray]:
    rows = []
    for n in (2, 5, 16, 17, 20, 33, 64, 100, 288, 1000):
        for high in (1, 2, 4, 10, 1000):
            rows.append(rng.integers(0, high, size=(20, n)).astype(np.float32))
    for n in (50, 288, 2000, 5000):
        half = np.arange(n // 2)
        for row in (np.arange(n), np.arange(n)[::-1], np.r_[half, half[::-1]], np.r_[half[::-1], half],
                    np.tile([0, 1, 2], n), np.arange(n) % 7, (np.arange(n) * 37) % 101):
            rows.append(np.asarray(row, dtype=np.float32)[None, :])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
