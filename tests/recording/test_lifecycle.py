"""The file side of a recorder: write, close, write-on-drop, write-at-exit, file modes, accessors.

The reference writes its JSON once, when the runner drops, and reports on
stderr (``[router-hist] wrote PATH`` / ``[router-hist] FAILED writing PATH:
ERR``). We keep that contract, make the write atomic (a failed write leaves
an earlier file whole and no temporary file behind) and make interpreter
exit count as a drop.
"""

from __future__ import annotations

import errno
import gc
import os
import pathlib
import stat
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import turbospark
from childproc import run_script, split_at
from turbospark import RouterHistogram
from capture_helpers import DOC, ONE_PASS, fill, leftovers


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """``umask(mask)`` sets the process umask for the test; the old one comes back afterwards."""
    original = os.umask(0o022)
    os.umask(original)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(original)


# --- write() -------------------------------------------------------------------


def test_write_writes_the_exact_json(make: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    hist = fill(make(2, 3, trace=True))
    hist.write()
    assert (tmp_path / "capture.json").read_bytes() == DOC.encode("ascii")  # no trailing newline
    assert hist.to_json() == DOC
    assert leftovers(tmp_path) == []
    # write() is silent and leaves the recorder open.
    assert capfd.readouterr().err == ""
    assert not hist.closed
    hist.record(0, [1, 1])
    hist.write()
    assert (tmp_path / "capture.json").read_text() == hist.to_json() != DOC


@pytest.mark.parametrize("kind", [str, pathlib.Path, os.fsencode])
def test_write_elsewhere_leaves_the_path_alone(make: Callable[..., Any], tmp_path: pathlib.Path, kind: Any) -> None:
    hist = fill(make(2, 3, trace=True))
    other = tmp_path / "other.json"
    hist.write(kind(str(other)))
    assert other.read_text() == DOC
    assert hist.path == str(tmp_path / "capture.json")
    assert not (tmp_path / "capture.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json"]


def test_write_checks_its_path(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    hist = make(1, 2)
    with pytest.raises(ValueError, match="path must not be empty"):
        hist.write("")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int 5"):
        hist.write(5)
    assert list(tmp_path.iterdir()) == []


def test_write_into_a_missing_directory(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    hist = make(1, 2)
    with pytest.raises(FileNotFoundError) as info:
        hist.write(str(tmp_path / "missing" / "c.json"))
    assert info.value.errno == errno.ENOENT
    assert list(tmp_path.iterdir()) == []


def test_write_onto_a_directory(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    (target / "inside.txt").write_text("kept")
    hist = make(1, 2)
    with pytest.raises(OSError) as info:
        hist.write(str(target))
    assert info.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert target.is_dir() and (target / "inside.txt").read_text() == "kept"
    assert leftovers(tmp_path) == []


def _failing(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


@pytest.mark.parametrize("step", ["replace", "fsync", "chmod"])
@pytest.mark.parametrize(
    "exc", [OSError(errno.EIO, "Input/output error"), OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
    ids=["EIO", "ENOSPC", "KeyboardInterrupt"],
)
def test_a_failed_write_keeps_the_earlier_file(
    make: Callable[..., Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, step: str, exc: BaseException
) -> None:
    target = tmp_path / "capture.json"
    target.write_bytes(b"earlier capture")
    target.chmod(0o640)
    hist = fill(make(2, 3, trace=True))
    monkeypatch.setattr(os, step, _failing(exc))
    with pytest.raises(type(exc)):
        hist.write()
    monkeypatch.undo()
    assert target.read_bytes() == b"earlier capture"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.json"]
    # The recorder is unharmed: the next write succeeds.
    hist.write()
    assert target.read_text() == DOC


# --- close() -------------------------------------------------------------------


def test_close_writes_and_reports(make: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    hist = fill(make(2, 3, trace=True))
    assert not hist.closed
    hist.close()
    path = tmp_path / "capture.json"
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"
    assert path.read_text() == DOC
    assert hist.closed
    assert leftovers(tmp_path) == []


def test_close_is_idempotent(make: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    hist = fill(make(2, 3, trace=True))
    hist.close()
    capfd.readouterr()
    (tmp_path / "capture.json").unlink()
    hist.close()
    hist.close()
    assert capfd.readouterr().err == ""
    assert not (tmp_path / "capture.json").exists()


def test_a_failing_close_reports_like_the_reference_and_does_not_raise(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "missing" / "c.json")
    (tmp_path / "missing").mkdir()
    hist = RouterHistogram(path, 1, 2)
    (tmp_path / "missing").rmdir()  # gone by the time of the write
    hist.record(0, [1])
    hist.close()  # must not raise
    assert capfd.readouterr().err == f"[router-hist] FAILED writing {path}: No such file or directory (os error 2)\n"
    assert hist.closed
    # Closed is closed: no retry, no second report.
    hist.close()
    assert capfd.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


def test_a_close_that_fails_midway_reports_the_error(
    make: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "capture.json"
    target.write_text("earlier")
    hist = make(1, 2)
    monkeypatch.setattr(os, "fsync", _failing(OSError(errno.EIO, "Input/output error")))
    hist.close()
    monkeypatch.undo()
    assert capfd.readouterr().err == f"[router-hist] FAILED writing {target}: Input/output error (os error 5)\n"
    assert target.read_text() == "earlier"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("method", ["record", "record_prediction", "record_many", "record_router_logits"])
def test_recording_after_close_is_refused(make: Callable[..., Any], method: str) -> None:
    hist = fill(make(2, 3, trace=True, pilot="next", router_logits=(0, 1)))
    hist.close()
    before = hist.to_json()
    argument = {"record_many": [[0, 1]], "record_router_logits": [1.0, 2.0, 3.0]}.get(method, [0, 1])
    with pytest.raises(ValueError, match="^the recorder is closed; it records nothing more$"):
        getattr(hist, method)(0, argument)
    assert hist.to_json() == before


def test_a_closed_recorder_can_still_be_read(make: Callable[..., Any]) -> None:
    hist = fill(make(2, 3, trace=True))
    hist.close()
    assert hist.to_json() == DOC
    assert hist.counts.tolist() == [[1, 0, 1], [0, 1, 1]]
    assert hist.trace(1).tolist() == [[1, 2]]


def test_the_context_manager_closes(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    with RouterHistogram(str(path), 2, 3, trace=True) as hist:
        assert isinstance(hist, RouterHistogram)
        fill(hist)
        assert not path.exists()
    assert hist.closed
    assert path.read_text() == DOC
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"


def test_the_context_manager_closes_on_an_exception(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    with pytest.raises(RuntimeError, match="decode failed"):
        with RouterHistogram(str(path), 2, 3, trace=True) as hist:
            fill(hist)
            raise RuntimeError("decode failed")
    assert path.read_text() == DOC
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"


# --- write on drop -----------------------------------------------------------------


def test_dropping_an_open_recorder_writes_it_once(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    hist = fill(RouterHistogram(str(path), 2, 3, trace=True))
    del hist
    gc.collect()
    assert path.read_text() == DOC
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"


def test_a_recorder_in_a_reference_cycle_is_written_once_when_collected(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.json"
    hist = fill(RouterHistogram(str(path), 2, 3, trace=True))
    hist.itself = hist
    del hist
    gc.collect()
    gc.collect()
    assert path.read_text() == DOC
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"


def test_dropping_a_closed_recorder_writes_nothing_more(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    hist = fill(RouterHistogram(str(path), 2, 3, trace=True))
    hist.close()
    capfd.readouterr()
    path.unlink()
    del hist
    gc.collect()
    assert capfd.readouterr().err == ""
    assert not path.exists()


def test_a_failed_constructor_writes_nothing(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError):
        RouterHistogram(str(tmp_path / "c.json"), 2, 0)
    gc.collect()
    assert capfd.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


# --- write at interpreter exit --------------------------------------------------------

def test_an_open_recorder_is_written_at_exit(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "c.json")
    result = run_script(
        tmp_path,
        """
        hist = R(sys.argv[1], 2, 3, trace=True)  # still referenced by the module at exit
        hist.record(0, [2, 0])
        hist.record(1, [1, 2])
        """,
        path,
    )
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"[router-hist] wrote {path}\n"
    assert pathlib.Path(path).read_text() == DOC


def test_a_recorder_in_a_cycle_is_written_once_at_exit(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "c.json")
    result = run_script(
        tmp_path,
        """
        import gc
        gc.disable()  # keep the cycle alive until exit
        hist = R(sys.argv[1], 2, 3, trace=True)
        hist.record(0, [2, 0])
        hist.record(1, [1, 2])
        hist.itself = hist
        del hist
        """,
        path,
    )
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"[router-hist] wrote {path}\n"
    assert pathlib.Path(path).read_text() == DOC


def test_every_recorder_is_written_exactly_once(tmp_path: pathlib.Path) -> None:
    paths = {name: str(tmp_path / f"{name}.json") for name in ("kept", "closed", "dropped", "env", "cycle")}
    missing = str(tmp_path / "no-such-dir" / "x.json")
    result = run_script(
        tmp_path,
        """
        import gc, os
        kept, closed, dropped, env_path, cycle, missing = sys.argv[1:7]

        def work(path):
            hist = R(path, 1, 2)
            hist.record(0, [1])  # dropped on return: written now, not again at exit

        a = R(kept, 1, 2)
        b = R(closed, 1, 2)
        b.close()
        work(dropped)
        c = R.from_env(1, 2)
        d = R(cycle, 1, 2)
        d.me = d
        del d
        os.mkdir(os.path.dirname(missing))
        e = R(missing, 1, 2)
        os.rmdir(os.path.dirname(missing))  # gone by the time of the write
        print("body done", file=sys.stderr, flush=True)
        """,
        paths["kept"], paths["closed"], paths["dropped"], paths["env"], paths["cycle"], missing,
        env={"TURBOSPARK_ROUTER_HIST": paths["env"]},
    )
    assert (result.returncode, result.stdout) == (0, "")
    in_body, at_exit = split_at(result.stderr, "body done")
    assert in_body == [f"[router-hist] wrote {paths['closed']}", f"[router-hist] wrote {paths['dropped']}"]
    assert sorted(at_exit) == sorted(
        [f"[router-hist] wrote {paths[name]}" for name in ("kept", "env", "cycle")]
        + [f"[router-hist] FAILED writing {missing}: No such file or directory (os error 2)"]
    )
    assert pathlib.Path(paths["kept"]).read_text() == '{"num_layers":1,"num_experts":2,"top_k":0,"counts":[[0,0]]}'
    assert pathlib.Path(paths["dropped"]).read_text() == ONE_PASS


def test_an_unhandled_keyboard_interrupt_still_writes(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "c.json")
    result = run_script(
        tmp_path,
        """
        hist = R(sys.argv[1], 2, 3, trace=True)
        hist.record(0, [2, 0])
        hist.record(1, [1, 2])
        raise KeyboardInterrupt
        """,
        path,
    )
    assert result.returncode != 0
    assert "KeyboardInterrupt" in result.stderr
    assert result.stderr.count("[router-hist]") == 1
    assert result.stderr.endswith(f"[router-hist] wrote {path}\n")
    assert pathlib.Path(path).read_text() == DOC
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("ending", "code"), [("raise SystemExit(3)", 3), ("raise ValueError('boom')", 1)])
def test_an_exiting_program_still_writes(tmp_path: pathlib.Path, ending: str, code: int) -> None:
    path = str(tmp_path / "c.json")
    result = run_script(tmp_path, f"hist = R(sys.argv[1], 1, 2)\nhist.record(0, [1, 0])\n{ending}\n", path)
    assert result.returncode == code
    assert result.stderr.count("[router-hist]") == 1
    assert result.stderr.endswith(f"[router-hist] wrote {path}\n")
    assert pathlib.Path(path).read_text() == '{"num_layers":1,"num_experts":2,"top_k":2,"counts":[[1,1]]}'


# --- file modes and special destinations --------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o000, 0o002])
def test_a_new_capture_gets_the_umask_mode(make: Callable[..., Any], tmp_path: pathlib.Path, umask: Any, mask: int) -> None:
    hist = make(1, 2)
    umask(mask)
    hist.write()
    assert stat.S_IMODE((tmp_path / "capture.json").stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o604, 0o666, 0o400])
def test_an_existing_file_keeps_its_mode(make: Callable[..., Any], tmp_path: pathlib.Path, umask: Any, mode: int) -> None:
    target = tmp_path / "capture.json"
    target.write_text("earlier")
    target.chmod(mode)
    umask(0o077)
    hist = make(1, 2)
    hist.write()
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert target.read_text() == '{"num_layers":1,"num_experts":2,"top_k":0,"counts":[[0,0]]}'


def test_a_fifo_is_written_in_place(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    # As the reference's fs::write does: replacing it would swap the pipe for a file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        hist = fill(make(2, 3, trace=True))
        hist.write(str(fifo))
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert os.read(reader, 1 << 16) == DOC.encode("ascii")
    finally:
        os.close(reader)
    assert leftovers(tmp_path) == []


def test_a_symlink_is_written_through(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    # A bug this test caught, now fixed: os.replace() swaps the link
    # itself for a regular file, so the file it points at keeps the old
    # capture. The reference's fs::write (like open(path, "w")) writes through
    # the link; e.g. TURBOSPARK_ROUTER_HIST=latest.json -> runs/42/hist.json.
    real = tmp_path / "runs" / "hist.json"
    real.parent.mkdir()
    real.write_text("earlier")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    hist = fill(make(2, 3, trace=True, name="latest.json"))
    hist.write()
    assert link.is_symlink()
    assert real.read_text() == DOC


def test_a_long_file_name_that_the_filesystem_takes_is_written(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    # A bug this test caught, now fixed: the temporary name is
    # "." + basename + "." + 8 random chars + ".tmp", 14 bytes longer than the
    # destination, so a destination name of 242..255 bytes (legal: NAME_MAX is
    # 255) fails with "File name too long (os error 36)" where the reference
    # writes it.
    name = "h" * 250 + ".json"
    (tmp_path / name).write_text("the file system accepts this name")
    hist = fill(make(2, 3, trace=True, name=name))
    hist.write()
    assert (tmp_path / name).read_text() == DOC


# --- read accessors ---------------------------------------------------------------------


def test_counts_and_passes(make: Callable[..., Any]) -> None:
    hist = make(3, 4, trace=True)
    hist.record(0, [3, 3])
    hist.record(2, [0, 1])
    hist.record(2, [1, 1])
    counts = hist.counts
    assert counts.dtype == np.int64 and counts.shape == (3, 4)
    assert counts.tolist() == [[0, 0, 0, 2], [0, 0, 0, 0], [1, 3, 0, 0]]
    passes = hist.passes
    assert passes.dtype == np.int64 and passes.shape == (3,)
    assert passes.tolist() == [1, 0, 2]
    # Counts are a read-only snapshot, shared until the next record (no
    # copy per access) and never changed by it; passes are a copy.
    with pytest.raises(ValueError, match="read-only"):
        counts[:] = 99
    assert hist.counts is counts
    passes[:] = 99
    assert hist.passes.tolist() == [1, 0, 2]
    hist.record(0, [1, 1])
    assert counts.tolist() == [[0, 0, 0, 2], [0, 0, 0, 0], [1, 3, 0, 0]]
    assert hist.counts.tolist() == [[0, 2, 0, 2], [0, 0, 0, 0], [1, 3, 0, 0]]
    assert hist.counts is not counts
    hist.record_many(1, np.array([[2, 0]]))
    assert hist.counts.tolist() == [[0, 2, 0, 2], [1, 0, 1, 0], [1, 3, 0, 0]]
    assert '"counts":[[0,2,0,2],[1,0,1,0],[1,3,0,0]]' in hist.to_json()


def test_counts_subtract_exactly_from_a_loaded_capture(make: Callable[..., Any], tmp_path: Any) -> None:
    hist = make(2, 4, name="c.json")
    hist.record(0, [3, 1])
    hist.write()
    hist.record(1, [2, 2])
    difference = hist.counts - turbospark.load(tmp_path / "c.json").counts
    assert difference.dtype == np.int64
    assert difference.tolist() == [[0, 0, 0, 0], [0, 0, 2, 0]]


def test_trace_and_predictions(make: Callable[..., Any]) -> None:
    hist = make(2, 5, trace=True, pilot="next")
    hist.record(0, [4, 1, 0])
    hist.record_prediction(1, [2, 3, 4])
    hist.record(1, [2, 3, 0])
    hist.record(0, [1, 1, 1])
    trace = hist.trace(0)
    assert trace.dtype == np.uint32 and trace.shape == (2, 3)
    assert trace.tolist() == [[4, 1, 0], [1, 1, 1]]
    assert hist.trace(1).tolist() == [[2, 3, 0]]
    predictions = hist.predictions(1)
    assert predictions.dtype == np.uint32 and predictions.shape == (1, 3)
    assert predictions.tolist() == [[2, 3, 4]]
    assert hist.predictions(0).shape == (0, 3)  # row 0 stays empty
    assert hist.predictions(0).dtype == np.uint32
    trace[:] = 0
    predictions[:] = 0
    assert hist.trace(0).tolist() == [[4, 1, 0], [1, 1, 1]]
    assert hist.predictions(1).tolist() == [[2, 3, 4]]
    assert hist.trace(np.int64(1)).tolist() == [[2, 3, 0]]


def test_trace_before_top_k_is_known(make: Callable[..., Any]) -> None:
    hist = make(2, 5, trace=True, pilot="next")
    assert hist.trace(0).shape == (0, 0)
    assert hist.predictions(1).shape == (0, 0)
    given = make(2, 5, 4, trace=True, name="given.json")
    assert given.trace(1).shape == (0, 4)


def test_accessors_are_none_when_off(make: Callable[..., Any]) -> None:
    hist = make(2, 3)
    hist.record(0, [1, 2])
    assert hist.trace(0) is None
    assert hist.predictions(1) is None
    assert not hist.trace_enabled
    assert not hist.pilot_enabled()


def test_properties(make: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    hist = make(3, 7, trace=True)
    assert hist.path == str(tmp_path / "capture.json")
    assert (hist.num_layers, hist.num_experts, hist.top_k) == (3, 7, 0)
    assert all(type(v) is int for v in (hist.num_layers, hist.num_experts, hist.top_k))
    hist.record(2, [6, 6, 0, 1])
    assert hist.top_k == 4
    assert hist.trace_enabled
    assert not hist.closed
