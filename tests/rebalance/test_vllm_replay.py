"""The vLLM replay: its schedule by hand, and the whole replay against a token-at-a-time transliteration
of vLLM 0.33's EplbState (tests/vllm_eplb_harness.py ``simulate``) with turbospark's policy; the wheel's
policy in the same transliteration is in test_vllm_wheel_policy.py."""

from __future__ import annotations

import numpy as np
import pytest

import vllm_eplb_harness
from turbospark.rebalance.replay import Setting, replay, vllm_schedule
from turbospark.rebalance.steps import form_steps
from turbospark.rebalance.vllm_policy import rebalance_experts


def test_schedule_first_after_a_quarter_then_every_interval() -> None:
    plan = vllm_schedule(30, 8, 2)
    assert plan.steps == [1, 9, 17, 25]
    assert [w.tolist() for w in plan.windows] == [[0, 1], [8, 9], [16, 17], [24, 25]]


def test_schedule_counts_the_first_step_in_the_first_recorded_row() -> None:
    # should_record_tensor starts on: step 0's tokens stay in the pass counts until the first copy.
    plan = vllm_schedule(12, 8, 1)
    assert plan.steps == [1, 9]
    assert [w.tolist() for w in plan.windows] == [[0, 1], [9]]


def test_schedule_window_longer_than_the_interval() -> None:
    plan = vllm_schedule(14, 4, 6)
    # Start at 4 - 1 = 3: first rearrangement after one step, then every 4; the ring keeps 6 rows.
    assert plan.steps == [0, 4, 8, 12]
    assert [w.tolist() for w in plan.windows] == [[0], [0, 1, 2, 3, 4], [3, 4, 5, 6, 7, 8], [7, 8, 9, 10, 11, 12]]


def _ours(weight: list[list[int]], old: list[list[int]], slots: int, gpus: int) -> np.ndarray:
    return rebalance_experts(np.array(weight, dtype=np.int32), slots, 1, 1, gpus, np.array(old))


@pytest.mark.parametrize(("seed", "redundant", "window", "interval", "batch"),
                         [(0, 4, 3, 8, 5), (1, 0, 2, 5, 3), (2, 4, 10, 4, 4), (3, 8, 1, 7, 6), (4, 4, 6, 6, 1)])
def test_replay_equals_the_transliteration(seed: int, redundant: int, window: int, interval: int, batch: int) -> None:
    experts, gpus = 8, 4
    capture = vllm_eplb_harness.drifting(seed, 3, experts, 2, 90)
    setting = Setting("vllm", redundant, window, interval)
    result = replay(capture, form_steps(capture, batch), gpus, [setting])[0]
    slots = experts + redundant
    series, done = vllm_eplb_harness.simulate(
        lambda w, old: _ours(w, old, slots, gpus).tolist(), [t.tolist() for t in capture.trace], experts, batch,
        gpus, redundant, window, interval)
    assert result.steps == [s for s, _ in done]
    assert [m.tolist() for m in result.maps] == [m for _, m in done]
    ours = [None if x != x else x for x in result.series.tolist()]
    assert ours == pytest.approx(series, rel=1e-12)
    moved = [int((np.array(b) != np.array(a)).sum()) for a, b in
             zip([[[s % experts for s in range(slots)]] * 3] + [m for _, m in done], [m for _, m in done])]
    assert result.moved.tolist() == moved
