"""Engine steps in the capture: ``mark_step`` writes ``step_passes``, in memory and streamed, on both cores;
``turbospark.load`` and the JSON export keep it; the rebalance tools use it instead of ``--batch``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.outputs.export_json import write_json
from turbospark.rebalance.per_step import per_step_imbalance
from turbospark.rebalance.steps import RECORDED, form_steps


def _record(recorder: Any) -> None:
    # Step 0: two passes of each layer; step 1: one pass of layer 0 only; step 2: empty; then an open step.
    recorder.record(0, [0, 1])
    recorder.record(1, [2, 3])
    recorder.record(0, [1, 2])
    recorder.record(1, [3, 0])
    assert recorder.mark_step() == 1
    recorder.record(0, [3, 2])
    assert recorder.mark_step() == 2
    assert recorder.mark_step() == 3
    recorder.record(1, [0, 1])


@pytest.mark.parametrize("trace", [True, "stream"])
def test_mark_step_writes_step_passes(make: Any, cls: Any, tmp_path: Path, trace: Any) -> None:
    recorder = make(2, 4, 2, cls=cls, trace=trace)
    _record(recorder)
    recorder.close()
    text = (tmp_path / "capture.json").read_text()
    assert json.loads(text)["step_passes"] == [[2, 1, 0], [2, 0, 0]]
    if trace is True:
        assert text.endswith(',"step_passes":[[2,1,0],[2,0,0]]}')
    capture = turbospark.load(tmp_path / "capture.json")
    assert capture.step_passes.tolist() == [[2, 1, 0], [2, 0, 0]]
    steps = form_steps(capture, batch=None)
    assert steps.how == RECORDED and steps.count == 4
    assert [s.tolist() for s in steps.layer(0)] == [[0, 0, 1], [0, 1, 0]]
    assert [s.tolist() for s in steps.layer(1)] == [[0, 0, 3], [0, 1, 0]]
    # Even dispatch on the trivial map, 2 GPUs (experts 0,1 | 2,3): step 0 layer 0 (3, 1), layer 1 (1, 3):
    # (6 - 4) / 4; step 1 layer 0 (0, 2); step 2 empty; step 3 (the open one) layer 1 (2, 0).
    series = per_step_imbalance(capture, np.tile(np.arange(4), (2, 1)), 2, steps, "even").series
    assert [None if v != v else v for v in series.tolist()] == [0.5, 1.0, None, 1.0]


def test_export_json_keeps_step_passes(make: Any, tmp_path: Path) -> None:
    recorder = make(2, 4, 2, trace=True)
    _record(recorder)
    recorder.close()
    raw = (tmp_path / "capture.json").read_bytes()
    out = io.BytesIO()
    write_json(turbospark.load(tmp_path / "capture.json"), out)
    assert out.getvalue() == raw


def test_without_marks_no_key(make: Any, tmp_path: Path) -> None:
    recorder = make(1, 4, 2, trace=True)
    recorder.record(0, [0, 1])
    recorder.close()
    assert "step_passes" not in json.loads((tmp_path / "capture.json").read_text())
    assert turbospark.load(tmp_path / "capture.json").step_passes is None


@pytest.mark.parametrize(("value", "message"), [
    ([[1, 2]], r"step_passes must hold one list per layer \(2\)"),
    ([[1, 2], [3]], r"step_passes lists differ in length \(\[1, 2\]\): every layer has the same steps"),
    ([[1, -1], [0, 0]], "step_passes\\[0\\]\\[1\\] must be a non-negative integer, got -1"),
])
def test_bad_step_passes_are_refused(value: Any, message: str) -> None:
    doc = {"num_layers": 2, "num_experts": 2, "top_k": 1, "counts": [[1, 0], [0, 1]], "step_passes": value}
    with pytest.raises(ValueError, match=message):
        turbospark.loads(json.dumps(doc))


def test_parquet_export_has_the_step_column(make: Any, tmp_path: Path) -> None:
    from conftest import require_module

    pq = require_module("pyarrow.parquet")
    from turbospark.outputs.parquet import export_parquet

    recorder = make(2, 4, 2, trace=True)
    _record(recorder)
    recorder.close()
    export_parquet([(str(tmp_path / "capture.json"), turbospark.load(tmp_path / "capture.json"))],
                   str(tmp_path / "out"))
    layer1 = pq.ParquetFile(tmp_path / "out" / "rank=0" / "layer=1" / "part-0.parquet").read()
    assert layer1.column_names == ["pass", "seq", "phase", "ids", "pred", "step"]
    assert layer1.column("step").to_pylist() == [0, 0, 3]
