"""``turbospark demo`` and its simulator: the capture it records through the real recorder analyses as expected."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.metrics import analyze, self_test
from turbospark.cli import main
from turbospark.cli.demo import DEFAULTS, run_demo
from turbospark.cli.simulate import RouterSimulator


def test_simulator_is_deterministic_and_routes_distinct_top_k() -> None:
    a = RouterSimulator(3, 16, 4, seed=7).run(50)
    b = RouterSimulator(3, 16, 4, seed=7).run(50)
    assert a[0].shape == (3, 50, 4) and a[1].shape == (3, 50, 4)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    selected = a[0].reshape(-1, 4)
    assert all(len(set(row)) == 4 for row in selected.tolist())
    assert selected.min() >= 0 and selected.max() < 16


def test_simulator_rejects_impossible_shapes() -> None:
    with pytest.raises(ValueError, match="top_k must be in 1..4"):
        RouterSimulator(2, 4, 5)
    with pytest.raises(ValueError, match="at least 1"):
        RouterSimulator(0, 4, 1)


def test_demo_capture_checks_out_and_the_predictor_beats_random(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.json"
    capture = run_demo(out, layers=6, experts=64, top_k=4, passes=300, seed=1)
    assert capfd.readouterr().err == f"[router-hist] wrote {out}\n"
    assert capture.header == {"num_layers": 6, "num_experts": 64, "top_k": 4}
    result = analyze(capture)
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    layers = result["layers"]
    assert [layer["passes"] for layer in layers] == [300] * 6
    assert capture.pred[0].shape == (0, 4)  # nothing predicts layer 0
    baseline = result["random_recall_baseline"]
    recalls = [layer["pilot_recall"] for layer in layers[1:]]
    assert min(recalls) > 0.6 and min(recalls) > 8 * baseline
    # Skewed, sticky routing: concentrated and reused, so windows overlap.
    for layer in layers:
        assert layer["entropy_bits"] < np.log2(64) - 0.3
        assert layer["reuse"] > 0.2
        assert layer["window_distinct"]["8"] < 0.8 * 8 * 4


def test_demo_in_self_mode_passes_the_self_test(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capture = run_demo(tmp_path / "self.json", layers=4, experts=32, top_k=2, passes=50, pilot="self")
    checked, failed = self_test(capture, analyze(capture))
    assert (checked, failed) == ([1, 2, 3], [])
    capfd.readouterr()


def test_demo_command_with_defaults_prints_the_analysis(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    assert main(["demo", "--out", str(out)]) == 0
    captured = capfd.readouterr()
    assert captured.err == f"[router-hist] wrote {out}\n"
    lines = captured.out.splitlines()
    assert lines[0] == (
        f"capture: {DEFAULTS['layers']} layers x {DEFAULTS['experts']} experts, "
        f"top-{DEFAULTS['top_k']}; trace: yes; predictions: yes"
    )
    assert any(line.startswith("  pilot recall: ") for line in lines)
    assert "check: trace matches counts: ok" in lines
    assert main(["analyze", str(out), "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["layers"][0]["passes"] == DEFAULTS["passes"]


def test_demo_command_json_and_self_mode(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.json"
    argv = ["demo", "--out", str(out), "--layers", "3", "--experts", "8", "--top-k", "2",
            "--passes", "20", "--seed", "4", "--pilot", "self", "--json", "--cache", "4"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    doc = json.loads(captured.out)
    assert [layer["pilot_recall"] for layer in doc["layers"]] == [None, 1.0, 1.0]
    assert list(doc["layers"][1]["lru_hit_rate"]) == ["4"]
    assert "self-test: pilot recall 100% on all 2 layers with predictions: ok" in captured.err


def test_demo_command_rejects_top_k_above_experts(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path / "x.json"), "--experts", "4", "--top-k", "8"]) == 2
    assert capfd.readouterr().err == "turbospark: --top-k 8 exceeds --experts 4\n"
