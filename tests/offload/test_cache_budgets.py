"""Per-layer cache budgets: the LRU curve of every size from one stack walk equals the simulator's at
each size (on the backend TURBOSPARK_PUREPYTHON selects), the split is the brute-force optimum
(greedy on concave curves, DP otherwise), and the report judges both splits out of sample."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from placement_helpers import traced, write_capture

import turbospark
from turbospark.offload.cache import simulate_cache
from turbospark.cli import main
from turbospark.offload.budgets import allocate, budget_report, concave, even_split, hit_curve, lru_hits


def ids(rows: list[list[int]]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1)


def test_lru_hits_by_hand() -> None:
    # [0] [1] [0] [2] [1] [0]: the second 0 is at depth 1 (hits from 2 slots), the second 1 and
    # the third 0 at depth 2 (hits from 3 slots).
    hits, needed = lru_hits(ids([[0], [1], [0], [2], [1], [0]]), 3)
    assert hits.tolist() == [0, 0, 1, 3] and needed == 6
    # A pass's experts are ordered by id in the stack, higher id on top (the simulator evicts the
    # lower id of a tie): after [0, 1] [2, 3] the stack is 3 2 1 0, so 0 hits only from 4 slots.
    hits, _ = lru_hits(ids([[0, 1], [2, 3], [0, 4]]), 5)
    assert hits.tolist() == [0, 0, 0, 0, 1, 1]
    assert simulate_cache(ids([[0, 1], [2, 3], [0, 4]]), 5, 3, "lru")["hits"] == 0


@pytest.mark.parametrize("seed", range(12))
def test_lru_curve_equals_the_simulator_at_every_size(seed: int) -> None:
    rng = np.random.default_rng(seed)
    e = int(rng.integers(2, 12))
    k = int(rng.integers(1, min(e, 4) + 1))
    p = int(rng.integers(0, 60))
    trace = np.stack([rng.choice(e, k, replace=False) for _ in range(p)]) if p else np.zeros((0, k), np.int64)
    streams = [np.arange(p)[::2], np.arange(p)[1::2][::-1]]
    for served in (None, streams):
        curve, needed = lru_hits(trace, e, served)
        belady, belady_needed = hit_curve(trace, e, "belady", k, served)
        for c in range(k, e + 1):
            lru = simulate_cache(trace, e, c, "lru", streams=served)
            assert (int(curve[c]), needed) == (lru["hits"], lru["needed"]), (c, served is None)
            opt = simulate_cache(trace, e, c, "belady", streams=served)
            assert (int(belady[c]), belady_needed) == (opt["hits"], opt["needed"]), c


def brute(curves: np.ndarray, total: int, low: int) -> int:
    high = curves.shape[1] - 1
    best = None
    for split in itertools.product(range(low, high + 1), repeat=curves.shape[0]):
        if sum(split) == total:
            value = sum(int(curves[layer, c]) for layer, c in enumerate(split))
            best = value if best is None else max(best, value)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(20))
def test_split_is_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    layers, high, low = rng.randint(1, 4), rng.randint(2, 6), rng.randint(1, 2)
    curves = np.zeros((layers, high + 1), dtype=np.int64)
    for layer in range(layers):
        steps = [rng.randint(0, 9) for _ in range(high - low)]
        if seed % 2 == 0:
            steps.sort(reverse=True)  # concave: the greedy path
        curves[layer, low:] = rng.randint(0, 5) + np.concatenate([[0], np.cumsum(steps)])
    total = rng.randint(layers * low, layers * high)
    sizes, method = allocate(curves, total, low)
    assert method == ("greedy" if all(concave(row[low:]) for row in curves) else "dp")
    if seed % 2 == 0:
        assert method == "greedy"
    assert sum(sizes) == total and all(low <= c <= high for c in sizes)
    assert sum(int(curves[layer, c]) for layer, c in enumerate(sizes)) == brute(curves, total, low)


def test_a_non_concave_curve_needs_the_dp() -> None:
    # Layer 0 gains nothing from its 2nd slot and 3 from its 3rd; greedy one slot at a time gives
    # both slots to layer 1 (1 + 1); the optimum gives them to layer 0 (0 + 3).
    curves = np.array([[0, 0, 0, 3], [0, 0, 1, 2]])
    assert allocate(curves, 4, 1) == ([3, 1], "dp")
    assert even_split(7, 3, 1, 4) == [3, 2, 2]
    with pytest.raises(ValueError, match="total slots 9 is outside 2..6"):
        allocate(curves, 9, 1)


def test_budget_report_out_of_sample(tmp_path: Path) -> None:
    # Layer 0 cycles over 3 experts, layer 1 repeats one: 4 slots of top-1 go 3 + 1, not 2 + 2.
    # LRU over a cycle of 3 hits nothing below 3 slots: a curve 0, 0, 3 is not concave, so the DP.
    rows = [[[0], [1], [2]] * 4, [[0]] * 12]
    cap = turbospark.load(write_capture(tmp_path / "c.json", traced(3, 1, rows)))
    doc = budget_report(cap, 4, "lru", fit=0.5)
    assert doc["method"] == "dp" and doc["concave_layers"] == 1 and doc["fit"] == "1/2"
    assert doc["optimised"]["slots"] == [3, 1] and doc["even"]["slots"] == [2, 2]
    # test window: passes 6..11 of each layer, a cache starting empty: layer 0 hits 3 of 6 at 3
    # slots (0 at 2: LRU over a cycle of 3), layer 1 hits 5 of 6.
    assert doc["optimised"]["test"] == {"hits": 8, "needed": 12, "hit_rate": 8 / 12,
                                        "misses_per_token": 3 / 6 + 1 / 6}
    assert doc["even"]["test"] == {"hits": 5, "needed": 12, "hit_rate": 5 / 12, "misses_per_token": 1 + 1 / 6}
    belady = budget_report(cap, 4, "belady")
    assert belady["optimised"]["slots"] == [3, 1] and belady["optimised"]["test"] is None
    # Belady at 2 slots over the cycle: after 3 cold misses every other pass hits (5); layer 1: 11.
    assert belady["method"] == "greedy" and belady["even"]["fit"]["hits"] == 5 + 11


def test_offload_total_slots_command(tmp_path: Path) -> None:
    rows = [[[0], [1], [2]] * 4, [[0]] * 12]
    path = write_capture(tmp_path / "c.json", traced(3, 1, rows))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["offload", path, "--total-slots", "4", "--fit", "0.5"]) == 0
    assert out.getvalue() == (
        "expert cache budget: 4 slots over 2 layers (3 experts, top_k 1), lru; split by dynamic programme "
        "(1 of 2 curves concave); chosen from the first 1/2 of each layer's passes, judged on the rest\n"
        "  split      hit rate fit  hit rate test  misses/token fit  misses/token test\n"
        "  optimised         66.7%          66.7%              0.67               0.67\n"
        "  even              41.7%          41.7%              1.17               1.17\n"
        "optimised slots per layer: 3 1\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["offload", path, "--total-slots", "4", "--json", "--policy", "belady", "--shared"]) == 0
    doc = json.loads(out.getvalue())
    assert list(doc) == ["num_layers", "num_experts", "top_k", "total_slots", "policy", "shared", "batch", "fit",
                         "method", "concave_layers", "optimised", "even"]
    assert doc["shared"] is True and doc["optimised"]["slots"] == [3, 1]
