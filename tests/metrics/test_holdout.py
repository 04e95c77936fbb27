"""``analyze --holdout F``: sets chosen on the first passes, judged on the rest; exact by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.capture.reader import loads
from turbospark.cli import main
from turbospark.metrics.holdout import NO_TRACE, covered, holdout, top_set

from placement_helpers import traced, write_capture

# Four top-2 passes: fit = the first two, (0,1) (0,2); test = (0,1) (3,1).
DOC = traced(4, 2, [[[0, 1], [0, 2], [0, 1], [3, 1]]])


def test_holdout_by_hand() -> None:
    doc = holdout(loads(json.dumps(DOC)), 0.5)
    # Fit counts 2, 1, 1, 0 of 4: 50% -> {0}; 90%, 95%, 99% -> {0, 1, 2} (ties by lower id).
    assert doc == {"fraction": 0.5, "reason": None, "layers": [{
        "layer": 0, "fit_passes": 2, "test_passes": 2, "split": "passes", "sets": {
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
    assert doc["layers"] == [{"layer": 0, "fit_passes": 0, "test_passes": 1, "split": "passes", "sets": None}]


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


def test_the_cut_is_floor_of_the_decimal_fraction(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # int(0.29 * 100) is 28: the double 0.29 times 100 is 28.999999999999996.
    doc = traced(3, 1, [[[i % 3] for i in range(100)]])
    assert [row["fit_passes"] for row in holdout(loads(json.dumps(doc)), 0.29)["layers"]] == [29]
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["analyze", path, "--holdout", "0.29", "--json"]) == 0
    layer = json.loads(capfd.readouterr().out)["holdout"]["layers"][0]
    assert (layer["fit_passes"], layer["test_passes"]) == (29, 71)
    # The text is read exactly, not through a double (which would round it up to 0.29).
    assert main(["analyze", path, "--holdout", "0.28999999999999999999", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["holdout"]["layers"][0]["fit_passes"] == 28


# A batched capture: four sequences' prompts first (phase 0), then their decode steps interleaved.
# By position the first half would be all prompt; by sequence, 7 and 3 (first seen) are fit, 9 and 5 test.
BATCHED = traced(4, 1, [[[0], [0], [1], [1], [2], [3], [2], [3], [2], [3]], [[1]]],
                 seq=[[7, 3, 9, 5, 7, 3, 9, 5, 7, 9], [4]], phase=[[0, 0, 0, 0, 1, 1, 1, 1, 1, 1], [1]])


def test_a_tagged_capture_is_split_by_whole_sequences(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = holdout(loads(json.dumps(BATCHED)), 0.5)
    # Layer 0: fit = passes 0, 1, 4, 5, 8 (sequences 7 and 3): experts 0 0 2 3 2 -> counts 2, 0, 2, 1.
    # Test = passes 2, 3, 6, 7, 9: experts 1 1 2 3 3. 50% of 5 fit selections: {0, 2} (ties by lower id).
    # Layer 1 holds one sequence: split by position, floor(0.5 x 1) = 0 fit passes.
    assert doc["layers"] == [
        {"layer": 0, "fit_passes": 5, "test_passes": 5, "split": "sequences", "sets": {
            "0.5": {"experts": 2, "selections": 0.2, "passes": 0.2},
            "0.9": {"experts": 3, "selections": 0.6, "passes": 0.6},
            "0.95": {"experts": 3, "selections": 0.6, "passes": 0.6},
            "0.99": {"experts": 3, "selections": 0.6, "passes": 0.6}}},
        {"layer": 1, "fit_passes": 0, "test_passes": 1, "split": "passes", "sets": None}]
    path = write_capture(tmp_path / "c.json", BATCHED)
    assert main(["analyze", path, "--holdout", "0.5"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[-4] == ("holdout: sets chosen on the first 0.5 of each layer's sequences (passes in a layer of "
                         "one sequence), judged on the rest (n experts: share of test selections / of test passes "
                         "wholly covered):")
