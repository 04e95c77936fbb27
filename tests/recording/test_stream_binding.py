"""A streamed capture's two files belong to one run: the sidecar's header and the JSON's ``stream`` member
carry the same run id, the loader refuses a pair that does not, a new run replaces the JSON as it starts,
two live recorders never share one path, and the two files land in one directory whatever the cwd does.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

import turbospark
from turbospark.recording.durable import _stream
from childproc import run_script


def _run_id(sidecar: Path) -> str:
    return sidecar.read_bytes()[24:40].hex()


def test_the_json_and_the_sidecar_carry_one_run_id(tmp_path: Path, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 1, trace="stream")
    hist.record(0, [3])
    hist.close()
    run = _run_id(tmp_path / "c.json.trace")
    assert len(run) == 32 and run != "0" * 32
    assert json.loads(path.read_text())["stream"]["run"] == run
    again = cls(str(path), 1, 8, 1, trace="stream")
    again.close()
    assert _run_id(tmp_path / "c.json.trace") not in (run, "0" * 32)


def test_a_new_run_writes_its_json_as_it_starts(tmp_path: Path, cls: Any) -> None:
    path = tmp_path / "c.json"
    old = cls(str(path), 2, 8, 1, trace="stream")
    old.record_many(0, [[1], [2], [3]])
    old.close()
    new = cls(str(path), 2, 8, 1, trace="stream")
    # Before its first record, let alone its first checkpoint: the JSON at the path is already this run's.
    summary = json.loads(path.read_text())
    assert summary["counts"] == [[0] * 8, [0] * 8]
    assert summary["stream"]["run"] == _run_id(tmp_path / "c.json.trace")
    assert summary["stream"]["passes"] == [0, 0] and summary["stream"]["bytes"] == 64
    capture = turbospark.load(path)
    assert capture.counts.tolist() == [[0] * 8, [0] * 8] and capture.trace[0].tolist() == []
    new.close()


_KILLED_NEW_RUN = """
from turbospark.recording.durable import _stream
_stream.CHUNK_IDS = 4
path = sys.argv[1]
hist = R(path, 1, 8, 1, trace="stream")
hist.record_many(0, [[5]] * 10)
hist._stream.flush()  # the chunks taken so far are on disk
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_new_run_killed_before_its_first_write_loads_its_own_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    old = turbospark.RouterHistogram(str(path), 1, 8, 1, trace="stream")
    old.record_many(0, [[1], [2], [3]])
    old.close()
    result = run_script(tmp_path, _KILLED_NEW_RUN, str(path))
    assert result.returncode == -9, result.stderr
    with pytest.warns(RuntimeWarning, match=r"10 passes beyond the last checkpoint were recovered \(per layer \[10\]\)"):
        capture = turbospark.load(path)
    # The old run's counts (1, 2, 3) are gone with its JSON; the new run's chunks are recovered.
    assert capture.trace[0].tolist() == [[5]] * 10
    assert capture.counts.tolist() == [[0, 0, 0, 0, 0, 10, 0, 0]]


def test_a_sidecar_of_another_run_is_refused(tmp_path: Path, cls: Any) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        hist = cls(str(tmp_path / name / "c.json"), 1, 8, 1, trace="stream")
        hist.record(0, [1 if name == "a" else 2])
        hist.close()
    runs = {name: _run_id(tmp_path / name / "c.json.trace") for name in ("a", "b")}
    shutil.copy(tmp_path / "b" / "c.json.trace", tmp_path / "a" / "c.json.trace")
    json_path, sidecar = tmp_path / "a" / "c.json", tmp_path / "a" / "c.json.trace"
    with pytest.raises(ValueError) as caught:
        turbospark.load(json_path)
    assert str(caught.value) == (
        f"{sidecar} is run {runs['b']}, but {json_path} is run {runs['a']}: the JSON and the sidecar are two "
        "runs' files (a new recording at this path replaced one of them), and read together they would mix two runs")


def _unbound(tmp_path: Path, cls: Any) -> tuple[Path, Path]:
    """A capture as a writer before run ids made it: header bytes 24..39 zero, no ``run`` in the JSON."""
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 1, trace="stream")
    hist.record_many(0, [[4], [6]])
    hist.close()
    sidecar = tmp_path / "c.json.trace"
    data = bytearray(sidecar.read_bytes())
    data[24:40] = bytes(16)
    data[60:64] = struct.pack("<I", zlib.crc32(bytes(data[:60])))
    sidecar.write_bytes(bytes(data))
    summary = json.loads(path.read_text())
    run = summary["stream"].pop("run")
    path.write_text(json.dumps(summary, separators=(",", ":")))
    return path, sidecar, run  # type: ignore[return-value]


def test_files_written_before_run_ids_still_load(tmp_path: Path, cls: Any) -> None:
    path, sidecar, _ = _unbound(tmp_path, cls)
    capture = turbospark.load(path, verify=True)
    assert capture.trace[0].tolist() == [[4], [6]]


def test_a_bound_file_beside_an_unbound_one_is_refused(tmp_path: Path, cls: Any) -> None:
    path, sidecar, run = _unbound(tmp_path, cls)
    summary = json.loads(path.read_text())
    summary["stream"]["run"] = run
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=rf"^{sidecar} is run none \(written before run ids\), but {path} is run "
                       rf"{run}: the JSON and the sidecar are two runs' files"):
        turbospark.load(path)
    del summary["stream"]["run"]
    path.write_text(json.dumps(summary))
    hist = cls(str(tmp_path / "new.json"), 1, 8, 1, trace="stream")
    hist.close()
    shutil.copy(tmp_path / "new.json.trace", sidecar)
    new_run = _run_id(sidecar)
    with pytest.raises(ValueError, match=rf"^{sidecar} is run {new_run}, but {path} is run none \(written before "
                       "run ids\\): the JSON and the sidecar are two runs' files"):
        turbospark.load(path)


def test_a_malformed_run_id_is_refused(tmp_path: Path, cls: Any) -> None:
    path = tmp_path / "c.json"
    cls(str(path), 1, 8, 1, trace="stream").close()
    summary = json.loads(path.read_text())
    for bad in ("ABC", 7, "0" * 32, "g" * 32):
        summary["stream"]["run"] = bad
        path.write_text(json.dumps(summary))
        with pytest.raises(ValueError, match=r"^stream.run must be 32 lowercase hex digits, not all 0, got "
                           + repr(bad).replace("(", r"\(")):
            turbospark.load(path)


def test_a_second_recorder_on_a_live_path_is_refused(tmp_path: Path, cls: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.json"
    first = cls(str(path), 1, 8, 1, trace="stream")
    first.record(0, [1])
    with pytest.raises(OSError) as caught:
        cls(str(path), 1, 8, 1, trace="stream")
    assert str(caught.value) == (
        f"[Errno 16] cannot create the streamed trace: another streamed recorder is recording to it (it holds "
        f"the file's lock); give each recorder its own path ({{rank}} or {{pid}} in it): '{path}.trace'")
    # From the environment too: falling back to an in-memory trace would still overwrite the first's JSON.
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(path))
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "stream")
    with pytest.raises(_stream.StreamBusy):
        cls.from_env(1, 8, 1)
    first.record(0, [2])
    first.close()
    assert turbospark.load(path).trace[0].tolist() == [[1], [2]]
    # Closed, the path is free again.
    third = cls(str(path), 1, 8, 1, trace="stream")
    third.record(0, [7])
    third.close()
    assert turbospark.load(path).trace[0].tolist() == [[7]]


_SECOND_PROCESS = """
path = sys.argv[1]
try:
    R(path, 1, 8, 1, trace="stream")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""


def test_a_recorder_in_another_process_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    first = turbospark.RouterHistogram(str(path), 1, 8, 1, trace="stream")
    first.record(0, [3])
    result = run_script(tmp_path, _SECOND_PROCESS, str(path))
    assert result.stdout == "StreamBusy 16\n", result.stderr
    first.close()
    assert turbospark.load(path).trace[0].tolist() == [[3]]


def test_a_relative_path_stays_one_directory_after_chdir(tmp_path: Path, cls: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    hist = cls("c.json", 1, 8, 1, trace="stream")
    assert hist.path == str(tmp_path / "run" / "c.json")
    hist.record(0, [5])
    os.chdir(tmp_path / "elsewhere")
    hist.close()
    assert sorted(os.listdir(tmp_path / "elsewhere")) == []
    assert sorted(os.listdir(tmp_path / "run")) == ["c.json", "c.json.trace"]
    assert turbospark.load(tmp_path / "run" / "c.json").trace[0].tolist() == [[5]]


def test_sizes_the_sidecar_cannot_hold_are_refused_before_any_file(tmp_path: Path, cls: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.json"
    with pytest.raises(ValueError, match=r"^trace='stream' records num_experts up to 4294967295 \(its sidecar "
                       r"header holds 4 bytes\), got num_experts=4294967296; use trace=True$"):
        cls(str(path), 1, 2**32, 1, trace="stream")
    assert os.listdir(tmp_path) == []
    # From the environment too (an invalid size, as from_env says of every size).
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(path))
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "stream")
    with pytest.raises(ValueError, match=r"^trace='stream' records num_experts up to 4294967295"):
        cls.from_env(1, 2**32, 1)
    assert os.listdir(tmp_path) == []
