"""``turbospark rebalance``, ``analyze --placement --per-step`` and place's per-step lines, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import vllm_eplb_harness
from placement_helpers import traced, write_capture
from turbospark.cli import main
from turbospark.rebalance.replay import Setting, replay, vllm_schedule
from turbospark.rebalance.per_step import per_step_imbalance
from turbospark.rebalance.steps import form_steps
from turbospark.rebalance.sweep import engine_flags, pareto, recommend
from turbospark.rebalance.vllm_policy import rebalance_experts


def _capture_file(tmp_path: Path, seed: int = 5) -> tuple[str, object]:
    capture = vllm_eplb_harness.drifting(seed, 2, 8, 2, 60)
    rows = [t.tolist() for t in capture.trace]
    return write_capture(tmp_path / "c.json", traced(8, 2, rows)), capture


def test_json_holds_every_rearrangement_and_step(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path, capture = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--num-redundant-experts", "4",
                 "--window-size", "2", "--step-interval", "6", "--expert-bytes", "10", "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["steps"] == {"how": "formed as place --batch 3 forms them (consecutive passes): the capture "
                                   "records no engine steps", "count": 20}
    (row,) = doc["settings"]
    assert [r["step"] for r in row["rearrangements"]] == vllm_schedule(20, 6, 2).steps == [0, 6, 12, 18]
    series, done = vllm_eplb_harness.simulate(
        lambda w, old: rebalance_experts(np.array(w, dtype=np.int32), 12, 1, 1, 4, np.array(old)).tolist(),
        [t.tolist() for t in capture.trace], 8, 3, 4, 4, 2, 6)
    assert [r["physical_to_logical_map"] for r in row["rearrangements"]] == [m for _, m in done]
    assert row["series"] == pytest.approx(series, rel=1e-12)
    assert [r["moved_bytes"] for r in row["rearrangements"]] == [10 * r["moved_slots"] for r in row["rearrangements"]]
    assert row["moved_bytes"] == 10 * row["moved_slots"]
    assert row["cost"] == row["moved_bytes"] / 20 * 1000
    assert doc["cost_unit"] == "bytes per 1000 steps"
    assert (row["engine"], row["num_redundant_experts"], row["window_size"], row["step_interval"], row["slots"]) == (
        "vllm", 4, 2, 6, 12)
    assert doc["pareto"] == [0] and doc["recommended"] == 0
    assert doc["recommended_flags"] == (
        "vllm serve MODEL --enable-expert-parallel --enable-eplb --eplb-config "
        "'{\"window_size\":2,\"step_interval\":6,\"num_redundant_experts\":4,\"use_async\":false}' "
        "(expert-parallel size 4: tensor x data parallel = 4)")


def test_turbospark_engine_with_no_moves_keeps_the_trivial_map(tmp_path: Path) -> None:
    _, capture = _capture_file(tmp_path)
    steps = form_steps(capture, 4)
    (kept,) = replay(capture, steps, 4, [Setting("turbospark", 0, 3, 5, 0)])
    assert kept.moved.tolist() == [0] * len(kept.steps)
    trivial = per_step_imbalance(capture, np.tile(np.arange(8), (2, 1)), 4, steps, "vllm")
    assert kept.series.tolist() == trivial.series.tolist()
    (free,) = replay(capture, steps, 4, [Setting("turbospark", 0, 3, 5, None)])
    assert free.moved.sum() > 0
    assert np.nansum(free.series * free.mean) < np.nansum(kept.series * kept.mean)


def test_pareto_and_recommendation() -> None:
    points = [(10.0, 0.5), (5.0, 0.7), (20.0, 0.5), (5.0, 0.9), (30.0, 0.2)]
    assert pareto(points) == [1, 0, 4]
    settings = [Setting("vllm", r, 10, 10) for r in (0, 8, 0, 0, 16)]
    assert recommend(points, settings) == 4
    assert recommend(points, settings, budget=12.0) == 0
    assert recommend(points, settings, budget=1.0) is None
    assert engine_flags(Setting("turbospark", 8, 100, 300, 4), 8, 64) == (
        "every 300 steps, on the last 100 steps' counts: turbospark place WINDOW --gpus 8 --slots 72 "
        "--from SERVED --max-moves 4 (not an engine flag: a patched rebalancer)")


def test_sweep_table(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path, _ = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--num-redundant-experts", "0,4",
                 "--window-size", "2", "--step-interval", "6,12", "--sweep", "--expert-bytes", "10",
                 "--step-time", "0.5", "-o", str(tmp_path / "r.json")]) == 0
    lines = capfd.readouterr().out.splitlines()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [(s["num_redundant_experts"], s["step_interval"]) for s in doc["settings"]] == [(0, 6), (0, 12), (4, 6), (4, 12)]
    assert doc["cost_unit"] == "bytes per hour"
    row = doc["settings"][0]
    assert row["cost"] == row["moved_bytes"] / (20 * 0.5) * 3600
    assert lines[0].startswith("rebalance replay: 20 steps (formed as place --batch 3 forms them")
    body = lines[3:7]
    marks = [line[0] for line in body]
    assert marks.count(">") == 1
    assert {i for i, m in enumerate(marks) if m in "*>"} == set(doc["pareto"])
    assert lines[7] == "  * Pareto front of token-weighted imbalance against bytes per hour; > recommended"
    assert lines[8].startswith("  recommended: vllm serve MODEL --enable-expert-parallel --enable-eplb --eplb-config")


@pytest.mark.parametrize(("extra", "message"), [
    (["--step-interval", "4,8"], "turbospark: --step-interval has several values: give --sweep to try every combination\n"),
    (["--max-moves", "2"], "turbospark: --max-moves applies to --engine turbospark (vLLM's and SGLang's policies move what they move)\n"),
    (["--num-redundant-experts", "1"], "turbospark: 8 experts + 1 redundant = 9 slots, not divisible by --gpus 4\n"),
])
def test_bad_settings(tmp_path: Path, capfd: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    path, _ = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", *extra]) == 2
    assert capfd.readouterr().err == message


def test_no_steps_without_batch(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path, _ = _capture_file(tmp_path)
    assert main(["rebalance", path, "--gpus", "4"]) == 2
    assert capfd.readouterr().err == ("turbospark: the capture records no engine steps: give --batch B to form "
                                      "steps of B passes, as place --batch B does\n")


def test_analyze_per_step_and_place_lines(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # One layer, 4 experts on 2 GPUs, steps of 2 passes: per-step (2,0) (1,1) (0,2) -> 1, 0, 1; summed 0.
    path = write_capture(tmp_path / "t.json", traced(4, 1, [[[0], [1], [0], [2], [3], [3]]]))
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"physical_to_logical_map": [[0, 1, 2, 3]]}))
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--per-step", "--batch", "2",
                 "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)["placement"]["per_step"]
    assert doc["count"] == 3 and doc["dispatch"] == "even"
    assert doc["file"]["even"] == {"steps": 3, "mean": 2 / 3, "p50": 1.0, "p99": 1.0, "max": 1.0,
                                   "token_weighted": 2 / 3, "aggregate": 0.0}
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--per-step", "--batch", "2"]) == 0
    assert capfd.readouterr().out.splitlines()[-1] == (
        "    file: mean 0.667, p50 1.000, p99 1.000, max 1.000, token-weighted 0.667; aggregate (loads summed "
        "over the steps) 0.000")
    assert main(["analyze", path, "--per-step"]) == 2
    assert capfd.readouterr().err.endswith("--per-step and --batch apply to a --placement file\n")
    assert main(["place", path, "--gpus", "2", "--batch", "2", "-o", str(tmp_path / "q.json")]) == 0
    out = capfd.readouterr().out.splitlines()
    assert ("    trivial: mean 0.667, p50 1.000, p99 1.000, max 1.000, token-weighted 0.667; aggregate (loads "
            "summed over the steps) 0.000") in out


def test_plot_rebalance(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from conftest import require_module

    require_module("matplotlib")
    path, _ = _capture_file(tmp_path)
    out = tmp_path / "r.json"
    assert main(["rebalance", path, "--gpus", "4", "--batch", "3", "--num-redundant-experts", "0,4",
                 "--step-interval", "6", "--window-size", "2", "--sweep", "-o", str(out)]) == 0
    capfd.readouterr()
    assert main(["plot", "--rebalance", str(out)]) == 0
    assert capfd.readouterr().out == f"wrote {tmp_path / 'r.png'}\n"
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.json").write_text("{}")
    assert main(["plot", "--rebalance", str(tmp_path / "bad.json")]) == 2
    assert capfd.readouterr().err == (f"turbospark: cannot read {tmp_path / 'bad.json'}: not turbospark rebalance's "
                                      "JSON (write it with `turbospark rebalance ... -o FILE`)\n")
