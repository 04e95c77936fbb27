"""What a streamed capture's loader does with rows the summary does not vouch for: recovered rows of
sequences its ``requests`` map lacks, values out of range in frames it does not checksum, and the CLI's
``--verify``.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.capture.reader import Request
from turbospark.capture.streamed import DamagedCapture
from turbospark.cli import main
from turbospark.recording.durable import _stream
from turbospark.vllm._recorder import VllmRecorder


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stream, "CHUNK_IDS", 4)


def _crashed_with_requests(path: Path) -> None:
    """A vLLM-style streamed capture whose process died after its checkpoint: sequence 2 began after it."""
    hist = VllmRecorder(str(path), 1, 8, 1, trace="stream")
    hist.request_entries = [Request(0, "a", 0, 0, 2), Request(1, "b", 0, 0, 2)]
    hist.record_batch(0, [[1], [2], [3], [4]], seq=[0, 0, 1, 1], phase="prompt")
    hist.write()  # the last checkpoint: two requests, four passes
    hist.record_batch(0, [[5], [6]], seq=[1, 1], phase="decode")
    hist.request_entries.append(Request(2, "c", 0, 0, 2))
    hist.record_batch(0, [[7], [0], [1], [2]], seq=[2, 2, 1, 2], phase="prompt")
    hist.discard()  # no final write: the frames after the checkpoint are on disk, the JSON is the checkpoint's


def test_recovered_passes_of_unmapped_sequences_are_dropped(tmp_path: Path, small_chunks: None) -> None:
    path = tmp_path / "c.json"
    _crashed_with_requests(path)
    assert len(json.loads(path.read_text())["requests"]) == 2
    with pytest.warns(RuntimeWarning) as caught:
        capture = turbospark.load(path)
    assert str(caught[0].message) == (
        f"{path}.trace: 2 passes beyond the last checkpoint were recovered (per layer [2]); 4 recovered passes of "
        "sequences the requests map does not describe (begun after the last checkpoint) were dropped (per layer "
        "[4]); the counts of those layers are recomputed from the rows on disk")
    # Kept up to the first pass of sequence 2: its passes, and every pass after it, are dropped.
    assert capture.trace[0].tolist() == [[1], [2], [3], [4], [5], [6]]
    assert capture.seq[0].tolist() == [0, 0, 1, 1, 1, 1]
    assert capture.phase[0].tolist() == [0, 0, 0, 0, 1, 1]
    assert capture.counts.tolist() == [[0, 1, 1, 1, 1, 1, 1, 0]]
    assert capture.stream.unmapped_passes.tolist() == [4]
    assert capture.stream.recovered_passes.tolist() == [2]


def test_two_ranks_recovered_after_a_crash_merge_into_distinct_sequences(tmp_path: Path, small_chunks: None,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        _crashed_with_requests(tmp_path / f"r{rank}.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert main(["merge", str(tmp_path / "r0.json"), str(tmp_path / "r1.json"), "-o",
                     str(tmp_path / "m.json")]) == 0
    merged = turbospark.load(tmp_path / "m.json")
    assert [(r.seq, r.request) for r in merged.requests] == [(0, "a"), (1, "b"), (2, "a"), (3, "b")]
    # Rank 1's sequences are 2 and 3: none of its passes takes a rank 0 request's id.
    assert merged.seq[0].tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3]


def _damaged(tmp_path: Path, experts: int = 100, tagged: bool = False) -> tuple[Path, Any]:
    """A closed streamed capture with one id (or sequence id) flipped in a frame the summary covers."""
    path = tmp_path / "c.json"
    hist = turbospark.RouterHistogram(str(path), 2, experts, 2, trace="stream")
    if tagged:
        hist.record_batch(0, [[1, 2], [3, 4]], seq=[0, 1], phase="decode")
    else:
        hist.record_many(0, [[1, 2], [3, 4]])
    hist.record(1, [5, 6])
    hist.close()
    sidecar = Path(str(path) + ".trace")
    data = bytearray(sidecar.read_bytes())
    # The first frame is layer 0's: header 64 bytes, frame header 40, then (seq 16 bytes,) ids.
    if tagged:
        data[64 + 40 + 8: 64 + 40 + 16] = struct.pack("<q", -3)
    else:
        data[64 + 40 + 1] = 0xC8  # id 2 becomes 200
    sidecar.write_bytes(bytes(data))
    return path, sidecar


def test_an_id_out_of_range_in_an_unverified_frame_is_refused_when_built(tmp_path: Path) -> None:
    path, sidecar = _damaged(tmp_path)
    capture = turbospark.load(path)  # covered by the summary: not checksummed
    with pytest.raises(DamagedCapture, match=rf"^{sidecar}: trace\[0\] holds expert id 200, outside 0..99 \(a "
                       r"damaged frame: turbospark.load\(..., verify=True\) \(--verify\) checks every frame's "
                       r"checksum\)$"):
        capture.trace[0]
    with pytest.raises(DamagedCapture, match=r"trace\[0\] holds expert id 200"):
        capture.trace.row_range(0, 0, 1)
    assert capture.trace[1].tolist() == [[5, 6]]
    with pytest.warns(RuntimeWarning, match="were not read"):
        verified = turbospark.load(path, verify=True)
    assert verified.stream.frames == 0


def test_a_negative_sequence_id_in_an_unverified_frame_is_refused(tmp_path: Path) -> None:
    path, sidecar = _damaged(tmp_path, tagged=True)
    capture = turbospark.load(path)
    with pytest.raises(DamagedCapture, match=rf"^{sidecar}: seq\[0\] holds a negative sequence id -3 \(a damaged"):
        capture.seq[0]


@pytest.mark.parametrize("command", [["analyze"], ["analyze", "--json"], ["export", "--to", "json", "-o", "OUT"],
                                     ["place", "--gpus", "2"], ["cache", "--slots", "2"]])
def test_the_cli_refuses_a_damaged_frame_with_exit_2(tmp_path: Path, command: list[str],
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    path, sidecar = _damaged(tmp_path)
    capfd.readouterr()
    out = tmp_path / "out.json"
    argv = [command[0], str(path)] + [str(out) if a == "OUT" else a for a in command[1:]]
    assert main(argv) == 2
    # One line, no traceback; analyze names the capture it could not read first.
    said = "cannot read " + str(path) + ": " if command[0] == "analyze" else ""
    assert capfd.readouterr().err == (
        f"turbospark: {said}{sidecar}: trace[0] holds expert id 200, outside 0..99 (a damaged frame: "
        "turbospark.load(..., verify=True) (--verify) checks every frame's checksum)\n")
    assert not out.exists()


@pytest.mark.parametrize("command", [["analyze"], ["export", "--to", "json", "-o", "OUT"], ["place", "--gpus", "2"],
                                     ["cache", "--slots", "2"]])
def test_verify_on_the_cli_checks_every_frame(tmp_path: Path, command: list[str],
                                              capfd: pytest.CaptureFixture[str]) -> None:
    path, sidecar = _damaged(tmp_path)
    out = tmp_path / "out.json"
    argv = [command[0], str(path)] + [str(out) if a == "OUT" else a for a in command[1:]] + ["--verify"]
    with pytest.warns(RuntimeWarning, match=rf"{sidecar}: 96 bytes from byte 64 on were not read"):
        status = main(argv)
    # Every frame from the damaged one on is left out (the warning says so); layer 0 then holds nothing.
    assert status in (0, 1), capfd.readouterr().err


def test_merge_and_compare_take_verify(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path, sidecar = _damaged(tmp_path)
    capfd.readouterr()
    assert main(["compare", str(path), str(path)]) == 2
    assert f"{sidecar}: trace[0] holds expert id 200" in capfd.readouterr().err
    with pytest.warns(RuntimeWarning, match="were not read"):
        assert main(["compare", str(path), str(path), "--verify"]) == 0
    assert main(["merge", str(path), str(path), "-o", str(tmp_path / "m.json")]) == 2
    assert not (tmp_path / "m.json").exists()
    with pytest.warns(RuntimeWarning, match="were not read"):
        assert main(["merge", str(path), str(path), "-o", str(tmp_path / "m.json"), "--verify"]) == 0
    assert np.array_equal(turbospark.load(tmp_path / "m.json").counts, np.zeros((2, 100), dtype=np.int64))


def test_analyze_files_refuses_a_file_replaced_between_its_tasks(tmp_path: Path) -> None:
    from turbospark.metrics import distributed

    path = tmp_path / "c.json"
    versions = []
    for passes in ([[1], [2]], [[3], [4]]):  # two checkpoints of one capture: the same size
        hist = turbospark.RouterHistogram(str(path), 2, 8, 1, trace=True)
        hist.record_many(0, passes)
        hist.record_many(1, passes)
        versions.append(hist.to_json().encode())
        hist.discard()
    assert len(versions[0]) == len(versions[1])
    path.write_bytes(versions[0])
    stamp = path.stat().st_mtime_ns
    replacement = tmp_path / "next.json"

    def run(function: Any, *iterables: Any) -> list[Any]:
        # Each task on a fresh worker, and the next checkpoint lands (same size, same mtime) after the first.
        out = []
        for index, args in enumerate(zip(*iterables)):
            distributed.forget_loaded()
            out.append(function(*args))
            if function is distributed.layer_task and index == 0:
                replacement.write_bytes(versions[1])
                os.utime(replacement, ns=(stamp, stamp))
                os.replace(replacement, path)
        return out

    with pytest.raises(ValueError, match=rf"^{path} changed while it was analysed \(a live capture's checkpoint "
                       r"replaced it, or its sidecar grew, between the tasks of layers 0 and 1\): its layers would "
                       r"mix two versions; analyze it again, or a copy of it$"):
        distributed.analyze_files([str(path)], [1], run=run)
