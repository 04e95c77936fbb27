"""turbospark's numpy vLLM policy against ``DefaultEplbPolicy.rebalance_experts`` from the vLLM 0.33.0 wheel.

Needs torch and the wheel: ``TURBOSPARK_VLLM033_WHEEL`` names the .whl
(``pip download --no-deps vllm==0.33.0``). Without either the tests skip
saying so, and under ``CI=true`` fail (conftest's ``skip_or_fail``). The maps
must be equal, element for element, on the same window loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import require_module, skip_or_fail
import vllm_eplb_harness

from turbospark.rebalance.vllm_policy import rebalance_experts

torch = require_module("torch")
WHEEL_VARIABLE = "TURBOSPARK_VLLM033_WHEEL"


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    wheel = os.environ.get(WHEEL_VARIABLE)
    if not wheel or not Path(wheel).is_file():
        skip_or_fail(f"{WHEEL_VARIABLE} does not name vLLM's wheel ({wheel!r}): "
                     "pip download --no-deps vllm==0.33.0, then set it to the .whl", optional_as="vllm")
    module = vllm_eplb_harness.load(wheel, tmp_path_factory.mktemp("vllm033"))
    yield module.DefaultEplbPolicy
    vllm_eplb_harness.close()


def _case(rng: np.random.Generator) -> tuple[np.ndarray, int, int, int, int, np.ndarray]:
    """Random window loads (ties included: small integer counts), geometry and a current map."""
    gpus = int(rng.choice([1, 2, 4, 8]))
    nodes = int(rng.choice([n for n in (1, 2, 4) if gpus % n == 0]))
    groups = int(rng.choice([1, 2, 4, 8]))
    experts = groups * int(rng.integers(1, 5)) * 2
    while experts % gpus:
        experts += groups
    per_gpu = -(-experts // gpus) + int(rng.integers(0, 3))
    slots = per_gpu * gpus
    layers = int(rng.integers(1, 5))
    high = int(rng.choice([3, 50, 100000]))
    weight = rng.integers(0, high, size=(layers, experts))
    # The map served now: the trivial one, or a random valid one (every expert on some slot).
    old = np.stack([np.concatenate([rng.permutation(experts), rng.integers(0, experts, slots - experts)])
                    for _ in range(layers)])
    if rng.random() < 0.3:
        old = np.broadcast_to(np.arange(slots) % experts, (layers, slots)).copy()
    return weight, slots, groups, nodes, gpus, old


@pytest.mark.parametrize("seed", range(300))
def test_maps_equal_the_wheel_policy(policy: Any, seed: int) -> None:
    weight, slots, groups, nodes, gpus, old = _case(np.random.default_rng(seed))
    theirs = policy.rebalance_experts(torch.from_numpy(weight).to(torch.int32), slots, groups, nodes, gpus,
                                      torch.from_numpy(old)).numpy()
    ours = rebalance_experts(weight.astype(np.int32), slots, groups, nodes, gpus, old)
    assert ours.dtype == np.int64
    assert ours.tolist() == theirs.tolist()


def test_without_a_current_map(policy: Any) -> None:
    weight = np.array([[90, 10, 10, 10, 40, 40, 0, 0]], dtype=np.int32)
    theirs = policy.rebalance_experts(torch.from_numpy(weight), 12, 1, 1, 4).numpy()
    ours = rebalance_experts(weight, 12, 1, 1, 4)
    assert ours.tolist() == theirs.tolist()
    # The hottest expert gets most replicas: 90 -> 3 slots, the two 40s two each.
    assert sorted(np.bincount(ours[0], minlength=8).tolist()) == [1, 1, 1, 1, 1, 2, 2, 3]


@pytest.mark.parametrize(("seed", "redundant", "window", "interval", "batch", "groups"),
                         [(0, 4, 3, 8, 5, 1), (1, 0, 2, 5, 3, 1), (2, 4, 10, 4, 4, 2), (3, 8, 1, 7, 6, 4)])
def test_replay_equals_vllm_state_with_the_wheel_policy(policy: Any, seed: int, redundant: int, window: int,
                                                         interval: int, batch: int, groups: int) -> None:
    # The wheel's policy runs on all layers at once, in a transliteration of EplbState's step and
    # rearrange; the replay runs turbospark's, a layer at a time: the maps and every step's figure agree.
    from turbospark.rebalance.replay import Setting, replay
    from turbospark.rebalance.steps import form_steps

    experts, gpus = 8, 4
    capture = vllm_eplb_harness.drifting(seed, 3, experts, 2, 90)
    slots = experts + redundant

    def wheel(weight: list[list[int]], old: list[list[int]]) -> list[list[int]]:
        return policy.rebalance_experts(torch.tensor(weight, dtype=torch.int32), slots, groups, 1, gpus,
                                        torch.tensor(old)).tolist()

    series, done = vllm_eplb_harness.simulate(wheel, [t.tolist() for t in capture.trace], experts, batch, gpus,
                                              redundant, window, interval)
    result = replay(capture, form_steps(capture, batch), gpus, [Setting("vllm", redundant, window, interval)],
                    groups=groups)[0]
    assert len(done) >= 3
    assert result.steps == [s for s, _ in done]
    assert [m.tolist() for m in result.maps] == [m for _, m in done]
    assert [None if x != x else x for x in result.series.tolist()] == pytest.approx(series, rel=1e-12)
