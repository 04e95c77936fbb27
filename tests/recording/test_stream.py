"""trace="stream": the trace, predictions and tags streamed to a checksummed sidecar, the rest in the JSON.

What must hold: a streamed capture loads into exactly the capture the
in-memory recorder (``trace=True``) gives for the same calls (same counts,
rows, tags, logit row; same ``export --to json`` bytes, same ``analyze
--json``); the file layout is the documented one, byte for byte; a sidecar
cut at any byte loads its whole frames and says what it dropped; a failed
write is counted, not hidden. Every test runs on both cores (``cls``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import turbospark
from turbospark.outputs.export_json import write_json
from turbospark.cli import main
from turbospark.recording.durable import _stream
from childproc import progress_until_killed, recording_forever, run_script

Recording = Callable[[Any], None]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 24 ids, so a short recording streams many of them."""
    monkeypatch.setattr(_stream, "CHUNK_IDS", 24)


def _mixed(seed: int, layers: int = 3, experts: int = 16, k: int = 2) -> Recording:
    """Every kind of call, in a seeded order: passes, blocks, masked blocks, tagged blocks, predictions, a logit row."""
    def run(hist: Any) -> None:
        rng = np.random.default_rng(seed)
        for step in range(40):
            layer = int(rng.integers(layers))
            kind = int(rng.integers(6))
            if kind == 0:
                hist.record(layer, rng.choice(experts, k, replace=False).tolist())
            elif kind == 1:
                hist.record_many(layer, rng.integers(0, experts, (int(rng.integers(1, 6)), k)))
            elif kind == 2:
                rows = int(rng.integers(1, 6))
                mask = rng.random(rows) < 0.6
                block = np.where(mask[:, None], rng.integers(0, experts, (rows, k)), -1)
                hist.record_many(layer, block, mask=mask)
            elif kind == 3 and step > 10:  # tags begin part-way: earlier passes read as the defaults
                rows = int(rng.integers(1, 6))
                hist.record_batch(layer, rng.integers(0, experts, (rows, k)), seq=rng.integers(0, 9, rows),
                                  phase="prompt" if rng.random() < 0.5 else "decode")
            elif kind == 4:
                hist.record_prediction(layer, rng.integers(0, experts, k))
            else:
                hist.record_prediction_many(layer, rng.integers(0, experts, (int(rng.integers(1, 4)), k)))
            hist.record_router_logits(1, rng.standard_normal(experts).astype(np.float32))
    return run


def _record(cls: Any, path: Path, recording: Recording, trace: Any, **options: Any) -> Any:
    hist = cls(str(path), 3, 16, 2, trace=trace, pilot="next", router_logits=(1, 3), **options)
    recording(hist)
    hist.close()
    return hist


def _exported(capture: Any) -> bytes:
    out = io.BytesIO()
    write_json(capture, out)
    return out.getvalue()


@pytest.mark.parametrize("seed", range(6))
def test_streamed_and_in_memory_captures_are_the_same_capture(tmp_path: Path, cls: Any, small_chunks: None,
                                                              seed: int, capfd: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "m").mkdir()
    _record(cls, tmp_path / "s" / "c.json", _mixed(seed), "stream")
    _record(cls, tmp_path / "m" / "c.json", _mixed(seed), True)
    in_memory = (tmp_path / "m" / "c.json").read_bytes()
    streamed = turbospark.load(tmp_path / "s" / "c.json")
    assert streamed.stream is not None and streamed.stream.frames > 10
    assert _exported(streamed) == in_memory
    capfd.readouterr()
    outputs = []
    for side in ("s", "m"):
        monkeypatch.chdir(tmp_path / side)
        assert main(["analyze", "c.json", "--json"]) == 0
        outputs.append(capfd.readouterr().out)
    assert outputs[0] == outputs[1]
    # The CLI export gives the same bytes.
    assert main(["export", str(tmp_path / "s" / "c.json"), "--to", "json", "-o", str(tmp_path / "e.json")]) == 0
    assert (tmp_path / "e.json").read_bytes() == in_memory


def test_the_summary_and_the_sidecar_byte_for_byte(tmp_path: Path, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 2, 300, 2, trace="stream")  # 300 experts: uint16 ids
    hist.record(0, [1, 299])
    hist.record_batch(1, [[5, 6], [7, 8]], seq=[3, 4], phase="prompt")
    hist.close()
    # Once a tagged pass is committed every frame carries tags: layer 0's pass reads as (seq 0, decode).
    size = 64 + (40 + 16) + (40 + 32)
    data = (tmp_path / "c.json.trace").read_bytes()
    run = data[24:40]  # the run id: random, the same in the header and the JSON
    assert run != bytes(16)
    assert path.read_text() == (
        '{"num_layers":2,"num_experts":300,"top_k":2,"counts":[' + ",".join(
            ["[" + ",".join("1" if e in (1, 299) else "0" for e in range(300)) + "]",
             "[" + ",".join("1" if e in (5, 6, 7, 8) else "0" for e in range(300)) + "]"]) + "]"
        f',"stream":{{"format":1,"run":"{run.hex()}","file":"c.json.trace","bytes":{size},"passes":[1,2]}}}}'
    )
    assert len(data) == size
    head = b"TSTRACE\x00" + struct.pack("<HHB3xII", 1, 64, 2, 2, 300) + run + bytes(20)
    assert data[:64] == head + struct.pack("<I", zlib.crc32(head))

    def frame(kind: int, flags: int, layer: int, rows: int, first: int, payload: bytes) -> bytes:
        payload += b"\x00" * (-len(payload) % 8)
        header = b"TSFR" + struct.pack("<BBxxIII4xQI", kind, flags, layer, rows, 2, first, len(payload))
        return header + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header))) + payload

    assert data[64:] == (
        frame(0, 1, 0, 1, 0, struct.pack("<q", 0) + struct.pack("<2H", 1, 299) + bytes([1]))
        + frame(0, 1, 1, 2, 0, struct.pack("<2q", 3, 4) + struct.pack("<4H", 5, 6, 7, 8) + bytes([0, 0]))
    )


def test_the_smallest_id_width(tmp_path: Path, cls: Any) -> None:
    for experts, dtype in ((2, np.uint8), (256, np.uint8), (257, np.uint16), (65536, np.uint16), (65537, np.uint32)):
        path = tmp_path / f"c{experts}.json"
        hist = cls(str(path), 1, experts, 1, trace="stream")
        hist.record(0, [experts - 1])
        hist.close()
        capture = turbospark.load(path)
        assert capture.trace[0].dtype == dtype
        assert capture.trace[0].tolist() == [[experts - 1]]


def _frame_ends(data: bytes) -> list[int]:
    ends, offset = [], 64
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset + 32)
        offset += 40 + size
        ends.append(offset)
    return ends


def test_a_sidecar_cut_at_any_byte_loads_its_whole_frames(tmp_path: Path, cls: Any, small_chunks: None) -> None:
    path = tmp_path / "c.json"
    _record(cls, path, _mixed(3), "stream")
    whole = (tmp_path / "c.json.trace").read_bytes()
    ends = _frame_ends(whole)
    assert len(ends) > 10
    reference = turbospark.load(path)
    # Per frame boundary, the rows each layer has once that frame is read (the in-memory capture's prefix).
    full = [reference.trace[layer] for layer in range(3)]
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir()
    shutil.copy(path, cut_dir / "c.json")
    for n in range(len(whole) + 1):
        (cut_dir / "c.json.trace").write_bytes(whole[:n])
        if n < 64:
            with pytest.raises(ValueError, match="c.json.trace: the file is .* shorter than the 64-byte header"):
                turbospark.load(cut_dir / "c.json")
            continue
        read_to = max([64] + [end for end in ends if end <= n])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            capture = turbospark.load(cut_dir / "c.json")
        assert capture.stream.read_bytes == read_to
        assert capture.stream.dropped_bytes == n - read_to
        for layer in range(3):
            rows = capture.trace[layer]
            assert rows.tolist() == full[layer][: rows.shape[0]].tolist()
            assert capture.counts[layer].tolist() == np.bincount(rows.ravel(), minlength=16).tolist()
        if n == len(whole):
            assert caught == []
        else:
            assert len(caught) == 1 and issubclass(caught[0].category, RuntimeWarning)
            assert "not read" in str(caught[0].message) or "not on disk" in str(caught[0].message)


def test_a_damaged_frame_stops_the_read_there(tmp_path: Path, cls: Any, small_chunks: None) -> None:
    path = tmp_path / "c.json"
    _record(cls, path, _mixed(4), "stream")
    sidecar = tmp_path / "c.json.trace"
    data = bytearray(sidecar.read_bytes())
    ends = _frame_ends(bytes(data))
    data[ends[4] + 45] ^= 0xFF  # inside frame 5's payload
    sidecar.write_bytes(bytes(data))
    # Covered by the summary (made durable before it): trusted unless verify=True.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert turbospark.load(path).stream.frames == len(ends)
    with pytest.warns(RuntimeWarning, match=rf"{len(data) - ends[4]} bytes from byte {ends[4]} on were not read"):
        capture = turbospark.load(path, verify=True)
    assert capture.stream.frames == 5 and capture.stream.read_bytes == ends[4]


def test_a_failed_write_is_counted_as_lost(tmp_path: Path, cls: Any, small_chunks: None,
                                           monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 2, trace="stream")
    real = os.pwrite
    failing = {"on": False}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if failing["on"]:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    hist.record_many(0, [[0, 1]] * 3)
    hist.write()
    failing["on"] = True
    hist.record_many(0, [[2, 3]] * 4)
    hist.write()  # the chunk fails; the summary still lands
    failing["on"] = False
    hist.record_many(0, [[4, 5]] * 2)
    hist.close()
    summary = json.loads(path.read_text())
    assert summary["counts"] == [[3, 3, 4, 4, 2, 2, 0, 0]]
    assert summary["stream"]["passes"] == [9] and summary["stream"]["lost_passes"] == [4]
    err = capfd.readouterr().err
    assert err.count("FAILED streaming the trace to") == 1
    assert summary["stream"]["lost_rows"] == [[[3, 7]]]
    # The frames after the gap are kept: the 4 lost passes are missing, the 2 after them are there.
    with pytest.warns(RuntimeWarning, match=r"4 passes are missing \(rows \[first, stop\) per layer: 0: \[3, 7\)\); "
                      r"the rows after a gap are kept.*; 4 passes the capture counts are not on disk \(per layer \[4\]\)"):
        capture = turbospark.load(path)
    assert capture.stream.stranded_frames == 0 and capture.stream.dropped_bytes == 0
    assert capture.stream.missing == (((3, 7),),) and capture.stream.breaks(0) == [3]
    assert capture.trace[0].tolist() == [[0, 1]] * 3 + [[4, 5]] * 2
    assert capture.counts.tolist() == [[3, 3, 0, 0, 2, 2, 0, 0]]


def test_refusals(tmp_path: Path, cls: Any) -> None:
    with pytest.raises(ValueError, match=r"^trace must be True, False or 'stream', got 'yes'$"):
        cls(str(tmp_path / "a.json"), 1, 4, 1, trace="yes")
    with pytest.raises(ValueError, match=r"^trace_cap=5 with trace='stream': a streamed trace keeps every pass"):
        cls(str(tmp_path / "b.json"), 1, 4, 1, trace="stream", trace_cap=5)
    hist = cls(str(tmp_path / "c.json"), 1, 4, 1, trace="stream")
    assert hist.streamed and " trace='stream' " in repr(hist)
    with pytest.raises(ValueError, match=r"^trace\(\): the trace is streamed to '.*c.json.trace'"):
        hist.trace(0)
    with pytest.raises(ValueError, match=r"^a streamed capture is written to its own path"):
        hist.write(str(tmp_path / "elsewhere.json"))
    hist.record(0, [2])
    hist.close()
    with pytest.raises(ValueError, match="this is a streamed capture's summary"):
        turbospark.loads((tmp_path / "c.json").read_text())
    assert turbospark.load(tmp_path / "c.json").trace[0].tolist() == [[2]]


def test_the_environment_asks_for_a_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "c.json"))
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "stream")
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE_CAP", "10")
    with pytest.warns(RuntimeWarning, match="ignoring TURBOSPARK_ROUTER_TRACE_CAP=10: the trace is streamed"):
        hist = turbospark.RouterHistogram.from_env(2, 4, 1)
    assert hist is not None and hist.streamed and hist.trace_cap is None
    hist.record(1, [3])
    hist.close()
    assert turbospark.load(tmp_path / "c.json").trace[1].tolist() == [[3]]


_BOUNDED = """
import numpy as np
path, trace = sys.argv[1], sys.argv[2]
hist = R(path, 8, 128, 8, trace=True if trace == "memory" else trace)
block = np.random.default_rng(0).integers(0, 128, (4096, 8))
hist.record_many(0, block)  # warm: the first chunk's buffers exist
before = peak_kib()
for step in range(1220):  # 40 M ids: 160 MB in memory as uint32
    hist.record_many(step % 8, block)
grown = (peak_kib() - before) // 1024
hist.close()
print(grown)
"""


def test_a_streamed_recorder_stays_bounded_however_long_it_records(tmp_path: Path) -> None:
    grown = {}
    for trace in ("stream", "memory"):
        result = run_script(tmp_path, _BOUNDED, str(tmp_path / f"{trace}.json"), trace, timeout=300)
        assert result.returncode == 0, result.stderr
        grown[trace] = int(result.stdout)
    # The documented bound (docs/stream.md): the core's buffers, the queue and the chunk being
    # written, about 24 MiB at the default chunk size; the in-memory trace holds all 160 MB.
    assert grown["stream"] < 48, grown
    assert grown["memory"] > 100, grown
    capture = turbospark.load(tmp_path / "stream.json")
    assert capture.counts.sum() == (1220 + 1) * 4096 * 8
    assert sum(capture.trace[layer].shape[0] for layer in range(8)) == (1220 + 1) * 4096


_KILLED_STREAM = recording_forever("""
import numpy as np
path = sys.argv[1]
hist = R(path, 4, 64, 4, trace="stream", checkpoint=0.25)
block = np.random.default_rng(0).integers(0, 64, (64, 4))
""", 'hist.record_batch((passes // 64) % 4, block, seq=np.full(64, passes // 256), phase="decode")', per_call=64,
    every=2048, pause=0.002)


def test_a_sigkilled_streamed_recorder_leaves_a_loadable_capture(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    progress, killed_at = progress_until_killed(tmp_path, _KILLED_STREAM, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # passes after the last checkpoint may be recovered
        capture = turbospark.load(path)
    on_disk = sum(capture.trace[layer].shape[0] for layer in range(4))
    assert int(capture.counts.sum()) == 4 * on_disk
    due = [passes for stamp, passes in progress if stamp <= killed_at - 0.25 - 0.5]
    assert due and on_disk >= due[-1]
    assert on_disk <= progress[-1][1] + 2048
    # Call i records 64 passes of layer i % 4 with seq i // 4: layer l's j-th block is seq j.
    for layer in range(4):
        blocks = capture.trace[layer].shape[0] // 64
        assert capture.seq[layer].tolist() == np.repeat(np.arange(blocks), 64).tolist()


def test_frames_in_either_order_give_the_same_rows(tmp_path: Path, cls: Any, small_chunks: None) -> None:
    path = tmp_path / "c.json"
    _record(cls, path, _mixed(5), "stream")
    sidecar = tmp_path / "c.json.trace"
    data = sidecar.read_bytes()
    reference = turbospark.load(path)
    expected = [reference.trace[layer].tolist() for layer in range(3)]
    exported = _exported(reference)
    del reference  # it maps the file rewritten below
    starts = [64] + _frame_ends(data)[:-1]
    frames = [data[start:end] for start, end in zip(starts, _frame_ends(data))]
    frames[2], frames[7] = frames[7], frames[2]
    frames[3], frames[4] = frames[4], frames[3]
    sidecar.write_bytes(data[:64] + b"".join(frames))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        capture = turbospark.load(path, verify=True)
    assert [capture.trace[layer].tolist() for layer in range(3)] == expected
    assert _exported(capture) == exported


def test_checkpoints_racing_the_recording_thread_lose_and_misplace_nothing(
        tmp_path: Path, cls: Any, small_chunks: None, interleave: None) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "m").mkdir()
    streamed = cls(str(tmp_path / "s" / "c.json"), 3, 16, 2, trace="stream", pilot="next", checkpoint=0.001)
    in_memory = cls(str(tmp_path / "m" / "c.json"), 3, 16, 2, trace=True, pilot="next")
    rng = np.random.default_rng(9)
    for step in range(3000):
        ids = rng.integers(0, 16, (2, 2))
        for hist in (streamed, in_memory):
            hist.record_batch(step % 3, ids, seq=[step, step + 1], phase="decode")
            hist.record_prediction_many((step + 1) % 3, ids)
    streamed.close()
    in_memory.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        capture = turbospark.load(tmp_path / "s" / "c.json", verify=True)
    assert _exported(capture) == (tmp_path / "m" / "c.json").read_bytes()


def test_a_new_recording_leaves_a_loaded_capture_reading_the_old_file(tmp_path: Path, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 1, trace="stream")
    hist.record_many(0, [[1], [2], [3]])
    hist.close()
    old = turbospark.load(path)
    again = cls(str(path), 1, 8, 1, trace="stream")  # replaces the sidecar
    again.record(0, [7])
    again.close()
    assert old.trace[0].tolist() == [[1], [2], [3]]
    assert turbospark.load(path).trace[0].tolist() == [[7]]


def test_a_writer_that_fails_otherwise_counts_the_rows_and_goes_on(tmp_path: Path, cls: Any,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    from turbospark.capture import _stream_format

    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 1, trace="stream")
    real = _stream_format.pack_frame
    monkeypatch.setattr(_stream_format, "pack_frame", lambda *a: (_ for _ in ()).throw(MemoryError("no room")))
    hist.record_many(0, [[1], [2]])
    hist.write()
    monkeypatch.setattr(_stream_format, "pack_frame", real)
    hist.record(0, [3])
    hist.close()
    assert json.loads(path.read_text())["stream"]["lost_passes"] == [2]
    assert "FAILED streaming the trace to " in capfd.readouterr().err
    with pytest.warns(RuntimeWarning, match=r"2 passes are missing \(rows \[first, stop\) per layer: 0: \[0, 2\)\)"):
        assert turbospark.load(path).trace[0].tolist() == [[3]]


def _serving(hist: Any) -> None:
    """Batches of 8 sequences through 4 layers, prompt then decode, with one-layer-ahead predictions."""
    rng = np.random.default_rng(1)
    for step in range(120):
        seqs = np.arange(8) + 8 * (step // 40)
        for layer in range(4):
            ids = np.argsort(rng.random((8, 32)), axis=1)[:, :4]
            hist.record_batch(layer, ids, seq=seqs, phase="prompt" if step % 40 < 3 else "decode")
            if layer < 3:
                hist.record_prediction_many(layer + 1, ids)


@pytest.mark.parametrize("argv", [
    ["analyze", "c.json", "--holdout", "0.5", "--json"],
    ["analyze", "c.json", "--cache", "8", "--json"],
    ["compare", "c.json", "c.json", "--json"],
    ["cache", "c.json", "--slots", "8", "16", "--json"],
    ["place", "c.json", "--gpus", "4", "--fit", "0.5", "-o", "-"],
    ["place", "c.json", "--gpus", "4", "--batch", "8", "-o", "-"],
    ["export", "c.json", "--to", "sglang"],
])
def test_every_decision_command_reads_a_streamed_capture_as_its_in_memory_twin(
        tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    outputs = []
    for side, trace in (("s", "stream"), ("m", True)):
        (tmp_path / side).mkdir()
        hist = turbospark.RouterHistogram(str(tmp_path / side / "c.json"), 4, 32, 4, trace=trace, pilot="next")
        _serving(hist)
        hist.close()
        monkeypatch.chdir(tmp_path / side)
        capfd.readouterr()
        assert main(argv) == 0
        outputs.append(capfd.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0]


def test_the_routed_experts_export_of_a_streamed_capture(tmp_path: Path, small_chunks: None) -> None:
    arrays = []
    for side, trace in (("s", "stream"), ("m", True)):
        path = tmp_path / f"{side}.json"
        hist = turbospark.RouterHistogram(str(path), 4, 32, 4, trace=trace, pilot="next")
        _serving(hist)
        hist.close()
        assert main(["export", str(path), "--to", "routed-experts", "-o", str(tmp_path / f"{side}.npz")]) == 0
        with np.load(tmp_path / f"{side}.npz") as data:
            arrays.append({name: data[name] for name in data.files})
    assert arrays[0].keys() == arrays[1].keys()
    for name in arrays[0]:
        assert arrays[0][name].dtype == arrays[1][name].dtype
        assert np.array_equal(arrays[0][name], arrays[1][name])


_RECORD_LONG = """
import numpy as np
hist = R(sys.argv[1], 8, 128, 8, trace="stream")
block = np.random.default_rng(0).integers(0, 128, (4096, 8))
for step in range(1200):  # 40 M ids over 8 interleaved layers: a 40 MB sidecar of ~38 chunks
    hist.record_many(step % 8, block)
hist.close()
"""

_LOAD_ALL = """
before = peak_kib()
capture = turbospark.load(sys.argv[1])
rows = 0
for layer in range(capture.num_layers):
    rows += capture.trace[layer].shape[0]  # built, read, dropped (the capture keeps its last 4)
print((peak_kib() - before) // 1024, rows)
"""


def test_loading_every_layer_of_a_streamed_capture_stays_bounded(tmp_path: Path) -> None:
    path = str(tmp_path / "c.json")
    assert run_script(tmp_path, _RECORD_LONG, path, timeout=300).returncode == 0
    result = run_script(tmp_path, _LOAD_ALL, path, timeout=300)
    assert result.returncode == 0, result.stderr
    grown, rows = map(int, result.stdout.split())
    assert rows == 1200 * 4096
    # Four built layers (4.9 MB each) and the frame walk, not the 40 MB file: docs/stream.md's bound.
    assert grown < 40, grown
