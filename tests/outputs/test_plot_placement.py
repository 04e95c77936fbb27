"""``turbospark plot --placement FILE``: the figure's series are the document's figures; errors exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turbospark.cli import main

from conftest import require_module
from placement_helpers import traced, write_capture

PASSES = [[1, 0], [1, 2], [1, 3], [1, 2], [1, 3], [1, 2], [1, 3], [1, 2], [1, 3]]


def placement_file(tmp_path: Path, *extra: str) -> Path:
    capture = write_capture(tmp_path / "c.json", traced(4, 2, [PASSES, []]))
    out = tmp_path / "p.json"
    assert main(["place", capture, "--gpus", "2", "-o", str(out), *extra]) == 0
    return out


def test_series_are_the_documents_figures(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    require_module("matplotlib")
    from matplotlib.figure import Figure

    path = placement_file(tmp_path, "--fit", "0.5", "--batch", "2")
    drawn: list[Any] = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self), original(self, *a, **k))[1])
    image = tmp_path / "fig.png"
    assert main(["plot", "--placement", str(path), "-o", str(image)]) == 0
    assert capfd.readouterr().out.endswith(f"wrote {image}\n")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left, right = drawn[0].axes
    doc = json.loads(path.read_text())
    labels = [line.get_label() for line in left.get_lines()]
    # Trivial map 0 1 | 2 3: fit counts 1 4 2 1 -> 5 | 3 (0.25); test counts 0 5 2 3 -> 5 | 5 (0).
    # Placed [1, 3 | 2, 0]: 5 | 3 in sample, 8 | 2 out of sample (see test_place_cli).
    assert labels == ["trivial, in sample (mean 0.25)", "placed, in sample (mean 0.25)",
                      "trivial, out of sample (mean 0)", "placed, out of sample (mean 0.6)"]
    placed_out = left.get_lines()[3].get_ydata()
    assert placed_out[0] == doc["layers"][0]["after"]["out_of_sample"]["imbalance"] == 0.6
    assert np.isnan(placed_out[1])  # layer 1 has no load
    assert [line.get_label() for line in right.get_lines()][1] == "placed, in sample (mean 0.25)"


def test_default_output_beside_the_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("matplotlib")
    path = placement_file(tmp_path)
    assert main(["plot", "--placement", str(path)]) == 0
    assert capfd.readouterr().out.endswith(f"wrote {tmp_path / 'p.png'}\n")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_uses_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = placement_file(tmp_path)
    capfd.readouterr()
    assert main(["plot", str(path), "--placement", str(path)]) == 2
    assert capfd.readouterr().err == ("turbospark: plot takes a CAPTURE, --placement FILE, --cache FILE or --rebalance FILE "
                                      "(one of them)\n")
    assert main(["plot"]) == 2
    capfd.readouterr()
    sglang = tmp_path / "s.json"
    sglang.write_text('{"physical_to_logical_map":[[0,1]]}')
    assert main(["plot", "--placement", str(sglang)]) == 2
    assert capfd.readouterr().err == (f"turbospark: cannot read {sglang}: not turbospark's placement JSON "
                                      "(write it with `turbospark place --format json`)\n")


def test_without_matplotlib(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = placement_file(tmp_path)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    capfd.readouterr()
    assert main(["plot", "--placement", str(path), "-o", str(tmp_path / "x.png")]) == 2
    assert capfd.readouterr().err == (
        "turbospark: plotting needs matplotlib, which is not installed: pip install 'turbospark[plot]'\n")


@pytest.mark.parametrize("inputs, message", [
    ("[4]", "the placement's inputs must be an object, got [4]"),
    ('{"gpus": 2}', "the placement's inputs lack num_layers, num_experts, slots (write it with "
                    "`turbospark place --format json`)"),
])
def test_a_placement_document_with_bad_inputs_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                     inputs: str, message: str) -> None:
    # An inputs that is not an object gave an AttributeError traceback, one without its keys a KeyError.
    path = tmp_path / "p.json"
    path.write_text('{"inputs":%s,"layers":[]}' % inputs)
    assert main(["plot", "--placement", str(path)]) == 2
    assert capfd.readouterr() == ("", f"turbospark: cannot read {path}: {message}\n")
