"""The SGLang replay without SGLang: its schedule and windows by hand, the settings it refuses, the command
line, and the per-step figures against the maps the document holds; SGLang's own code runs in
test_sglang_wheel_policy.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import vllm_eplb_harness
from placement_helpers import traced, write_capture
from turbospark.cli import main
from turbospark.rebalance.replay import Setting, sglang_schedule
from turbospark.rebalance.sglang_policy import rebalance_experts


def _capture_file(tmp_path: Path, seed: int = 5) -> str:
    capture = vllm_eplb_harness.drifting(seed, 2, 8, 2, 60)
    return write_capture(tmp_path / "c.json", traced(8, 2, [t.tolist() for t in capture.trace]))


def test_schedule_every_interval_on_the_last_window_steps() -> None:
    # EPLBManager rebalances at the end of forward pass I + 1, 2I + 1, ...: after 0-based steps I, 2I, ...
    plan = sglang_schedule(30, 8, 3)
    assert plan.steps == [8, 16, 24]
    assert [w.tolist() for w in plan.windows] == [[6, 7, 8], [14, 15, 16], [22, 23, 24]]
    full = sglang_schedule(17, 8, 8)
    assert full.steps == [8, 16] and [w.tolist() for w in full.windows] == [list(range(1, 9)), list(range(9, 17))]
    assert sglang_schedule(8, 8, 8).steps == []


def test_a_buffer_longer_than_the_interval_is_refused() -> None:
    with pytest.raises(ValueError) as caught:
        Setting("sglang", 0, 9, 8).check(8, 4)
    assert str(caught.value) == ("--window-size 9 (SGLang's --expert-distribution-recorder-buffer-size) exceeds "
                                 "--step-interval 8 (--eplb-rebalance-num-iterations): SGLang refuses it")


@pytest.mark.parametrize(("extra", "message"), [
    (["--engine", "sglang", "--max-moves", "2"],
     "turbospark: --max-moves applies to --engine turbospark (vLLM's and SGLang's policies move what they move)\n"),
    (["--first-moe-layer", "3"],
     "turbospark: --first-moe-layer applies to --engine sglang (vLLM's map holds the MoE layers only)\n"),
    (["--engine", "sglang", "--window-size", "9", "--step-interval", "8"],
     "turbospark: --window-size 9 (SGLang's --expert-distribution-recorder-buffer-size) exceeds --step-interval 8 "
     "(--eplb-rebalance-num-iterations): SGLang refuses it\n"),
])
def test_bad_sglang_settings(tmp_path: Path, capfd: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert main(["rebalance", _capture_file(tmp_path), "--gpus", "4", "--batch", "3", *extra]) == 2
    assert capfd.readouterr() == ("", message)


def test_the_buffer_defaults_to_the_interval(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # SGLang resolves an unset --expert-distribution-recorder-buffer-size to --eplb-rebalance-num-iterations.
    path = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--num-redundant-experts",
                 "0,4", "--step-interval", "5,7", "--sweep", "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert [(s["num_redundant_experts"], s["window_size"], s["step_interval"]) for s in doc["settings"]] == [
        (0, 5, 5), (0, 7, 7), (4, 5, 5), (4, 7, 7)]
    assert [r["step"] for r in doc["settings"][0]["rearrangements"]] == [5, 10, 15]
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--json"]) == 0
    (only,) = json.loads(capfd.readouterr().out)["settings"]
    assert (only["window_size"], only["step_interval"], only["rearrangements"]) == (1000, 1000, [])


def test_series_follows_the_maps_in_the_document(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # No spare slot: each expert has one slot, so every rank sends it there, and a step's GPU loads are its
    # counts summed by the GPU the served map puts each expert on (the map of the last rearrangement before).
    capture = vllm_eplb_harness.drifting(2, 2, 8, 2, 60)
    path = write_capture(tmp_path / "c.json", traced(8, 2, [t.tolist() for t in capture.trace]))
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--window-size", "2",
                 "--step-interval", "4", "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    (row,) = doc["settings"]
    maps = [np.arange(8)[None].repeat(2, axis=0)] + [np.array(r["physical_to_logical_map"])
                                                       for r in row["rearrangements"]]
    starts = [r["step"] + 1 for r in row["rearrangements"]]
    expected = []
    for step in range(20):
        served = maps[sum(step >= s for s in starts)]
        busiest = mean = 0.0
        for layer, rows in enumerate(capture.trace):
            gpu_of = np.empty(8, dtype=np.int64)
            gpu_of[served[layer]] = np.arange(8) // 2
            loads = np.bincount(gpu_of[rows[step * 3:(step + 1) * 3].ravel()], minlength=4)
            busiest += loads.max()
            mean += loads.sum() / 4
        expected.append((busiest - mean) / mean)
    assert row["series"] == expected
    # The first rearrangement, after step 4, reads the buffer's last 2 steps: 3 and 4 (passes 9 to 14).
    window = np.stack([np.bincount(rows[9:15].ravel(), minlength=8) for rows in capture.trace])
    assert row["rearrangements"][0]["step"] == 4
    assert row["rearrangements"][0]["physical_to_logical_map"] == rebalance_experts(window, 8, None, 1, 4)[0].tolist()


def test_table_names_the_dispatch_and_prints_sglangs_flags(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--num-redundant-experts",
                 "4", "--step-interval", "4,6", "--window-size", "2", "--sweep", "--groups", "2", "--nodes", "2",
                 "--first-moe-layer", "1", "-o", str(tmp_path / "r.json")]) == 0
    lines = capfd.readouterr().out.splitlines()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["first_moe_layer"] == 1
    assert lines[1] == ("  dispatch: SGLang's static dispatch (DeepEP): each source rank sends all its tokens of an "
                        "expert to one slot, each expert's tokens taken as spread evenly over the 4 source ranks (one "
                        "capture); rebalance algorithm deepseek_hierarchical (--eplb-algorithm auto: 2 expert groups "
                        "over 2 node(s))")
    assert doc["dispatch"] == lines[1][len("  dispatch: "):]
    assert lines[2].startswith("  no rebalancing (trivial map, one slot per expert): token-weighted ")
    assert [line[2:36].rstrip() for line in lines[4:6]] == ["sglang R=4 W=2 I=4", "sglang R=4 W=2 I=6"]
    chosen = doc["settings"][doc["recommended"]]
    assert lines[-1] == (
        "  recommended: python -m sglang.launch_server --model-path MODEL --tp-size 4 --ep-size 4 --moe-a2a-backend "
        "deepep --ep-dispatch-algorithm static --enable-eplb --ep-num-redundant-experts 4 "
        f"--eplb-rebalance-num-iterations {chosen['step_interval']} --expert-distribution-recorder-buffer-size 2 "
        "--nnodes 2 (expert-parallel size 4; static dispatch, SGLang's default with DeepEP; each node adds "
        "--node-rank, --dist-init-addr)")
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--groups", "4",
                 "--nodes", "2", "--step-interval", "4", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["dispatch"].endswith(
        "rebalance algorithm deepseek_hierarchical (--eplb-algorithm auto: 4 expert groups over 2 node(s))")
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--engine", "sglang", "--groups", "3",
                 "--step-interval", "4", "--json"]) == 2
    assert capfd.readouterr().err == "turbospark: 8 experts do not split into 3 expert groups\n"
