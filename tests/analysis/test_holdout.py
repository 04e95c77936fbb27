"""``analyze --holdout F``: sets chosen on the first passes, judged on the rest; exact by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.analysis.capture import loads
from turbospark.cli import main
from turbospark.analysis.holdout import NO_TRACE, covered, holdout, top_set

from placement_helpers import traced, write_capture

# Four top-2 passes: fit = the first two, (0,1) (0,2); test = (0,1) (3,1).
DOC = traced(4, 2, [[[0, 1], [0, 2], [0, 1], [3, 1]]])


def test_holdout_by_hand() -> None:
    doc = holdout(loads(json.dumps(DOC)), 0.5)
    # Fit counts 2, 1, 1, 0 of 4: 50% -> {0}; 90%, 95%, 99% -> {0, 1, 2} (ties by lower id).
    assert doc == {"fraction": 0.5, "reason": None, "layers": [{
        "layer": 0, "fit_passes": 2, "test_passes": 2, "sets": {
            # Test selections 0 1 3 1: {0} holds 1 of 4, no whole pass.
            "0.5": {"experts": 1, "selections": 0.25, "passes": 0.0},
            # {0, 1, 2} holds 3 of 4; pass (0,1) is whole, (3,1) is not.
            "0.9": {"experts": 3, "selections": 0.75, "passes": 0.5},
            "0.95": {"experts": 3, "selections": 0.75, "passes": 0.5},
            "0.99": {"experts": 3, "selections": 0.75, "passes": 0.5},
        }}]}


def test_top_set_and_covered() -> None:
    assert top_set(np.array([1, 3, 3, 0]), 2).tolist() == [False, True, True, False]
    assert top_set(np.array([2, 1, 2, 0]), 1).tolist() == [True, False, False, False]
    assert covered(np.zeros((0, 2), dtype=np.int64), np.ones(3, dtype=bool)) == (None, None)


def test_no_fit_passes_gives_null_sets() -> None:
    doc = holdout(loads(json.dumps(traced(3, 1, [[[2]]]))), 0.5)
    assert doc["layers"] == [{"layer": 0, "fit_passes": 0, "test_passes": 1, "sets": None}]


def test_cli_text_and_json(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["analyze", path, "--holdout", "0.5"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[-3:] == [
        "holdout: sets chosen on the first 0.5 of each layer's passes, judged on the rest "
        "(n experts: share of test selections / of test passes wholly covered):",
        "layer  fit  test            cov50             cov90             cov95             cov99",
        "    0    2     2  1: 25.0% / 0.0%  3: 75.0% / 50.0%  3: 75.0% / 50.0%  3: 75.0% / 50.0%",
    ]
    assert main(["analyze", path, "--holdout", "0.5", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["holdout"] == holdout(loads(json.dumps(DOC)), 0.5)


def test_without_a_trace_says_why(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = {key: DOC[key] for key in ("num_layers", "num_experts", "top_k", "counts")}
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["analyze", path, "--holdout", "0.25"]) == 0
    out = capfd.readouterr().out
    assert out.endswith(f"\nholdout: sets chosen on the first 0.25 of each layer's passes, judged on the rest: "
                        f"not computable: {NO_TRACE}\n")
    assert main(["analyze", path, "--holdout", "0.25", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["holdout"] == {"fraction": 0.25, "reason": NO_TRACE, "layers": []}


def test_bad_fraction_exits_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["analyze", write_capture(tmp_path / "c.json", DOC), "--holdout", "1"])
    assert info.value.code == 2
    assert "--holdout: must be strictly between 0 and 1, got 1" in capfd.readouterr().err
