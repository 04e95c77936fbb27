"""DeviceRecorder under faults: inference mode, a drain that keeps failing, an automatic flush that
raises over an earlier call, a dropped recorder, a fork while another thread stages (issue 16)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from childproc import run_with_files
from conftest import require_module

torch = require_module("torch")

import turbospark  # noqa: E402
from turbospark.torch import DeviceRecorder, _transfer  # noqa: E402

EMPTY_8 = "[0,0,0,0,0,0,0,0]"


@pytest.mark.parametrize("counts_only", [False, True])
def test_built_in_inference_mode_records_and_writes_outside_it(tmp_path: pathlib.Path, counts_only: bool,
                                                                capfd: Any) -> None:
    # Item 2: buffers made inside inference_mode() are inference tensors, which
    # may not be updated in place outside it: every later flush failed.
    path = tmp_path / "cap.json"
    hist = turbospark.RouterHistogram(str(path), 1, 8, 2, trace=not counts_only)
    with torch.inference_mode():
        dev = DeviceRecorder(hist, device="cpu")
        dev.record(0, torch.tensor([[1, 2]]))
    dev.record(0, torch.tensor([[3, 4]]))
    dev.flush()
    with torch.inference_mode():
        dev.record(0, torch.tensor([[5, 6]]))
    hist.close()
    trace = "" if counts_only else ',"trace":[[1,2,3,4,5,6]]'
    assert path.read_text() == '{"num_layers":1,"num_experts":8,"top_k":2,"counts":[[0,1,1,1,1,1,1,0]]' + trace + "}"
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"


def test_a_drain_that_keeps_failing_is_reported_once_and_the_rest_is_written(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: Any) -> None:
    path = tmp_path / "cap.json"
    hist = turbospark.RouterHistogram(str(path), 1, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu")
    dev.record(0, torch.tensor([[1, 2]]))
    hist.record(0, [3, 4])

    def broken(*args: Any) -> None:
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(_transfer, "_to_host", broken)
    assert hist.to_json() == '{"num_layers":1,"num_experts":8,"top_k":2,"counts":[[0,0,0,1,1,0,0,0]],"trace":[[3,4]]}'
    hist.close()
    assert path.read_text() == hist.to_json()
    assert capfd.readouterr().err == (f"[router-hist] FAILED recording staged ids for {path}: the device is gone\n"
                                      f"[router-hist] wrote {path}\n")


def test_an_automatic_flush_that_raises_keeps_the_calls_own_rows(make: Any) -> None:
    # Item 8: the flush a full buffer triggers refuses an earlier call; the
    # call that triggered it must still be staged.
    hist = make(1, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu", capacity=2)
    dev.record(0, torch.tensor([[1, 9]]))
    with pytest.raises(ValueError, match="refused and recorded nothing: expert id 9"):
        dev.record(0, torch.tensor([[2, 3], [4, 5]]))
    assert dev.staged_rows == 2
    dev.flush()
    assert hist.trace(0).tolist() == [[2, 3], [4, 5]]


def test_a_graph_region_commit_whose_flush_raises_keeps_its_step(make: Any) -> None:
    hist = make(1, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu", capacity=2)
    region = dev.graph_region(rows=2)
    with region:
        dev.record(0, torch.tensor([[6, 7], [0, 1]]))
    dev.record(0, torch.tensor([[1, 9]]))
    with pytest.raises(ValueError, match="refused and recorded nothing: expert id 9"):
        region.commit()
    dev.flush()
    assert hist.trace(0).tolist() == [[6, 7], [0, 1]]


def test_a_dropped_recorder_is_written_without_a_collection(tmp_path: pathlib.Path) -> None:
    # Item 19: hist -> its drain -> the DeviceRecorder -> hist was a cycle, so
    # dropping both wrote nothing until the garbage collector ran; and the
    # staging buffers stay allocated after close().
    result, (path,) = run_with_files(
        tmp_path,
        """
        import gc, torch
        from turbospark.torch import DeviceRecorder
        gc.disable()
        hist = R(path, 1, 8, 2, trace=True)
        dev = DeviceRecorder(hist, device="cpu")
        dev.record(0, torch.tensor([[1, 2]]))
        del hist, dev
        print(open(path).read())
        kept = R(path + ".2", 1, 8, 2, trace=True)
        dev = DeviceRecorder(kept, device="cpu")
        dev.record(0, torch.tensor([[3, 4]]))
        kept.close()
        print(dev.memory(), dev.staged_rows)
        """,
        {"path": "cap.json"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ('{"num_layers":1,"num_experts":8,"top_k":2,"counts":[[0,1,1,0,0,0,0,0]],"trace":[[1,2]]}\n'
                             "(0, 0) 0\n")


def test_a_child_forked_while_another_thread_stages_can_record(tmp_path: pathlib.Path) -> None:
    # Item 20: the fork hook renewed the recorder's locks, not the DeviceRecorder's.
    result, (path,) = run_with_files(
        tmp_path,
        """
        import threading, torch, warnings
        from turbospark.torch import DeviceRecorder
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        hist = R(path, 1, 8, 2, trace=True)
        dev = DeviceRecorder(hist, device="cpu")
        inside, release = threading.Event(), threading.Event()
        real = dev._stage
        def slow(*args, **kwargs):
            with dev._lock:
                inside.set()
                release.wait()
                real(*args, **kwargs)
        worker = threading.Thread(target=slow, args=(0, 0, torch.tensor([[1, 2]]), None, None, None, None))
        worker.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            dev.record(0, torch.tensor([[5, 6]]))
            dev.flush()
            print("child", hist.trace(0).tolist(), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        release.set()
        worker.join()
        hist.close()
        """,
        {"path": "cap.json"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "child [[5, 6]]\n"
