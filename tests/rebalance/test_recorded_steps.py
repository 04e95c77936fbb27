"""Engine steps in the capture: ``mark_step`` writes ``step_passes``, in memory and streamed (in the sidecar,
O(layers) memory however many steps), on both cores; ``turbospark.load`` and the JSON export keep it; the
rebalance tools use it instead of ``--batch``."""

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
    if trace is True:
        assert text.endswith(',"step_passes":[[2,1,0],[2,0,0]]}')
    else:
        # Streamed: the steps are in the sidecar (kind 2 frames) as the rows are; the JSON says how many.
        assert "step_passes" not in json.loads(text) and json.loads(text)["stream"]["steps"] == 3
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


def _random_run(recorders: list[Any], steps: int, seed: int = 0) -> None:
    """``steps`` engine steps of 0..6 passes per layer (3 layers), the same calls on every recorder."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for layer in range(3):
            rows = rng.integers(0, 8, (int(rng.integers(0, 7)), 2))
            for recorder in recorders:
                if rows.shape[0]:
                    recorder.record_many(layer, rows)
        for recorder in recorders:
            recorder.mark_step()


def test_streamed_steps_stay_bounded_and_load_as_in_memory(make: Any, cls: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks: the marks go to the sidecar with the rows, the recorder keeps only those not yet handed
    over, and the loaded steps equal an in-memory twin's; checkpoints between say how many steps they cover."""
    from turbospark.recording.durable import _stream

    monkeypatch.setattr(_stream, "CHUNK_IDS", 64)
    streamed = make(3, 8, 2, cls=cls, trace="stream")
    twin = make(3, 8, 2, cls=cls, trace=True, name="twin.json")
    _random_run([streamed, twin], 200)
    assert len(streamed._step_marks._marks) < 20  # not 200: handed over with each chunk's rows
    streamed.write()
    summary = json.loads((tmp_path / "capture.json").read_text())["stream"]
    assert summary["steps"] == 200
    middle = turbospark.load(tmp_path / "capture.json")
    _random_run([streamed, twin], 50, seed=1)
    streamed.close()
    twin.close()
    expected = turbospark.load(tmp_path / "twin.json").step_passes
    assert expected.shape == (3, 250)
    assert turbospark.load(tmp_path / "capture.json").step_passes.tolist() == expected.tolist()
    assert middle.step_passes.tolist() == expected[:, :200].tolist()


def test_steps_of_a_killed_streamed_recorder_stop_at_its_rows(make: Any, tmp_path: Path) -> None:
    """A step frame whose rows never reached the file (the process died): the steps are cut where a step
    would hold passes beyond the layer's rows; the passes after the last whole step are one open step."""
    import os
    import struct

    from turbospark.capture import _stream_format as fmt

    recorder = make(1, 4, 2, trace="stream")
    recorder.record_many(0, [[0, 1], [1, 2]])
    recorder.mark_step()
    recorder.record_many(0, [[2, 3]])
    recorder.mark_step()
    recorder.close()
    sidecar = str(tmp_path / "capture.json.trace")
    # One more step frame, as a later hand-over would have written it, for 5 passes never on disk.
    with open(sidecar, "ab") as handle:
        handle.write(fmt.pack_frame(fmt.STEPS, 0, 0, 1, 1, 2, struct.pack("<I", 5)))
    assert os.path.getsize(sidecar) % 8 == 0
    capture = turbospark.load(tmp_path / "capture.json")
    assert capture.step_passes.tolist() == [[2, 1]]


def test_steps_the_summary_counts_but_the_file_lost_are_unknown(make: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed write of a step frame: the JSON says which steps were lost, and the capture's steps are
    unknown (None, warned) rather than placed wrongly; the rows themselves load."""
    import errno
    import os

    from turbospark.capture import _stream_format as fmt

    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if bytes(data[4:5]) == bytes([fmt.STEPS]) and bytes(data[:4]) == fmt.FRAME_MAGIC:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    recorder = make(1, 4, 2, trace="stream")
    recorder.record_many(0, [[0, 1], [1, 2]])
    recorder.mark_step()
    recorder.close()
    summary = json.loads((tmp_path / "capture.json").read_text())["stream"]
    assert (summary["steps"], summary["lost_steps"]) == (1, [[0, 1]])
    with pytest.warns(RuntimeWarning, match=r"engine steps 0 to 1 that its summary counts are not in the file"):
        capture = turbospark.load(tmp_path / "capture.json")
    assert capture.step_passes is None and capture.trace[0].tolist() == [[0, 1], [1, 2]]
