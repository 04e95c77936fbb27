"""A caller's array that changes while it is recorded: check and commit read the same bytes.

Another thread, or a non-blocking device-to-host copy still landing, may
change an id array at any moment. Each call must record one whole pass (or
block) exactly as it read it, or raise naming the bad id as it read it and
record nothing. Runs on the compiled core, the pure-Python core and the
default class.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

import turbospark
from turbospark.recording import _convert

from conftest import require_module

GOOD = [1, 2, 3, 4]
EXPERTS = 64
BLOCK = [[5, 6, 7, 8], GOOD, [9, 10, 11, 12]]


pytestmark = pytest.mark.usefixtures("interleave")


def _call(name: str, hist: Any, arr: Any) -> None:
    if name in ("record", "record_tensor"):
        hist.record(0, arr)
    elif name == "record_prediction":
        hist.record_prediction(0, arr)
    else:
        hist.record_many(0, arr)


def _setup(name: str, dtype: Any, experts: int) -> tuple[np.ndarray, Callable[[bool], None], str, list[list[int]]]:
    """(the caller's array, a function making it valid or not, the expected error, the rows it holds when valid)."""
    bad_id = experts + 5
    if name.startswith("record_many"):
        arr = np.array(BLOCK, dtype=dtype)
        rows = BLOCK

        def flip(bad: bool) -> None:
            arr[1, 2] = bad_id if bad else GOOD[2]

        position = "(1, 2)"
    else:
        arr = np.array(GOOD, dtype=dtype)
        rows = [GOOD]

        def flip(bad: bool) -> None:
            arr[2] = bad_id if bad else GOOD[2]

        position = "2"
    return arr, flip, f"expert id {bad_id} at position {position} is out of range for {experts} experts", rows


def _check(name: str, hist: Any, rows: list[list[int]], recorded: int, experts: int) -> None:
    """The capture holds ``recorded`` calls' rows exactly, and nothing else."""
    expected = rows * recorded
    if name == "record_prediction":
        assert hist.predictions(0).tolist() == expected
        assert hist.trace(0).tolist() == []
        assert int(hist.passes[0]) == 0
        assert hist.counts.sum() == 0
    else:
        assert hist.trace(0).tolist() == expected
        assert int(hist.passes[0]) == len(expected)
        want = np.bincount(np.array(expected, dtype=np.int64).ravel(), minlength=experts)
        assert hist.counts[0].tolist() == want.tolist()
    # The file is one a loader accepts, and says the same.
    capture = turbospark.loads(hist.to_json())
    assert capture.counts[0].tolist() == hist.counts[0].tolist()
    assert json.loads(hist.to_json())["counts"] == hist.counts.tolist()


CALLS = ["record", "record_prediction", "record_many", "record_many_sparse", "record_tensor", "record_many_tensor"]


def _source(name: str, arr: np.ndarray) -> Any:
    """What the call is given: the array, or a CPU tensor sharing its memory (so flips show through)."""
    if name.endswith("tensor"):
        return require_module("torch").from_numpy(arr)
    return arr


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("name", CALLS)
def test_an_id_flipped_by_another_thread(cls: Any, tmp_path: Any, name: str, dtype: Any) -> None:
    experts = 70_000 if name.endswith("sparse") else EXPERTS
    arr, flip, message, rows = _setup(name, dtype, experts)
    # Before the recorder exists: a skip here (no torch) must not leave it to be written at exit.
    source = _source(name, arr)
    hist = cls(str(tmp_path / "c.json"), 1, experts, 4, trace=True, pilot="self")
    stop = threading.Event()
    recorded = refused = 0

    def flipper() -> None:
        bad = False
        while not stop.is_set():
            # One state per loop turn: bad about half the time.
            bad = not bad
            flip(bad)
            time.sleep(0)  # lets the recorder in, with either state

    thread = threading.Thread(target=flipper)
    thread.start()
    try:
        # At least 3,000 calls, and on until both outcomes were seen: on a
        # loaded machine the flipping thread may not run for a while.
        deadline = time.monotonic() + 30
        i = 0
        while i < 3000 or not (recorded and refused) and time.monotonic() < deadline:
            i += 1
            if i % 3 == 0:
                time.sleep(0)
            try:
                _call(name, hist, source)
            except ValueError as exc:
                assert str(exc) == message
                refused += 1
            else:
                recorded += 1
    finally:
        stop.set()
        thread.join()
        hist.discard()
    # Both outcomes happened, so the race was really run.
    assert recorded > 0 and refused > 0
    _check(name, hist, rows, recorded, experts)


@pytest.mark.parametrize("name", CALLS)
def test_a_recheck_that_finds_the_array_fixed(cls: Any, tmp_path: Any, monkeypatch: Any, name: str) -> None:
    # The array is bad when the call reads it and fixed by the time anything
    # reads it again (the error path's re-check, modelled by making the
    # shared validator fix the caller's array before it looks). The call
    # records the pass as it read it, or raises naming the id it read: never
    # commits ids it did not check.
    experts = 70_000 if name.endswith("sparse") else EXPERTS
    arr, flip, message, rows = _setup(name, np.int64, experts)
    original = _convert.array_ids

    def fixed_before_read(values: np.ndarray, num_experts: int) -> np.ndarray:
        flip(False)
        return original(values, num_experts)

    monkeypatch.setattr(_convert, "array_ids", fixed_before_read)
    # Before the recorder exists: a skip here (no torch) must not leave it to be written at exit.
    source = _source(name, arr)
    hist = cls(str(tmp_path / "c.json"), 1, experts, 4, trace=True, pilot="self")
    recorded = 0
    try:
        for _ in range(3):
            flip(True)
            try:
                _call(name, hist, source)
            except ValueError as exc:
                assert str(exc) == message
            else:
                recorded += 1
        _check(name, hist, rows, recorded, experts)
    finally:
        hist.discard()
