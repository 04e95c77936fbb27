"""KTransformers' own code picks turbospark's GPU set: kt-kernel 0.7.2's ``generate_gpu_experts_masks``
and sglang-kt 0.7.2's strategies and ``_init_kt_gpu_experts_masks`` (tests/kt_harness.py), run on the
files and flags ``turbospark offload --kt-file`` writes, and on random activation matrices against
turbospark's reproduction of the four strategies.

Needs torch and the wheels: ``TURBOSPARK_KT_WHEELS`` names a directory holding them
(``pip download --no-deps kt-kernel==0.7.2 sglang-kt==0.7.2 -d DIR``). Without either the tests
skip saying so, and under ``CI=true`` fail (conftest's ``skip_or_fail``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import require_module, skip_or_fail

torch = require_module("torch")

import kt_harness  # noqa: E402
from placement_helpers import traced, write_capture  # noqa: E402

from turbospark.cli import main  # noqa: E402
from turbospark.offload.gpu_experts import (  # noqa: E402
    STRATEGIES, kt_frequency_mask, kt_front_loading_mask, kt_random_mask, kt_uniform_mask,
)

WHEELS_VARIABLE = "TURBOSPARK_KT_WHEELS"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kt_harness.Engine]:
    directory = os.environ.get(WHEELS_VARIABLE)
    if not directory:
        skip_or_fail(f"{WHEELS_VARIABLE} is not set (pip download --no-deps kt-kernel==0.7.2 sglang-kt==0.7.2 -d DIR)")
    try:
        loaded = kt_harness.load(directory, tmp_path_factory.mktemp("kt"))
    except FileNotFoundError as exc:
        skip_or_fail(f"{WHEELS_VARIABLE}={directory}: {exc}")
    yield loaded
    loaded.close()


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def random_capture(path: Path, rng: random.Random, layers: int, experts: int, k: int, passes: int) -> str:
    # Skewed routing, so frequency-based sets differ from id-based ones.
    weights = [[rng.random() ** 3 for _ in range(experts)] for _ in range(layers)]
    rows = []
    for layer in range(layers):
        rows.append([])
        for _ in range(passes):
            chosen: list[int] = []
            while len(chosen) < k:
                e = rng.choices(range(experts), weights[layer])[0]
                if e not in chosen:
                    chosen.append(e)
            rows[-1].append(chosen)
    return write_capture(path, traced(experts, k, rows))


@pytest.mark.parametrize("seed, layers, experts, dense, extra", [
    (0, 3, 8, 0, 0), (1, 4, 16, 3, 0), (2, 2, 6, 1, 2), (3, 5, 8, 2, 1)])
def test_engine_loads_exactly_the_written_set(engine: kt_harness.Engine, tmp_path: Path, seed: int, layers: int,
                                              experts: int, dense: int, extra: int) -> None:
    rng = random.Random(seed)
    path = random_capture(tmp_path / "cap.json", rng, layers, experts, 2, 40)
    hidden = dense + layers + extra
    for strategy in STRATEGIES:
        for budget in sorted({0, 1, layers, rng.randint(2, layers * experts - 1), layers * experts}):
            pt = tmp_path / f"{strategy}-{budget}.pt"
            code, out = run("offload", path, "--gpu-experts", str(budget), "--strategy", strategy,
                            "--kt-file", str(pt), "--kt-strategy", strategy, "--first-moe-layer", str(dense),
                            "--num-hidden-layers", str(hidden), "--json", "--fit", "0.5", "--batch", "3")
            assert code == 0
            doc = json.loads(out)
            chosen = np.zeros((layers, experts), dtype=bool)
            for layer, ids in enumerate(doc["results"][strategy]["experts"]):
                chosen[layer, ids] = True
            assert int(chosen.sum()) == budget
            flags = doc["kt"]["flags"]
            # The engine's MoE layers run from the first MoE layer to num_hidden_layers.
            assert len(flags) == (2 if budget % (hidden - dense) == 0 else 1)
            for flag in flags:
                got = engine.masks(flag, hidden, experts, dense).numpy()
                assert got.shape == (hidden, experts)
                assert got[dense:dense + layers].tolist() == chosen.tolist(), (strategy, budget, flag)
                # Rows before the first MoE layer are dense to the engine: all True, as it bypasses
                # them; rows past the capture's layers are MoE layers to it, with no GPU expert.
                assert got[:dense].all() and not got[dense + layers:].any()
            saved = torch.load(pt, map_location="cpu", weights_only=True)
            assert list(saved) == ["logical_count"]
            assert saved["logical_count"].dtype == torch.int32
            assert tuple(saved["logical_count"].shape) == (1, hidden, experts)


@pytest.mark.parametrize("seed", range(8))
def test_the_four_strategies_equal_the_engines(engine: kt_harness.Engine, seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, experts = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    dense = int(rng.integers(0, 3))
    freq = rng.random((layers, experts)).astype(np.float32)  # distinct values: top-N has no ties
    wrapper = engine.wrapper
    for budget in sorted({0, 1, int(rng.integers(0, layers * experts + 1)), layers * experts, layers * experts + 3}):
        kt_freq = engine.experts_base.generate_gpu_experts_masks(torch.from_numpy(freq), budget).numpy()
        assert kt_freq.tolist() == kt_frequency_mask(freq, min(budget, layers * experts)).tolist()
        # sglang-kt's id-based strategies over a model with ``dense`` leading dense layers.
        hidden = dense + layers
        for ours, theirs in ((kt_uniform_mask, wrapper.generate_uniform_masks),
                             (kt_front_loading_mask, wrapper.generate_front_loading_masks),
                             (kt_random_mask, wrapper.generate_random_masks)):
            got = theirs(hidden, experts, budget, dense, 1).numpy()
            assert got[:dense].all()
            assert got[dense:].tolist() == ours(layers, experts, budget).tolist(), (theirs.__name__, budget)


def test_integer_counts_pick_the_same_top_n(engine: kt_harness.Engine) -> None:
    # Integer counts like a capture's: where the N-th and N+1-th differ, kt's top-N is turbospark's.
    rng = np.random.default_rng(7)
    for _ in range(20):
        counts = rng.integers(0, 50, size=(4, 12))
        flat = np.sort(counts.ravel())[::-1]
        budget = int(rng.integers(1, flat.shape[0]))
        if flat[budget - 1] == flat[budget]:
            continue
        got = engine.experts_base.generate_gpu_experts_masks(torch.from_numpy(counts.astype(np.float32)), budget)
        assert got.numpy().tolist() == kt_frequency_mask(counts, budget).tolist()


def test_engine_strategy_flags_equal_turbosparks_choice(engine: kt_harness.Engine, tmp_path: Path) -> None:
    # Started with its own strategy flags (no file), the engine's set is the one turbospark reports.
    rng = random.Random(11)
    path = random_capture(tmp_path / "cap.json", rng, 4, 8, 2, 20)
    for strategy in ("uniform", "front-loading", "random"):
        code, out = run("offload", path, "--gpu-experts", "12", "--strategy", strategy, "--json")
        ours = json.loads(out)["results"][strategy]["experts"]
        got = engine.masks(f"--kt-expert-placement-strategy {strategy} --kt-num-gpu-experts 3", 5, 8, 1).numpy()
        assert [np.flatnonzero(row).tolist() for row in got[1:]] == ours
