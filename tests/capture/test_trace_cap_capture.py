"""A capped trace's ``trace_cap`` / ``trace_dropped`` read by ``load``, checked, and shown by ``analyze``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.capture.merge import merge_captures
from turbospark.metrics.report import format_report
from turbospark.cli import main

# Layer 0: 3 passes, the first 2 kept; layer 1: 1 pass, nothing dropped.
CAPPED = (
    '{"num_layers":2,"num_experts":4,"top_k":2,"counts":[[1,2,2,1],[1,1,0,0]],'
    '"trace":[[0,1,1,2],[0,1]],"trace_cap":2,"trace_dropped":[1,0]}'
)


def _doc(**changes: Any) -> str:
    doc = json.loads(CAPPED)
    for key, value in changes.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    return json.dumps(doc)


def test_load_reads_the_cap_and_the_dropped_passes() -> None:
    capture = turbospark.loads(CAPPED)
    assert capture.trace_cap == 2
    assert capture.trace_dropped.dtype == np.int64 and capture.trace_dropped.tolist() == [1, 0]
    assert [t.shape for t in capture.trace] == [(2, 2), (1, 2)]


def test_an_uncapped_capture_has_neither() -> None:
    capture = turbospark.loads('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[1,0]],"trace":[[0]]}')
    assert capture.trace_cap is None and capture.trace_dropped is None
    assert "trace_cap" not in turbospark.analyze(capture)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trace_cap": None}, "'trace_dropped' is present without 'trace_cap': the two come together"),
        ({"trace_dropped": None}, "'trace_cap' is present without 'trace_dropped': the two come together"),
        ({"trace_cap": 0}, "trace_cap must be a positive integer, got 0"),
        ({"trace_cap": "2"}, "trace_cap must be a positive integer, got '2'"),
        ({"trace_cap": 2.0}, "trace_cap must be a positive integer, got 2.0"),
        ({"trace_dropped": [1]}, r"trace_dropped must be a list of num_layers=2 integers, got \[1\]"),
        ({"trace_dropped": 3}, "trace_dropped must be a list of num_layers=2 integers, got 3"),
        ({"trace_dropped": [1, -1]}, r"trace_dropped\[1\] must be a non-negative integer, got -1"),
        ({"trace_dropped": [True, 0]}, r"trace_dropped\[0\] must be a non-negative integer, got True"),
        ({"trace_cap": 1}, r"trace\[0\] keeps 2 passes, more than trace_cap=1"),
        ({"trace_dropped": [1, 2]}, r"trace_dropped\[1\] is 2, but trace\[1\] keeps 1 passes: a layer drops "
                                    r"passes only once its trace holds trace_cap=2"),
        ({"pred": [[], [0, 1, 2, 3, 0, 1]]}, r"pred\[1\] keeps 3 predictions, more than trace_cap=2"),
        ({"trace": None}, "'trace_cap' is present without 'trace': a cap is a capped trace's"),
    ],
)
def test_load_rejects_a_bad_cap(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        turbospark.loads(_doc(**changes))


def test_cli_exits_2_naming_the_key_and_value(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(_doc(trace_dropped=[1, -4]))
    assert main(["analyze", str(path)]) == 2
    assert capfd.readouterr().err == f"turbospark: cannot read {path}: trace_dropped[1] must be a non-negative integer, got -4\n"


def test_analyze_json_carries_the_cap(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "capped.json"
    path.write_text(CAPPED)
    assert main(["analyze", str(path), "--json"]) == 0
    result = json.loads(capfd.readouterr().out)
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    assert result["trace_cap"] == 2 and result["trace_dropped"] == [1, 0]
    assert [row["passes"] for row in result["layers"]] == [3, 1]


def test_text_report_says_what_was_dropped() -> None:
    capture = turbospark.loads(CAPPED)
    text = format_report(capture, turbospark.analyze(capture))
    lines = text.splitlines()
    assert lines[1] == ("trace capped at 2 passes per layer (trace metrics over each layer's first 2): "
                        "1 passes dropped (counted, not traced): layer 0 1")
    assert lines[-1] == "check: trace matches counts: ok (kept passes plus dropped ones)"


def test_text_report_of_a_cap_never_reached() -> None:
    capture = turbospark.loads(_doc(trace_dropped=[0, 0], counts=[[1, 2, 1, 0], [1, 1, 0, 0]]))
    lines = format_report(capture, turbospark.analyze(capture)).splitlines()
    assert lines[1] == "trace capped at 2 passes per layer (trace metrics over each layer's first 2): no pass dropped"
    assert lines[-1] == "check: trace matches counts: ok"


@pytest.mark.parametrize(
    "changes",
    [
        {"trace_dropped": [2, 0]},  # kept 2 + dropped 2 is not the 3 passes the counts hold
        {"counts": [[0, 2, 2, 2], [1, 1, 0, 0]]},  # expert 0 picked in the kept passes more than counted
        {"counts": [[1, 2, 2, 1], [2, 0, 0, 0]]},  # an undropped layer must match exactly
    ],
)
def test_a_capped_trace_that_contradicts_its_counts_fails_the_check(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], changes: dict[str, Any]
) -> None:
    path = tmp_path / "wrong.json"
    path.write_text(_doc(**changes))
    assert main(["analyze", str(path)]) == 1
    assert "CHECK FAILED: trace of layer(s)" in capfd.readouterr().out


def test_merge_refuses_a_trace_that_dropped_passes() -> None:
    capped = turbospark.loads(CAPPED)
    with pytest.raises(ValueError, match=r"cannot merge a.json: its trace is capped at 2 passes per layer and "
                                         r"dropped passes \(layer 0 1\); a merged trace would hide the gap"):
        merge_captures([("a.json", capped, None), ("b.json", capped, None)])
