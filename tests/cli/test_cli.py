"""The ``turbospark`` command line: output, exit status, ``--self-test``, ``plot`` and ``python -m``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from childproc import run_python
from conftest import require_module
from turbospark.cli import main
from capture_helpers import RUST_TRACE

EXPECTED_JSON = (
    '{"num_layers": 2, "num_experts": 3, "top_k": 2, "random_recall_baseline": 0.6666666666666666, '
    '"checks": {"counts_sum_ok": true, "trace_matches_counts": true}, "layers": ['
    '{"layer": 0, "passes": 2, "entropy_bits": 1.5, "coverage": {"0.5": 1, "0.9": 3, "0.95": 3, "0.99": 3}, '
    '"window_distinct": {"1": 2.0, "2": 3.0}, "reuse": 0.5, "pilot_recall": null, "pilot_exact": null, '
    '"lru_hit_rate": {"2": 0.25}}, '
    '{"layer": 1, "passes": 1, "entropy_bits": 0.0, "coverage": {"0.5": 1, "0.9": 1, "0.95": 1, "0.99": 1}, '
    '"window_distinct": {"1": 1.0, "2": null}, "reuse": null, "pilot_recall": null, "pilot_exact": null, '
    '"lru_hit_rate": {"2": 0.0}}]}\n'
)


def write(tmp_path: Path, doc: dict[str, Any] | str, name: str = "capture.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")))
    return str(path)


def self_capture(pred_layer_2: list[int]) -> dict[str, Any]:
    """Three top-2 layers over two passes; the prediction rows mimic pilot='self'."""
    return {
        "num_layers": 3, "num_experts": 4, "top_k": 2,
        "counts": [[1, 1, 1, 1], [2, 1, 1, 0], [0, 2, 1, 1]],
        "trace": [[0, 1, 2, 3], [0, 1, 0, 2], [1, 2, 1, 3]],
        "pred": [[], [0, 1, 0, 2], pred_layer_2],
    }


def test_analyze_json_is_exactly_the_documented_document(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, RUST_TRACE)
    assert main(["analyze", path, "--json", "--window", "2", "--window", "1", "--cache", "2"]) == 0
    out = capfd.readouterr()
    assert out.out == EXPECTED_JSON


def test_analyze_json_default_windows(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", write(tmp_path, RUST_TRACE), "--json"]) == 0
    layer = json.loads(capfd.readouterr().out)["layers"][0]
    assert layer["window_distinct"] == {"1": 2.0, "2": 3.0, "4": None, "8": None}
    assert "lru_hit_rate" not in layer


def test_analyze_text_report(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = {
        "num_layers": 3, "num_experts": 3, "top_k": 2,
        "counts": [[0, 0, 0], [1, 1, 2], [0, 2, 0]], "trace": [[], [2, 0, 2, 1], [1, 1]],
    }
    assert main(["analyze", write(tmp_path, doc), "--cache", "2"]) == 0
    text = capfd.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "capture: 3 layers x 3 experts, top-2; trace: yes; predictions: no"
    header = lines[1].split()
    assert header == ["layer", "passes", "entropy", "cov50", "cov90", "cov95", "cov99",
                      "d@1", "d@2", "d@4", "d@8", "reuse", "recall", "exact", "lru@2"]
    assert lines[2].split() == ["0", "0"] + ["-"] * 13 + ["(never", "routed)"]
    assert lines[3].split() == ["1", "2", "1.50", "1", "3", "3", "3", "2.00", "3.00", "-", "-",
                                "50.0%", "-", "-", "25.0%"]
    assert "  routed layers: 2 of 3; never routed: 0" in lines
    assert "    M=2: 3.00 (vs 4, 25% fewer reads; uniform 2.67)" in lines
    assert "    M=4: - (fewer than 4 passes)" in lines
    assert "  LRU cache of 2 experts per layer: 12.5% hit rate" in lines
    assert "check: every layer's counts sum to top_k x passes: ok" in lines
    assert "check: trace matches counts: ok" in lines


def test_failed_count_check_exits_1_and_still_reports(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = {"num_layers": 3, "num_experts": 2, "top_k": 2, "counts": [[1, 1], [2, 1], [1, 0]]}
    assert main(["analyze", write(tmp_path, doc)]) == 1
    out = capfd.readouterr().out
    assert "CHECK FAILED: counts of layer(s) 1-2 do not sum to a multiple of top_k=2" in out
    assert "check: trace matches counts: n/a (no trace)" in out
    assert main(["analyze", write(tmp_path, doc), "--json"]) == 1
    assert json.loads(capfd.readouterr().out)["checks"] == {"counts_sum_ok": False, "trace_matches_counts": None}


def test_trace_mismatch_exits_1(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(RUST_TRACE)
    doc["counts"][1] = [1, 1, 0]
    assert main(["analyze", write(tmp_path, doc)]) == 1
    assert "CHECK FAILED: trace of layer(s) 1 does not reproduce the counts" in capfd.readouterr().out


def test_unreadable_or_malformed_file_exits_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "absent.json")
    assert main(["analyze", missing]) == 2
    assert capfd.readouterr().err == f"turbospark: cannot read {missing}: No such file or directory\n"
    bad = write(tmp_path, '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[1,0]],"trace":[[5]]}')
    assert main(["analyze", bad, "--json"]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    assert captured.err == f"turbospark: cannot read {bad}: trace[0] holds expert id 5, outside 0..1\n"
    assert main(["plot", bad]) == 2


def test_self_test_passes_on_a_self_mode_capture(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, self_capture([1, 2, 1, 3]))
    assert main(["analyze", path, "--self-test"]) == 0
    assert "self-test: pilot recall 100% on all 2 layers with predictions: ok" in capfd.readouterr().out


def test_self_test_names_the_failing_layers(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, self_capture([1, 2, 0, 3]))
    assert main(["analyze", path, "--self-test"]) == 1
    assert "SELF-TEST FAILED: pilot recall is not 100% on layer(s) 2 (75.0%)" in capfd.readouterr().out
    # With --json the document stays alone on stdout; the verdict goes to stderr.
    assert main(["analyze", path, "--self-test", "--json"]) == 1
    captured = capfd.readouterr()
    assert json.loads(captured.out)["layers"][2]["pilot_recall"] == 0.75
    assert "SELF-TEST FAILED: pilot recall is not 100% on layer(s) 2 (75.0%)" in captured.err


def test_self_test_fails_without_predictions(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", write(tmp_path, RUST_TRACE), "--self-test"]) == 1
    assert "SELF-TEST FAILED: no layer after layer 0 holds predictions" in capfd.readouterr().out
    # Without --self-test the same capture is fine.
    assert main(["analyze", write(tmp_path, RUST_TRACE)]) == 0


def test_self_test_fails_for_predictions_without_a_trace(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = self_capture([1, 2, 1, 3])
    del doc["trace"]
    assert main(["analyze", write(tmp_path, doc), "--self-test"]) == 1
    assert "layer(s) 1 (no trace to compare), 2 (no trace to compare)" in capfd.readouterr().out


@pytest.mark.parametrize("argv", [["analyze"], ["analyze", "x.json", "--window", "0"], ["analyze", "x.json", "--cache", "two"], ["bogus"]])
def test_bad_arguments_exit_2(argv: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    capfd.readouterr()


def test_no_command_prints_help_and_exits_2(capfd: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "analyze" in capfd.readouterr().err


def test_python_dash_m_runs_the_same_cli(tmp_path: Path) -> None:
    path = write(tmp_path, RUST_TRACE)
    done = run_python(
        "-m", "turbospark", "analyze", path, "--json", "--window", "1", "--window", "2", "--cache", "2", cwd=str(tmp_path)
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, EXPECTED_JSON, "")


# ------------------------------------------------------------------- plot


def test_plot_writes_a_png(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("matplotlib")
    doc = self_capture([1, 2, 1, 3])
    path = write(tmp_path, doc)
    out = tmp_path / "fig.png"
    assert main(["plot", path, "-o", str(out)]) == 0
    assert capfd.readouterr().out == f"wrote {out}\n"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plot_default_output_and_capture_without_trace(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("matplotlib")
    path = write(tmp_path, {"num_layers": 2, "num_experts": 3, "top_k": 1, "counts": [[0, 0, 0], [2, 1, 0]]}, "nt.json")
    assert main(["plot", path]) == 0
    assert capfd.readouterr().out == f"wrote {tmp_path / 'nt.png'}\n"
    assert (tmp_path / "nt.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes the import raise ImportError.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "fig.png"
    assert main(["plot", write(tmp_path, RUST_TRACE), "-o", str(out)]) == 2
    captured = capfd.readouterr()
    assert captured.err == (
        "turbospark: plotting needs matplotlib, which is not installed: pip install 'turbospark[plot]'\n"
    )
    assert not out.exists()
