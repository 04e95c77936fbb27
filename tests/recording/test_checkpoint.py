"""Checkpoints: the capture rewritten atomically every N seconds, so a kill loses at most one interval.

``checkpoint=`` (constructor) and ``TURBOSPARK_ROUTER_HIST_CHECKPOINT``
(environment). Every checkpoint is the capture as ``to_json()`` would give
it at that moment; the write at close is always the last one; a SIGKILLed
process leaves a loadable capture no older than one interval.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from typing import Any, Callable

import pytest

import turbospark
from childproc import progress_until_killed, recording_forever

CHECKPOINT = "TURBOSPARK_ROUTER_HIST_CHECKPOINT"


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("the condition was not met in time")
        time.sleep(0.01)


def _checkpoint_threads() -> int:
    return sum(thread.name == "turbospark-checkpoint" for thread in threading.enumerate())


@pytest.mark.parametrize("value, error, message", [
    ("1", TypeError, "checkpoint must be None or a number of seconds, got str '1'"),
    (True, TypeError, "checkpoint must be None or a number of seconds, got bool True"),
    (0, ValueError, "checkpoint must be a positive, finite number of seconds, got 0"),
    (-1.5, ValueError, "checkpoint must be a positive, finite number of seconds, got -1.5"),
    (float("inf"), ValueError, "checkpoint must be a positive, finite number of seconds, got inf"),
    (float("nan"), ValueError, "checkpoint must be a positive, finite number of seconds, got nan"),
])
def test_bad_interval_is_refused_before_anything_starts(tmp_path: Any, cls: Any, value: Any, error: type,
                                                         message: str) -> None:
    before = _checkpoint_threads()
    with pytest.raises(error) as caught:
        cls(str(tmp_path / "c.json"), 2, 4, 2, checkpoint=value)
    assert str(caught.value) == message
    assert _checkpoint_threads() == before
    assert not (tmp_path / "c.json").exists()


def test_checkpoints_follow_the_recording_and_close_writes_last(tmp_path: Any, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 2, 4, 2, trace=True, checkpoint=0.05)
    assert hist.checkpoint == 0.05
    hist.record(0, [1, 2])
    first = hist.to_json()
    _wait_for(lambda: path.exists() and path.read_text() == first)
    hist.record(1, [0, 3])
    second = hist.to_json()
    _wait_for(lambda: path.read_text() == second)
    hist.close()
    assert path.read_text() == second
    # No checkpoint after close: a removed file stays removed.
    path.unlink()
    time.sleep(0.2)
    assert not path.exists()


def test_without_checkpoint_nothing_is_written_before_close(tmp_path: Any, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 4, 2)
    assert hist.checkpoint is None
    hist.record(0, [1, 2])
    time.sleep(0.1)
    assert not path.exists()
    hist.close()
    assert json.loads(path.read_text())["counts"] == [[0, 1, 1, 0]]


def test_dropping_the_recorder_writes_it_and_ends_its_thread(tmp_path: Any, cls: Any) -> None:
    path = tmp_path / "c.json"
    before = _checkpoint_threads()
    hist = cls(str(path), 1, 4, 2, checkpoint=0.02)
    assert _checkpoint_threads() == before + 1
    hist.record(0, [3, 0])
    del hist  # the thread holds it weakly: dropping it writes at once
    assert json.loads(path.read_text())["counts"] == [[1, 0, 0, 1]]
    _wait_for(lambda: _checkpoint_threads() == before)


def test_discard_stops_checkpoints(tmp_path: Any, cls: Any) -> None:
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 4, 2, checkpoint=0.02)
    hist.discard()
    time.sleep(0.15)
    assert not path.exists()


def test_a_failing_checkpoint_is_reported_once_and_recording_goes_on(tmp_path: Any, cls: Any,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    path = directory / "c.json"
    hist = cls(str(path), 1, 4, 2, checkpoint=0.02)
    directory.rmdir()  # every checkpoint now fails
    time.sleep(0.2)
    hist.record(0, [0, 1])
    directory.mkdir()
    _wait_for(lambda: path.exists() and json.loads(path.read_text())["counts"] == [[1, 1, 0, 0]])
    hist.close()
    err = capfd.readouterr().err
    failures = [line for line in err.splitlines() if "FAILED checkpoint" in line]
    assert failures == [f"[router-hist] FAILED checkpoint of {path}: No such file or directory (os error 2)"]


def test_environment_sets_the_interval(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "c.json"))
    monkeypatch.setenv(CHECKPOINT, "2.5")
    hist = turbospark.RouterHistogram.from_env(2, 4, 2)
    assert hist is not None and hist.checkpoint == 2.5
    hist.discard()


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "inf", "nan", ""])
def test_an_unusable_environment_interval_is_warned_and_ignored(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                                raw: str) -> None:
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "c.json"))
    monkeypatch.setenv(CHECKPOINT, raw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = turbospark.RouterHistogram.from_env(2, 4, 2)
    assert [str(w.message) for w in caught] == [
        f"ignoring {CHECKPOINT}={raw!r}: not a positive number of seconds; the capture is written at the end only"]
    assert hist is not None and hist.checkpoint is None
    hist.discard()


_KILLED = recording_forever("""
path, interval = sys.argv[1], float(sys.argv[2])
hist = R(path, 2, 8, 2, trace=True, checkpoint=interval)
""", "hist.record(passes % 2, [passes % 8, (passes + 1) % 8])", per_call=1, every=50, pause=0.005)


def test_a_sigkilled_recorder_leaves_a_capture_no_older_than_one_interval(tmp_path: Any) -> None:
    path = tmp_path / "c.json"
    interval = 0.25
    progress, killed_at = progress_until_killed(tmp_path, _KILLED, str(path), str(interval))
    capture = turbospark.load(str(path))
    on_disk = int(capture.counts.sum()) // 2
    assert on_disk == capture.trace[0].shape[0] + capture.trace[1].shape[0]
    # Every pass printed before the last whole interval (and a margin for a slow
    # write on a loaded machine) is on disk; nothing beyond what was recorded is.
    margin = 0.5
    due = [passes for stamp, passes in progress if stamp <= killed_at - interval - margin]
    assert on_disk >= (due[-1] if due else 0)
    assert on_disk <= progress[-1][1] + 50
    assert due and due[-1] > 0
