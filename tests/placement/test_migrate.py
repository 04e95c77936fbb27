"""``place --from CURRENT [--max-moves M]``: moves counted by hand, M = 0 keeps the current
placement, M unbounded is the from-scratch placement relabelled, and relabelling changes no load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark.cli import main
from turbospark.placement import place
from turbospark.placement.dispatch import DISPATCH, dispatch_loads, routing
from turbospark.placement.dispatch import gpu_loads, replica_counts
from turbospark.placement.migrate import align, moved_slots, rebalance

from placement_helpers import write_capture

SMALL = {"num_layers": 1, "num_experts": 2, "top_k": 1, "counts": [[9, 1]]}


@pytest.mark.parametrize("moves, expected, moved, even", [
    # Current 0 1 | 1 1: expert 0 alone on GPU 0, 9 + 1/3 | 2/3 (mean 5).
    ("0", [0, 1, 1, 1], 0, (28 / 3 - 5) / 5),
    # One move: slot 1 of the busiest GPU goes to expert 0: 4.5 + 4.5 | 0.5 + 0.5.
    ("1", [0, 0, 1, 1], 1, 0.8),
    # The from-scratch placement 0 0 | 0 1 (3 + 3 | 3 + 1), GPUs renumbered so slot 0 and 1
    # keep their experts: 0 1 | 0 0, two moves, enough with M = 2 and unbounded.
    ("2", [0, 1, 0, 0], 2, 0.2),
    (None, [0, 1, 0, 0], 2, 0.2),
])
def test_moves_by_hand(tmp_path: Path, capfd: pytest.CaptureFixture[str], moves: str | None,
                       expected: list[int], moved: int, even: float) -> None:
    path = write_capture(tmp_path / "c.json", SMALL)
    current = tmp_path / "current.json"
    current.write_text('{"physical_to_logical_map":[[0,1,1,1]]}')
    extra = [] if moves is None else ["--max-moves", moves]
    assert main(["place", path, "--gpus", "2", "--from", str(current), "--expert-bytes", "10", *extra,
                 "-o", "-"]) == 0
    captured = capfd.readouterr()
    doc = json.loads(captured.out)
    assert doc["physical_to_logical_map"] == [expected]
    layer = doc["layers"][0]
    assert (layer["moved_slots"], layer["moved_bytes"]) == (moved, 10 * moved)
    assert layer["imbalance"]["even"] == pytest.approx(even, abs=1e-15)
    # Round-robin from counts: expert 1's one token goes to its first copy, slot 1 (GPU 0): 10 | 0.
    assert layer["current_imbalance"] == {"even": pytest.approx((28 / 3 - 5) / 5, abs=1e-15), "static": None,
                                          "round-robin": 1.0}
    assert doc["inputs"]["from"] == str(current) and doc["inputs"]["max_moves"] == (None if moves is None else int(moves))
    assert doc["summary"]["moved_slots"] == moved and doc["summary"]["moved_bytes"] == 10 * moved
    limit = "unbounded" if moves is None else f"at most {moves} per layer"
    assert f"  from {current}: {moved} slots moved ({limit}), {10 * moved} bytes of expert weights; " in captured.err


def test_from_refusals(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", SMALL)
    current = tmp_path / "current.json"
    current.write_text('{"physical_to_logical_map":[[0,1,1,1]]}')
    assert main(["place", path, "--gpus", "2", "--max-moves", "3"]) == 2
    assert capfd.readouterr().err == "turbospark: --max-moves and --expert-bytes need --from CURRENT_PLACEMENT\n"
    assert main(["place", path, "--gpus", "2", "--slots", "2", "--from", str(current)]) == 2
    assert capfd.readouterr().err == "turbospark: --slots 2 but the current placement has 4 slots per layer\n"
    assert main(["place", path, "--gpus", "2", "--from", str(current), "--max-moves", "-1"]) == 2
    assert capfd.readouterr().err == "turbospark: --max-moves must be 0 or more, got -1\n"
    current.write_text('{"physical_to_logical_map":[[0,1,1,1],[0,1,1,1]]}')
    assert main(["place", path, "--gpus", "2", "--from", str(current)]) == 2
    assert capfd.readouterr().err == f"turbospark: {current}: the placement has 2 rows, the capture 1 MoE layers\n"


def _case(seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    gpus, experts, layers = 4, 8, 3
    slots = gpus * int(rng.integers(2, 5))
    counts = rng.poisson(100 * rng.permutation(np.arange(1, experts + 1) ** -1.0), size=(layers, experts))
    stale = rng.poisson(100 * rng.permutation(np.arange(1, experts + 1) ** -1.0), size=(layers, experts))
    return counts, place(stale, gpus, slots).phy2log, gpus


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 12))
def test_zero_unbounded_and_budget(seed: int, budget: int) -> None:
    counts, current, gpus = _case(seed)
    weight = counts.astype(np.float64)
    scratch = place(counts, gpus, current.shape[1]).phy2log
    target = align(scratch, current, gpus, permute=True)
    assert np.array_equal(rebalance(current, weight, gpus, 0, target), current)
    unbounded = rebalance(current, weight, gpus, None, target)
    # Unbounded: the from-scratch loads (GPUs renumbered, slots reordered: only the order of the
    # float additions changes), with no more moves.
    np.testing.assert_allclose(np.sort(gpu_loads(unbounded, weight, gpus), axis=1),
                               np.sort(gpu_loads(scratch, weight, gpus), axis=1), rtol=1e-12)
    assert (moved_slots(unbounded, current) <= moved_slots(scratch, current)).all()
    bounded = rebalance(current, weight, gpus, budget, target)
    assert (moved_slots(bounded, current) <= budget).all()
    assert (replica_counts(bounded, counts.shape[1]) >= 1).all()
    # Never worse than staying put.
    assert (gpu_loads(bounded, weight, gpus).max(axis=1) <= gpu_loads(current, weight, gpus).max(axis=1) + 1e-9).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31))
def test_reordering_within_gpus_changes_no_load_under_any_model(seed: int) -> None:
    counts, current, gpus = _case(seed)
    ranks = routing([counts // 2, counts - counts // 2, counts // 3, counts // 5])
    scratch = place(ranks.total, gpus, current.shape[1]).phy2log
    kept = align(scratch, current, gpus, permute=False)
    for model in DISPATCH:
        np.testing.assert_allclose(dispatch_loads(model, kept, ranks, gpus),
                                   dispatch_loads(model, scratch, ranks, gpus), rtol=1e-12)
