"""Per-step imbalance against a direct computation: loops over steps, layers and tokens, exact fractions."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from turbospark.capture.reader import Capture
from turbospark.rebalance.per_step import STEP_DISPATCH, per_step_imbalance
from turbospark.rebalance.steps import form_steps

KNUTH = 2654435769


def _capture(rng: np.random.Generator, layers: int, experts: int, top_k: int, passes: list[int]) -> Capture:
    trace = tuple(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(p)]).astype(np.int64)
                  if p else np.zeros((0, top_k), dtype=np.int64) for p in passes)
    counts = np.stack([np.bincount(t.ravel(), minlength=experts) for t in trace])
    return Capture(layers, experts, top_k, counts, trace=trace)


def _naive(capture: Capture, phy2log: np.ndarray, gpus: int, batch: int, model: str) -> list[Fraction | None]:
    """Per step (B consecutive passes), sum over layers of max and of mean GPU load, by hand."""
    per_gpu = phy2log.shape[1] // gpus
    steps = -(-max(t.shape[0] for t in capture.trace) // batch)
    out: list[Fraction | None] = []
    for s in range(steps):
        busiest = mean = Fraction(0)
        for layer, ids in enumerate(capture.trace):
            row = phy2log[layer].tolist()
            loads = [Fraction(0)] * gpus
            for i, pass_ids in enumerate(ids[s * batch:(s + 1) * batch].tolist()):
                for e in pass_ids:
                    slots = [slot for slot, x in enumerate(row) if x == e]
                    if model == "even":
                        for slot in slots:
                            loads[slot // per_gpu] += Fraction(1, len(slots))
                    else:  # vllm: token i of the step, Knuth hash modulo the replicas, ascending slots
                        loads[slots[((i * KNUTH) & 0xFFFFFFFF) % len(slots)] // per_gpu] += 1
            busiest += max(loads)
            mean += sum(loads) / gpus
        out.append(None if mean == 0 else (busiest - mean) / mean)
    return out


def _random_map(rng: np.random.Generator, layers: int, experts: int, slots: int) -> np.ndarray:
    return np.stack([rng.permutation(np.concatenate([np.arange(experts), rng.integers(0, experts, slots - experts)]))
                     for _ in range(layers)])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("model", ["even", "vllm"])
def test_matches_a_direct_computation(seed: int, model: str) -> None:
    rng = np.random.default_rng(seed)
    layers, experts, top_k, gpus = 3, 8, 2, int(rng.choice([2, 4]))
    slots = experts + gpus * int(rng.integers(0, 3))
    capture = _capture(rng, layers, experts, top_k, [int(rng.integers(0, 40)) for _ in range(layers - 1)] + [37])
    phy2log = _random_map(rng, layers, experts, slots)
    batch = int(rng.integers(1, 9))
    result = per_step_imbalance(capture, phy2log, gpus, form_steps(capture, batch), model)
    naive = _naive(capture, phy2log, gpus, batch, model)
    series = result.series.tolist()
    assert len(series) == len(naive)
    for ours, theirs in zip(series, naive):
        if theirs is None:
            assert ours != ours
        elif model == "vllm":
            assert ours == float(theirs)  # integer loads: exact
        else:
            assert ours == pytest.approx(float(theirs), rel=1e-12, abs=1e-15)
    loaded = [float(x) for x in naive if x is not None]
    summary = result.summary()
    assert summary["steps"] == len(loaded)
    assert summary["max"] == pytest.approx(max(loaded), rel=1e-12, abs=1e-15)
    assert summary["p50"] == pytest.approx(float(np.percentile(loaded, 50)), rel=1e-12, abs=1e-15)


def test_a_hand_worked_case() -> None:
    # One layer, 4 experts on 2 GPUs (slots 0,1 | 2,3), top-1, steps of 2 passes.
    trace = (np.array([[0], [1], [0], [2], [3], [3]]),)
    capture = Capture(1, 4, 1, np.array([[2, 1, 1, 2]]), trace=trace)
    steps = form_steps(capture, 2)
    assert steps.how == ("formed as place --batch 2 forms them (consecutive passes): the capture records "
                         "no engine steps")
    result = per_step_imbalance(capture, np.array([[0, 1, 2, 3]]), 2, steps, "even")
    # Step 0: GPU loads (2, 0) -> 1.0; step 1: (1, 1) -> 0.0; step 2: (0, 2) -> 1.0.
    assert result.series.tolist() == [1.0, 0.0, 1.0]
    summary = result.summary()
    # Summed over the steps the loads are (3, 3): the aggregate figure says 0.
    assert summary == {"steps": 3, "mean": 2 / 3, "p50": 1.0, "p99": 1.0, "max": 1.0,
                       "token_weighted": 2 / 3, "aggregate": 0.0}


def test_every_model_runs_and_static_splits_evenly() -> None:
    trace = (np.array([[0], [1], [0], [2]]),)
    capture = Capture(1, 4, 1, np.array([[2, 1, 1, 0]]), trace=trace)
    steps = form_steps(capture, 4)
    values = {m: per_step_imbalance(capture, np.array([[0, 1, 2, 3]]), 2, steps, m).series.tolist()
              for m in STEP_DISPATCH}
    # No replicas: every model sends each token to its one slot: loads (3, 1) -> 0.5.
    assert values == {m: [0.5] for m in STEP_DISPATCH}


def test_needs_batch_or_steps_and_a_trace() -> None:
    capture = Capture(1, 4, 1, np.array([[2, 1, 1, 0]]), trace=(np.array([[0], [1], [0], [2]]),))
    with pytest.raises(ValueError, match="records no engine steps: give --batch B"):
        form_steps(capture)
    with pytest.raises(ValueError, match="--batch must be a positive integer, got 0"):
        form_steps(capture, 0)
    with pytest.raises(ValueError, match="need the capture's trace"):
        form_steps(Capture(1, 4, 1, np.array([[2, 1, 1, 0]])), 2)
    with pytest.raises(ValueError, match="--dispatch must be one of even, static, round-robin, vllm, got 'x'"):
        per_step_imbalance(capture, np.array([[0, 1, 2, 3]]), 2, form_steps(capture, 2), "x")


@pytest.mark.parametrize("seed", range(6))
def test_static_and_round_robin_sum_to_the_placement_models(seed: int) -> None:
    # Summed over steps, the per-step loads are the placement wing's loads for the same steps.
    from turbospark.placement.dispatch import dispatch_loads, routing
    from turbospark.placement.samples import serving_steps

    rng = np.random.default_rng(100 + seed)
    layers, experts, gpus, batch = 3, 8, 4, 3
    capture = _capture(rng, layers, experts, 2, [int(rng.integers(1, 700)) for _ in range(layers)])
    phy2log = _random_map(rng, layers, experts, 16)
    steps = form_steps(capture, batch)
    calls = [serving_steps(t.shape[0], batch, None) for t in capture.trace]
    flow = routing([capture.counts], [capture.trace], [calls], "test")
    for model in ("static", "round-robin"):
        ours = per_step_imbalance(capture, phy2log, gpus, steps, model).layer_loads
        theirs = dispatch_loads(model, phy2log, flow, gpus, assume_even=True)
        assert ours.ravel().tolist() == pytest.approx(theirs.ravel().tolist(), rel=1e-12)
