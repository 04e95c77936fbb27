"""Drift on synthetic routing with a known change point: exact distances and hot-set overlaps."""

from __future__ import annotations

import numpy as np
import pytest

from turbospark.capture.reader import Capture
from turbospark.rebalance.drift import drift
from turbospark.rebalance.steps import form_steps


def _changing(passes: int, change: int) -> Capture:
    # Layer 0: experts {0, 1} before pass `change`, {6, 7} after; layer 1: always {2, 3}.
    first = np.array([[0, 1]] * change + [[6, 7]] * (passes - change))
    second = np.array([[2, 3]] * passes)
    counts = np.stack([np.bincount(t.ravel(), minlength=8) for t in (first, second)])
    return Capture(2, 8, 2, counts, trace=(first, second))


def test_distance_is_one_at_the_change_point_only() -> None:
    capture = _changing(40, 20)
    steps = form_steps(capture, 2)  # 20 steps; the change at step 10
    small, large = drift(capture, steps, [2, 5], hot=2, max_lag=3)
    # Windows of 2 steps: 10 windows, 9 gaps; only gap 4|5 spans the change, where layer 0 moves wholly.
    assert small["windows"] == 10
    assert small["distance"]["layers"] == [1 / 9, 0.0]
    # Model-wide, layer 0 holds half of each window's load: that half moves, distance 1/2, once.
    assert small["distance"]["model"] == 0.5 / 9
    assert small["distance"]["model_max"] == 0.5
    # Hot sets (h = 2): layer 1 always keeps both; layer 0 loses them across the change.
    # Lag 1: 9 pairs per layer, layer 0 loses 1: (9 + 8) / 18; lag 2: (8 + 6) / 16; lag 3: (7 + 4) / 14.
    assert small["hot"]["overlap"] == [17 / 18, 14 / 16, 11 / 14]
    assert small["hot"]["chance"] == 0.25
    assert small["hot"]["half_life_steps"] is None
    assert large["windows"] == 4
    assert large["distance"]["layers"] == [1 / 3, 0.0]


def test_half_life_when_the_hot_experts_keep_moving() -> None:
    # The hot pair moves every 4 passes: a new pair each window of 2 steps (batch 2).
    rows = np.array([[(2 * (p // 4)) % 8, (2 * (p // 4) + 1) % 8] for p in range(64)])
    capture = Capture(1, 8, 2, np.bincount(rows.ravel(), minlength=8)[None, :], trace=(rows,))
    (result,) = drift(capture, form_steps(capture, 2), [2], hot=2, max_lag=4)
    assert result["distance"]["layers"] == [1.0]
    # Lag 1, 2, 3 move to a disjoint pair; lag 4 comes back round (8 experts / 2 = 4 pairs).
    assert result["hot"]["overlap"] == [0.0, 0.0, 0.0, 1.0]
    assert result["hot"]["half_life_steps"] == 2


def test_bad_arguments() -> None:
    capture = _changing(8, 4)
    steps = form_steps(capture, 2)
    with pytest.raises(ValueError, match="--hot must be in 1..8, got 9"):
        drift(capture, steps, [2], hot=9)
    with pytest.raises(ValueError, match="drift windows must be positive integers, got 0"):
        drift(capture, steps, [0])


def test_the_simulators_drift_shows_at_its_change_point() -> None:
    from turbospark.cli.simulate import RouterSimulator, RoutingParams

    selected, _ = RouterSimulator(4, 32, 4, seed=3, params=RoutingParams(drift=200)).run(400)
    trace = tuple(selected[layer] for layer in range(4))
    counts = np.stack([np.bincount(t.ravel(), minlength=32) for t in trace])
    capture = Capture(4, 32, 4, counts, trace=trace)
    (result,) = drift(capture, form_steps(capture, 10), [5], max_lag=4)  # windows of 50 passes
    series = result["distance"]["model_series"]
    assert len(series) == 7
    # The reshuffle at pass 200 falls between windows 3 and 4: by far the largest distance.
    assert int(np.argmax(series)) == 3
    assert series[3] > 2.5 * max(series[:3] + series[4:])
    # Without drift the same seed's routing is the undrifted simulator's, pass for pass.
    plain, _ = RouterSimulator(4, 32, 4, seed=3).run(200)
    assert (plain == selected[:, :200]).all()


def test_negative_drift_is_refused() -> None:
    from turbospark.cli.simulate import RouterSimulator, RoutingParams

    with pytest.raises(ValueError, match="drift must be 0 or more passes, got -1"):
        RouterSimulator(1, 4, 1, params=RoutingParams(drift=-1))
