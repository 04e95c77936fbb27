"""turbospark.offload.llama_plan: exact costs, the knapsack against brute force, the -ot text, the CLI."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import pytest

from turbospark.capture.reader import load
from turbospark.cli._main import main
from turbospark.offload import llama_plan as lp
from turbospark.recording.recorder import RouterHistogram


def four_layer_capture(path: str) -> None:
    """Layers 0 and 2 route among experts 0-2 only, 1 and 3 among all 8; two prompts (64 and 36 tokens), 5 decodes."""
    rng = np.random.default_rng(0)
    recorder = RouterHistogram(path, 4, 8, 2, trace=True)
    for layer in range(4):
        pool = 8 if layer % 2 else 3
        ids = np.array([rng.choice(pool, 2, replace=False) for _ in range(100)])
        recorder.record_batch(layer, ids, seq=[0] * 64 + [1] * 36, phase="prompt")
        recorder.record_batch(layer, ids[:5], seq=[1] * 5, phase="decode")
    recorder.close()


@pytest.fixture
def capture(tmp_path):
    path = str(tmp_path / "cap.json")
    four_layer_capture(path)
    return load(path)


def test_costs_and_plan(capture) -> None:
    costs = lp.layer_costs(capture, [800] * 4, ubatch=32, min_offload_batch=32)
    # Ubatches of >= 32 prompt tokens of one sequence: 2 of sequence 0, 1 of sequence 1 (its last 4 dropped).
    assert costs.ubatches == (3, 3, 3, 3)
    assert costs.ubatch_distinct == (Fraction(3), Fraction(8), Fraction(3), Fraction(8))
    assert costs.expert_bytes == (Fraction(100),) * 4
    chosen = lp.plan(costs, 1700)
    assert (chosen.gpu_layers, chosen.cpu_layers, chosen.gpu_bytes) == ((1, 3), (0, 2), 1600)
    assert chosen.override_argument == r"blk\.(0|2)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"
    assert chosen.n_cpu_moe(costs.expert_layers) is None
    assert (chosen.cpu_experts_per_token, chosen.cpu_bytes_per_token) == (4, 400)
    assert (chosen.copy_experts_per_ubatch, chosen.copy_bytes_per_ubatch) == (6, 600)
    baseline = lp.n_cpu_moe_plan(costs, 1700)
    assert (baseline.cpu_layers, baseline.n_cpu_moe(costs.expert_layers)) == ((0, 1), 2)
    assert baseline.override_regex == r"blk\.(0|1)\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    assert (baseline.copy_experts_per_ubatch, baseline.copy_bytes_per_ubatch) == (11, 1100)
    everything = lp.plan(costs, 3200)
    assert everything.override_argument is None and everything.n_cpu_moe(costs.expert_layers) == 0


def test_knapsack_is_exact(capture) -> None:
    """Random layer sizes: the plan equals the best of every subset that fits, under both preferences."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        sizes = (rng.integers(1, 6, size=4) * 8 * int(rng.integers(1, 4))).tolist()
        costs = lp.layer_costs(capture, sizes, ubatch=32, min_offload_batch=32)
        budget = int(rng.integers(0, sum(sizes) + 1))
        for prefer in ("decode", "prompt"):
            best = None
            for r in range(5):
                for gpu in itertools.combinations(range(4), r):
                    if sum(sizes[l] for l in gpu) > budget:
                        continue
                    p = lp._evaluate(costs, gpu, budget)
                    key = (-p.cpu_bytes_per_token, -p.copy_bytes_per_ubatch)
                    key = key if prefer == "decode" else key[::-1]
                    if best is None or key > best:
                        best = key
            p = lp.plan(costs, budget, prefer=prefer)
            got = (-p.cpu_bytes_per_token, -p.copy_bytes_per_ubatch)
            assert (got if prefer == "decode" else got[::-1]) == best, (trial, sizes, budget, prefer)
            assert p.gpu_bytes <= budget


def test_bad_input(capture) -> None:
    with pytest.raises(ValueError, match="3 layer sizes for a capture of 4 layers"):
        lp.layer_costs(capture, [1, 2, 3])
    costs = lp.layer_costs(capture, [8] * 4)
    with pytest.raises(ValueError, match="budget must be at least 0 bytes, got -1"):
        lp.plan(costs, -1)
    with pytest.raises(ValueError, match="prefer must be 'decode' or 'prompt', got 'fast'"):
        lp.plan(costs, 1, prefer="fast")
    assert lp.parse_bytes("12G") == 12 << 30 and lp.parse_bytes("1.5K") == 1536 and lp.parse_bytes("77") == 77
    with pytest.raises(ValueError, match="expected a size in bytes such as 12G, 800M or 123456, got 'lots'"):
        lp.parse_bytes("lots")


def test_cli(tmp_path, capfd) -> None:
    path = str(tmp_path / "cap.json")
    four_layer_capture(path)
    assert main(["llama-plan", path, "--expert-bytes", "100", "--vram", "1700", "--ubatch", "32"]) == 0
    out = capfd.readouterr().out
    assert out == (
        "expert layers: 4 (3,200 bytes of expert tensors); VRAM budget 1,700 bytes\n"
        "GPU layers: 1, 3 (1,600 bytes)\n"
        "CPU layers: 0, 2\n"
        "llama.cpp flags: -ot 'blk\\.(0|2)\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'\n"
        "plan: decode 4.00 CPU experts/token (400 bytes/token); prompt copy 6.00 experts/ubatch (600 bytes/ubatch of 32)\n"
        "--n-cpu-moe 2: decode 4.00 CPU experts/token (400 bytes/token); prompt copy 11.00 experts/ubatch "
        "(1,100 bytes/ubatch of 32)\n"
        "plan against --n-cpu-moe 2: decode bytes +0.0%, prompt copy bytes -45.5%\n"
    )
    assert main(["llama-plan", path, "--expert-bytes", "100", "--vram", "900", "--ubatch", "32", "--json"]) == 0
    document = json.loads(capfd.readouterr().out)
    # One layer fits: 1 and 3 tie (8 distinct experts per ubatch each), the lower one wins.
    assert document["plan"]["cpu_layers"] == [0, 2, 3] and document["plan"]["gpu_layers"] == [1]
    assert document["plan"]["n_cpu_moe"] is None and document["n_cpu_moe_baseline"]["cpu_layers"] == [0, 1, 2]
    assert document["plan"]["copy_experts_per_ubatch"] == {"value": 14.0, "exact": "14"}
    assert main(["llama-plan", path, "--expert-bytes", "100", "--vram", "lots"]) == 2
    assert "expected a size in bytes" in capfd.readouterr().err
