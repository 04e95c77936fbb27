"""GPU-resident expert sets: figures on hand-made captures against hand counts and a naive set count,
each strategy's choice, KTransformers' file layout, and the ``offload`` command's output."""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from placement_helpers import traced, write_capture

import turbospark
from turbospark.cli import main
from turbospark.offload.gpu_experts import (
    STRATEGIES, choose, gpu_experts_report, kt_front_loading_mask, kt_random_mask, kt_uniform_mask,
    parse_strategies, score, torch_randperm, windows,
)
from turbospark.offload.ktransformers import kt_counts, kt_flags, kt_ratio, write_kt_file

LAYER0 = [[0, 1], [0, 2], [0, 1], [3, 1]]
LAYER1 = [[2, 3], [2, 3], [1, 2], [0, 2]]


def capture(tmp_path: Path, rows: list[list[list[int]]] = None, **extra: Any) -> str:
    return write_capture(tmp_path / "cap.json", traced(4, 2, rows or [LAYER0, LAYER1], **extra))


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def mask_of(sets: list[list[int]], experts: int = 4) -> np.ndarray:
    mask = np.zeros((len(sets), experts), dtype=bool)
    for layer, ids in enumerate(sets):
        mask[layer, ids] = True
    return mask


def test_figures_by_hand(tmp_path: Path) -> None:
    cap = turbospark.load(capture(tmp_path))
    fit, test, kinds = windows(cap, None, batch=2)
    assert test is None and kinds is None
    got = score(mask_of([[0], [2]]), fit)
    # Layer 0: CPU experts per pass 1, 1, 1, 2; layer 1: 1 each. Steps of 2: layer 0 {0,1,2} {0,1,3}
    # -> CPU {1,2} {1,3}; layer 1 {2,3} {0,1,2} -> CPU {3} {0,1}.
    assert got["cpu_experts_per_token"] == 5 / 4 + 1
    assert got["cpu_union_per_step"] == 2 + 1.5
    assert got["gpu_share"] == 7 / 16
    assert got["cpu_free_steps"] == 0
    assert [layer["cpu_union_per_step"] for layer in got["layers"]] == [2, 1.5]
    whole = score(mask_of([[0, 1, 2, 3], [2, 3]]), windows(cap, None, batch=2)[0])
    assert whole["cpu_free_steps"] == 3 / 4 and whole["cpu_union_per_step"] == 1


def naive(mask: np.ndarray, rows: list[list[list[int]]], batch: int) -> tuple[float, float]:
    """CPU experts per token and CPU union per step of ``batch`` consecutive passes, with sets."""
    per_token = per_step = 0.0
    for layer, passes in enumerate(rows):
        cpu = {e for e in range(mask.shape[1]) if not mask[layer, e]}
        if passes:
            per_token += sum(len(set(p) & cpu) for p in passes) / len(passes)
        steps = [passes[i:i + batch] for i in range(0, len(passes) - batch + 1, batch)]
        if steps:
            per_step += sum(len(set().union(*map(set, s)) & cpu) for s in steps) / len(steps)
    return per_token, per_step


@pytest.mark.parametrize("seed", range(6))
def test_figures_equal_a_naive_count(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    experts, k, layers = rng.randint(3, 9), 0, rng.randint(1, 4)
    k = rng.randint(1, min(3, experts))
    rows = [[rng.sample(range(experts), k) for _ in range(rng.randint(1, 30))] for _ in range(layers)]
    path = write_capture(tmp_path / "r.json", traced(experts, k, rows))
    cap = turbospark.load(path)
    batch = rng.randint(1, 5)
    mask = np.array([[rng.random() < 0.4 for _ in range(experts)] for _ in range(layers)])
    got = score(mask, windows(cap, None, batch)[0])
    want = naive(mask, rows, batch)
    assert got["cpu_experts_per_token"] == pytest.approx(want[0], abs=1e-12)
    assert (got["cpu_union_per_step"] or 0.0) == pytest.approx(want[1], abs=1e-12)


def test_each_strategy_on_the_hand_capture(tmp_path: Path) -> None:
    cap = turbospark.load(capture(tmp_path))
    fit = windows(cap, None, batch=2)[0]
    picks = {name: [np.flatnonzero(r).tolist() for r in choose(name, fit, 4, 4)] for name in STRATEGIES}
    # counts: layer 0 [3, 3, 1, 1], layer 1 [1, 1, 4, 2]; step occupancy (B = 2): [1, 1, .5, .5], [.5, .5, 1, .5]
    assert picks["frequency"] == [[0, 1], [2, 3]]
    assert picks["layer-aware"] == [[0, 1], [2, 3]]
    assert picks["batch-aware"] == [[0, 1, 2], [2]]
    assert picks["uniform"] == [[0, 1], [0, 1]]
    assert picks["front-loading"] == [[0, 1, 2, 3], []]
    # Step sets (B = 2): layer 0 {0,1,2} {0,1,3}, layer 1 {2,3} {0,1,2}: {2,3} completes a step for
    # 2 experts (the best ratio, 1/2), then layer 1's {0,1,2} needs only {0,1}: 1/2 again, and N is spent.
    assert picks["coactivation"] == [[], [0, 1, 2, 3]]
    assert picks["random"] == [np.flatnonzero(r).tolist() for r in kt_random_mask(2, 4, 4)]


def test_layer_aware_normalises_by_a_layers_passes(tmp_path: Path) -> None:
    cap = turbospark.load(capture(tmp_path, [LAYER0, [[2, 3], [2, 3]]]))
    fit = windows(cap, None)[0]
    assert [np.flatnonzero(r).tolist() for r in choose("frequency", fit, 4, 2)] == [[0, 1], []]
    assert [np.flatnonzero(r).tolist() for r in choose("layer-aware", fit, 4, 2)] == [[], [2, 3]]


def test_kt_mask_shapes_by_hand() -> None:
    assert kt_uniform_mask(3, 4, 7).sum(axis=1).tolist() == [3, 2, 2]
    assert kt_uniform_mask(3, 4, 7)[0].tolist() == [True, True, True, False]
    assert kt_uniform_mask(2, 3, 9).sum(axis=1).tolist() == [3, 3]  # capped at E, as the engine
    assert kt_front_loading_mask(3, 4, 6).astype(int).tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert sorted(torch_randperm(50, 42).tolist()) == list(range(50))
    assert kt_random_mask(4, 8, 5).sum() == 5


def test_fit_split_judges_out_of_sample(tmp_path: Path) -> None:
    cap = turbospark.load(capture(tmp_path))
    doc = gpu_experts_report(cap, 2, ["frequency"], fit=0.5)
    # fit: layer 0 passes [0,1],[0,2] (counts 2,1,1,0); layer 1 [2,3],[2,3] (0,0,2,2): top-2 (0,0) and (1,2)
    res = doc["results"]["frequency"]
    assert res["experts"] == [[0], [2]]
    assert res["test"]["cpu_experts_per_token"] == (1 + 2) / 2 + (1 + 1) / 2
    assert res["fit"]["cpu_experts_per_token"] == 1 + 1
    assert doc["fit"] == "1/2" and doc["split"] == ["passes", "passes"]
    assert doc["fit_passes"] == [2, 2] and doc["test_passes"] == [2, 2]


def test_bad_input_is_refused(tmp_path: Path) -> None:
    cap = turbospark.load(capture(tmp_path))
    fit = windows(cap, None)[0]
    with pytest.raises(ValueError, match="unknown GPU expert strategy 'lfu'"):
        parse_strategies("uniform,lfu")
    with pytest.raises(ValueError, match="budget 9 exceeds the model's 2 x 4 = 8"):
        choose("frequency", fit, 4, 9)
    with pytest.raises(ValueError, match="whole number >= 0, got -1"):
        choose("uniform", fit, 4, -1)
    with pytest.raises(ValueError, match="batch must be a whole number >= 1, got 0"):
        windows(cap, None, 0)
    with pytest.raises(ValueError, match="strictly between 0 and 1, got 1.5"):
        windows(cap, 1.5)
    untraced = write_capture(tmp_path / "u.json", {"num_layers": 1, "num_experts": 4, "top_k": 2,
                                                  "counts": [[1, 1, 0, 0]]})
    with pytest.raises(ValueError, match="no trace"):
        windows(turbospark.load(untraced), None)


def test_kt_counts_and_flags() -> None:
    mask = mask_of([[0, 3], [1]])
    counts = kt_counts(mask, first_moe_layer=1, num_hidden_layers=4)
    assert counts.dtype == np.int32 and counts.shape == (1, 4, 4)
    assert counts[0].tolist() == [[0, 0, 0, 0], [1000, 0, 0, 1000], [0, 1000, 0, 0], [0, 0, 0, 0]]
    assert kt_ratio(3, 2, 4) == 3.5 / 8
    assert kt_flags("m.pt", 3, 2, 4) == [
        "--kt-expert-placement-strategy frequency --init-expert-location m.pt --kt-gpu-experts-ratio 0.4375"]
    assert kt_flags("m.pt", 4, 2, 4)[1] == \
        "--kt-expert-placement-strategy frequency --init-expert-location m.pt --kt-num-gpu-experts 2"
    with pytest.raises(ValueError, match="num_hidden_layers 2 is below first MoE layer 1 \\+ 2"):
        kt_counts(mask, first_moe_layer=1, num_hidden_layers=2)
    with pytest.raises(ValueError, match="must end in .pt, got 'm.json'"):
        write_kt_file("m.json", mask)


def test_kt_file_without_torch_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    code, out, err = run("offload", capture(tmp_path), "--gpu-experts", "2", "--kt-file", str(tmp_path / "m.pt"))
    assert code == 2 and out == ""
    assert err == ("turbospark: writing KTransformers' .pt file needs torch, which is not installed: "
                   "pip install 'turbospark[torch]' (or torch itself)\n")
    assert not (tmp_path / "m.pt").exists()


def test_offload_table(tmp_path: Path) -> None:
    code, out, err = run("offload", capture(tmp_path), "--gpu-experts", "2", "--strategy", "uniform,frequency",
                         "--batch", "2", "--fit", "0.5")
    assert code == 0 and err == ""
    assert out == (
        "GPU experts: 2 of 2 layers x 4 (25.0%), top_k 2, serving steps of 2 passes; chosen from the first 1/2 of "
        "each layer's passes, judged on the rest\n"
        "  strategy      per layer  CPU/token fit  CPU/token test  union/step fit  union/step test  GPU share  CPU-free steps\n"
        "  (all on CPU)          0           4.00            4.00            5.00             6.00          -               -\n"
        "  uniform               1           3.00            3.00            4.00             4.00      25.0%            0.0%\n"
        "  frequency             1           2.00            2.50            3.00             4.00      37.5%            0.0%\n"
        "CPU/token: CPU experts one token computes through all layers; union/step: distinct CPU experts per "
        "step of 2, summed over layers; GPU share and CPU-free steps out of sample. Definitions: docs/offload.md.\n")


def test_offload_json_shape(tmp_path: Path) -> None:
    code, out, _ = run("offload", capture(tmp_path), "--budget-bytes", "3KiB", "--expert-bytes", "1024",
                       "--strategy", "batch-aware", "--json")
    doc = json.loads(out)
    assert code == 0
    assert list(doc) == ["num_layers", "num_experts", "top_k", "gpu_experts", "expert_bytes", "gpu_bytes", "batch",
                         "batches", "fit", "split", "fit_passes", "test_passes", "strategies", "all_cpu", "results"]
    assert doc["gpu_experts"] == 3 and doc["gpu_bytes"] == 3072 and doc["test_passes"] is None
    assert doc["results"]["batch-aware"]["experts"] == [[0, 1], [2]]
    assert doc["results"]["batch-aware"]["per_layer"] == [2, 1]
    assert doc["results"]["batch-aware"]["test"] is None
    # GPU {0, 1} and {2}: layer 0's passes need 0, 1, 0, 1 CPU experts, layer 1's one each.
    assert doc["results"]["batch-aware"]["fit"] == {
        "cpu_experts_per_token": 2 / 4 + 1.0, "cpu_union_per_step": 2 / 4 + 1.0, "gpu_share": 10 / 16,
        "cpu_free_steps": 2 / 8,
        "layers": [{"layer": 0, "gpu_experts": 2, "passes": 4, "steps": 4, "cpu_experts_per_token": 0.5,
                    "cpu_union_per_step": 0.5},
                   {"layer": 1, "gpu_experts": 1, "passes": 4, "steps": 4, "cpu_experts_per_token": 1.0,
                    "cpu_union_per_step": 1.0}]}
    assert doc["all_cpu"]["fit"] == {"cpu_experts_per_token": 4.0, "cpu_union_per_step": 4.0, "gpu_share": 0.0,
                                     "cpu_free_steps": 0.0}


@pytest.mark.parametrize("argv, message", [
    (["--gpu-experts", "2", "--shared"], "--shared belongs to --total-slots"),
    (["--budget-bytes", "1G"], "--budget-bytes needs --expert-bytes"),
    (["--gpu-experts", "-1"], "--gpu-experts must be >= 0, got -1"),
    (["--gpu-experts", "2", "--strategy", "x"], "unknown GPU expert strategy 'x'"),
    (["--total-slots", "4", "--kt-file", "a.pt"], "--kt-file belongs to GPU sets"),
    (["--total-slots", "4", "--batch", "2"], "add --shared"),
    (["--total-slots", "3"], "total slots 3 is outside 4..8"),
])
def test_offload_usage_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    code, out, err = run("offload", capture(tmp_path), *argv)
    assert code == 2 and out == "" and message in err



def test_sequence_tags_form_continuous_batches_and_split_by_sequence(tmp_path: Path) -> None:
    # Two sequences per layer: seq 7 a prompt of 2 passes then 1 decode, seq 9 a prompt of 1 then 1.
    seq = [[7, 7, 9, 7, 9]] * 2
    phase = [[0, 0, 0, 1, 1]] * 2
    rows = [[[0, 1], [0, 2], [1, 3], [0, 1], [2, 3]], [[2, 3], [2, 3], [1, 2], [0, 2], [0, 1]]]
    cap = turbospark.load(write_capture(tmp_path / "s.json", traced(4, 2, rows, seq=seq, phase=phase)))
    fit, test, kinds = windows(cap, 0.5, batch=2)
    assert kinds == ["sequences", "sequences"]
    assert [a.tolist() for a in fit.ids] == [[[0, 1], [0, 2], [0, 1]], [[2, 3], [2, 3], [0, 2]]]
    # One sequence in the fit window: its prompt is one step, its decode the next.
    assert [s.tolist() for s in fit.steps] == [[0, 0, 1], [0, 0, 1]]
    whole = windows(cap, None, batch=2)[0]
    # Both sequences at once with 2 rows: step 0 holds 7's prompt and 9's prompt, step 1 both decodes.
    assert [s.tolist() for s in whole.steps] == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    got = score(mask_of([[0], [2]]), whole)
    # layer 0: steps {0,1,2,3} -> CPU {1,2,3}, {0,1,2,3} -> {1,2,3}; layer 1: {1,2,3} -> {1,3}, {0,1,2} -> {0,1}
    assert got["cpu_union_per_step"] == 3 + 2
    assert gpu_experts_report(cap, 2, ["uniform"], batch=2)["batches"] == "concurrent sequences"
