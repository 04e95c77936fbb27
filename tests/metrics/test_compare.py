"""``turbospark compare A B``: exact values by hand, the text table, --json, and geometry mismatches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.capture.reader import loads
from turbospark.cli import main
from turbospark.metrics.compare import compare, js_divergence

from placement_helpers import traced, write_capture

# Layer 0: A routes 0 1 0 1, B routes 1 2 1 2. Layer 1: A routes 3 3 3 3, B never routes.
A = traced(4, 1, [[[0], [1], [0], [1]], [[3], [3], [3], [3]]])
B = traced(4, 1, [[[1], [2], [1], [2]], []])

EXPECTED_LAYERS = [
    # p = (1/2, 1/2, 0, 0), q = (0, 1/2, 1/2, 0), m = (1/4, 1/2, 1/4, 0): each KL to m is 1/2 bit.
    # 90% sets {0, 1} and {1, 2}: overlap 1 of 3; B's selections in {0, 1}: 2 of 4; B's passes: 2 of 4.
    {"layer": 0, "js_divergence": 0.5, "set90_a": 2, "set90_b": 2, "set90_overlap": 1 / 3,
     "a_on_b_selections": 0.5, "a_on_b_passes": 0.5},
    {"layer": 1, "js_divergence": None, "set90_a": 1, "set90_b": None, "set90_overlap": None,
     "a_on_b_selections": None, "a_on_b_passes": None},
]


def test_by_hand() -> None:
    doc = compare(loads(json.dumps(A)), loads(json.dumps(B)))
    assert doc == {"num_layers": 2, "num_experts": 4, "top_k": 1, "layers": EXPECTED_LAYERS,
                   "summary": {"js_divergence": 0.5, "set90_a": 1.5, "set90_b": 2.0, "set90_overlap": 1 / 3,
                               "a_on_b_selections": 0.5, "a_on_b_passes": 0.5}}


def test_js_divergence_bounds() -> None:
    assert js_divergence(np.array([3, 1]), np.array([6, 2])) == 0.0
    assert js_divergence(np.array([1, 0]), np.array([0, 5])) == 1.0
    assert js_divergence(np.array([0, 0]), np.array([0, 5])) is None


def test_cli_table_and_json(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    a, b = write_capture(tmp_path / "a.json", A), write_capture(tmp_path / "b.json", B)
    assert main(["compare", a, b]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[:5] == [
        f"compare A = {a} with B = {b}: 2 layers x 4 experts, top-1",
        "layer  JS bits  A90  B90  overlap  A90 on B sel  A90 on B passes",
        "    0   0.5000    2    2    33.3%         50.0%            50.0%",
        "    1        -    1    -        -             -                -",
        " mean   0.5000  1.5  2.0    33.3%         50.0%            50.0%",
    ]
    assert main(["compare", a, b, "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert (doc["a"], doc["b"], doc["layers"]) == (a, b, EXPECTED_LAYERS)


def test_without_b_trace_passes_are_null(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    b_counts = {key: B[key] for key in ("num_layers", "num_experts", "top_k", "counts")}
    a, b = write_capture(tmp_path / "a.json", A), write_capture(tmp_path / "b.json", b_counts)
    assert main(["compare", a, b, "--json"]) == 0
    layer = json.loads(capfd.readouterr().out)["layers"][0]
    assert (layer["a_on_b_selections"], layer["a_on_b_passes"]) == (0.5, None)


def test_geometry_mismatch_exits_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.json", A)
    c = write_capture(tmp_path / "c.json", traced(5, 1, [[[0]], [[4]]]))
    assert main(["compare", a, c]) == 2
    assert capfd.readouterr() == ("", f"turbospark: {a} and {c} differ in geometry: 2 layers x 4 experts, top-1 "
                                      "against 2 layers x 5 experts, top-1\n")
    missing = str(tmp_path / "nope.json")
    assert main(["compare", a, missing]) == 2
    assert capfd.readouterr().err == f"turbospark: cannot read {missing}: No such file or directory\n"
