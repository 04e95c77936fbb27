"""trace="stream": the hand-over of rows from the core to the writer's queue and the disk is atomic.

Every row is at every instant in the core, in the writer's queue or on disk:
``_take_chunk(into)`` empties the core and queues the rows in one step, the
main thread's hand-over is a ``_held.Stretch`` (a held-aware handler and a
Ctrl-C landing in it run as it ends), and a write waits for every chunk
queued before its own. Tested by landing a signal (the opt-in SIGTERM
handler, which writes every capture; a Ctrl-C) and a thread switch (another
thread writing the capture, or checkpointing) at every bytecode of the
hand-over's frames, on both cores: the capture loaded at the end is exactly
the in-memory recorder's, and every summary written meanwhile counts only
rows on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import turbospark
from conftest import core_of
from instants import at_instant
from turbospark.outputs.export_json import write_json
from turbospark.recording.durable import _held, _lifecycle, _sigterm, _stream
from turbospark.recording import _recorder_py, recorder


def _codes(cls: Any, *names: str) -> set[Any]:
    return {getattr(cls, name).__code__ for name in names}


#: The frames of the hand-over: where rows are taken, queued, flushed, and the summary written.
HAND_OVER = (
    _codes(recorder._Facade, "_spill", "_hand_over", "_streamed_document", "_write_streamed", "write")
    | _codes(_stream.StreamWriter, "wait_for_room", "notify", "flush", "_sync", "_lose_stranded")
    | _codes(_held.Stretch, "__enter__", "__exit__")
    | _codes(_recorder_py.RecorderCore, "_take_chunk")
)

#: The frames with a loop that waits for the writer thread: how often it turns is the writer's doing.
WAITS = {_stream.StreamWriter.wait_for_room.__code__, _stream.StreamWriter.flush.__code__}

LAYERS, EXPERTS, K = 2, 8, 2


def _before(hist: Any) -> None:
    """10 ids in the core (chunks of 12 ids: the next call spills), tags and predictions among them."""
    hist.record(0, [1, 2])
    hist.record_batch(1, [[3, 4], [5, 6]], seq=[7, 8], phase="decode")
    hist.record_prediction(1, [0, 7])
    hist.record(1, [2, 3])


def _spill(hist: Any) -> None:
    hist.record_many(0, [[4, 5], [6, 7]])  # 14 untaken ids: the call ends in a hand-over


def _write(hist: Any) -> None:
    hist.write()


def _after(hist: Any) -> None:
    hist.record(1, [0, 1])
    hist.record_batch(0, [[2, 3]], seq=[9], phase="prompt")


def _exported(capture: Any) -> bytes:
    import io

    out = io.BytesIO()
    write_json(capture, out)
    return out.getvalue()


class _Snapshots:
    """Copies of the capture on disk, taken right after a write made meanwhile (a handler's, a thread's)."""

    def __init__(self, path: Path, directory: Path) -> None:
        self.path = path
        self.directory = directory
        self.taken: list[Path] = []
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            target = self.directory / f"snap{len(self.taken)}"
            target.mkdir(parents=True)
            document = self.path.read_bytes()
            size = json.loads(document)["stream"]["bytes"]
            (target / self.path.name).write_bytes(document)
            with open(str(self.path) + ".trace", "rb") as sidecar:
                (target / (self.path.name + ".trace")).write_bytes(sidecar.read(size))
            self.taken.append(target / self.path.name)


def _landing(target: Any, event: Callable[[], None], skip: Any = None) -> Callable[[Any, str, Any], Any]:
    """A trace function that runs ``event`` before the first run of the bytecode ``target`` in the hand-over.

    A bytecode is told apart by where it is and where its frame was called
    from: every instruction of every call site (a loop's second turn, or a
    helper's second call from the same place, is the same one). Frames
    called (at any depth) from a ``skip`` frame are not the hand-over's.
    ``tracer.seen``: the bytecodes run, in order; ``tracer.fired``: whether
    ``target`` ran.
    """
    seen: dict[tuple[Any, ...], None] = {}

    def tracer(frame: Any, kind: str, arg: Any) -> Any:
        if frame.f_code not in HAND_OVER:
            return None
        if skip is not None:
            outer = frame
            while outer is not None:
                if outer.f_code is skip:
                    return None
                outer = outer.f_back
        frame.f_trace_opcodes = True
        if kind == "opcode":
            caller = frame.f_back
            key = (frame.f_code, frame.f_lasti, caller.f_code, caller.f_lasti)
            if key not in seen:
                seen[key] = None
                if key == target:
                    tracer.fired = True  # type: ignore[attr-defined]
                    event()
        return tracer

    tracer.fired = False  # type: ignore[attr-defined]
    tracer.seen = lambda: list(seen)  # type: ignore[attr-defined]
    return tracer


@pytest.fixture
def sigterm_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[], None]]]:
    """The opt-in SIGTERM handler, installed in front of a handler that lets the process go on.

    Yields a list: each callable put in it runs in that later handler, after the capture was written.
    """
    after: list[Callable[[], None]] = []
    original = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(_sigterm, "_installed", False)
    monkeypatch.setattr(_sigterm, "_previous", None)
    monkeypatch.setattr(_sigterm, "_handler", None)
    signal.signal(signal.SIGTERM, lambda number, frame: [run() for run in after])
    _sigterm.install(_lifecycle.finish_all)
    try:
        yield after
    finally:
        signal.signal(signal.SIGTERM, original)


@pytest.fixture
def quick_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fsync: the matrix runs thousands of hand-overs, and durability is not what it checks."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def _check_snapshots(snapshots: _Snapshots, twin: Any, where: str) -> None:
    """Each summary written meanwhile counts only rows on disk, and those rows are the twin's."""
    expected = [twin.trace(layer).tolist() for layer in range(LAYERS)] if snapshots.taken else []
    for snapshot in snapshots.taken:
        summary = json.loads(snapshot.read_text())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rows of later takes on disk are recovered, with a warning
            capture = turbospark.load(snapshot, verify=True)
        info = capture.stream
        assert info.missing_passes.tolist() == [0] * LAYERS, f"{where}: {snapshot} counts rows not on disk"
        assert info.stranded_frames == 0 and info.dropped_bytes == 0, where
        for layer in range(LAYERS):
            rows = capture.trace[layer].tolist()
            assert len(rows) >= summary["stream"]["passes"][layer], where
            assert rows == expected[layer][:len(rows)], f"{where}: layer {layer} of {snapshot}"


#: Rounds per recorder: its sidecar, loaded after each summary written, stays small.
BATCH = 40


@pytest.mark.parametrize("call", [_spill, _write], ids=["spill", "write"])
@pytest.mark.parametrize("kind", ["sigterm", "ctrl-c", "thread"])
def test_a_signal_or_a_thread_at_every_bytecode_of_the_hand_over_loses_and_miscounts_nothing(
        tmp_path: Path, cores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, quick_disk: None,
        sigterm_writes: list[Callable[[], None]], call: Callable[[Any], None], kind: str) -> None:
    monkeypatch.setattr(_stream, "CHUNK_IDS", 12)
    # Python's own SIGINT handler for the Ctrl-C kind, whatever an earlier test left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _every_bytecode(tmp_path, cores, sigterm_writes, call, kind)
    finally:
        signal.signal(signal.SIGINT, previous)


def _every_bytecode(tmp_path: Path, cores: tuple[Any, Any], sigterm_writes: list[Callable[[], None]],
                    call: Callable[[Any], None], kind: str) -> None:
    for cls in cores:
        name = core_of(cls).__module__
        points = _Rounds(cls, tmp_path / name / "count", call, kind, sigterm_writes).points()
        assert len(points) > 100
        for start in range(0, len(points), BATCH):
            rounds = _Rounds(cls, tmp_path / name / str(start), call, kind, sigterm_writes)
            try:
                for point in range(start, min(start + BATCH, len(points))):
                    rounds.land(points[point], f"{kind} before bytecode {point + 1} of {len(points)} ({name})")
                rounds.check_capture()
            finally:
                rounds.discard()


class _Rounds:
    """One streamed recorder and its in-memory twin, recorded in rounds: a few calls, the call whose
    hand-over an event lands in (``hist`` only), a few more calls; then a hand-over, so each round
    starts with an empty core."""

    def __init__(self, cls: Any, directory: Path, call: Callable[[Any], None], kind: str,
                 sigterm_writes: list[Callable[[], None]]) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        self.path = directory / "c.json"
        self.call = call
        self.kind = kind
        self.sigterm_writes = sigterm_writes
        self.hist = cls(str(self.path), LAYERS, EXPERTS, K, trace="stream", pilot="next")
        self.twin = cls(os.devnull, LAYERS, EXPERTS, K, trace=True, pilot="next")
        _lifecycle.settle(self.twin)  # a SIGTERM's write of every capture need not write this one
        # write() hands over as a spill does (_hand_over): the spill's matrix lands there.
        self.skip = recorder._Facade._hand_over.__code__ if call is _write else None
        self.threads: list[threading.Thread] = []
        self.rounds = 0
        self.one(None)  # the first take finds no tagged rows yet; the rounds after it all run alike

    def points(self) -> list[Any]:
        """The bytecodes of one round's hand-over, in order."""
        points = self.one(None)[0].seen()
        self.discard()
        return points

    def discard(self) -> None:
        self.twin.discard()
        self.hist.discard()

    def _event(self, snapshots: _Snapshots) -> Callable[[], None]:
        if self.kind == "ctrl-c":
            return lambda: signal.raise_signal(signal.SIGINT)  # Python's own handler: KeyboardInterrupt
        if self.kind == "sigterm":
            self.sigterm_writes[:] = [snapshots.take]  # after the handler wrote every capture
            return lambda: signal.raise_signal(signal.SIGTERM)
        hist, checkpoint = self.hist, self.rounds % 2

        def work() -> None:
            (hist._write_checkpoint if checkpoint else hist.write)()
            snapshots.take()

        def other_thread() -> None:
            thread = threading.Thread(target=work)
            self.threads.append(thread)
            thread.start()
            thread.join(0.002)  # done, or blocked on a lock this thread holds: carry on

        return other_thread

    def one(self, target: Any) -> tuple[Any, _Snapshots]:
        self.rounds += 1
        # Each round starts with the writer idle, so its hand-over runs the same bytecodes as the last.
        stream = self.hist._stream
        with stream._cond:
            while stream.inbox or stream._busy:
                stream._cond.wait(0.01)
        snapshots = _Snapshots(self.path, self.directory / f"round{self.rounds}")
        self.threads.clear()
        hist, twin = self.hist, self.twin
        _before(hist)
        _before(twin)
        tracer = _landing(target, self._event(snapshots) if target is not None else (lambda: None), self.skip)
        sys.settrace(tracer)
        try:
            self.call(hist)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if self.call is _spill:
            _spill(twin)
        _after(hist)
        _after(twin)
        hist._hand_over()
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive(), f"{self.kind} before {target}: deadlock"
        return tracer, snapshots

    def land(self, target: Any, where: str) -> None:
        """A round with the event before ``target``: every summary it made counts only rows on disk."""
        # The writer thread's progress may steer a flush past a bytecode another round took: again.
        for _ in range(5):
            tracer, snapshots = self.one(target)
            if self.kind != "ctrl-c":
                # Every event wrote a summary (a handler's, a thread's).
                assert bool(snapshots.taken) == tracer.fired, where
                _check_snapshots(snapshots, self.twin, where)
            if tracer.fired:
                return
        # Only where the writer thread's progress picks the path (a wait loop's second turn).
        assert target[0] in WAITS, f"{where}: never reached in 5 rounds"

    def check_capture(self) -> None:
        """Closed: the capture is exactly the twin's, nothing recovered, nothing missing, no gap."""
        self.hist.close()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            capture = turbospark.load(self.path, verify=True)
        assert [len(capture.trace[layer]) for layer in range(LAYERS)] == self.twin.passes.tolist()
        assert _exported(capture) == self.twin.to_json().encode("ascii"), self.directory


def _instants(call: Callable[[], Any], point: int, event: Callable[[], None]) -> int:
    """Run ``call`` with ``event`` at its ``point``-th instant where CPython runs a signal handler; return how many.

    Those instants (``instants.at_instant``, as test_signals' Ctrl-C matrix), in the package's frames.
    """
    package = os.path.dirname(turbospark.__file__)
    return at_instant(call, point, event, lambda path: path.startswith(package))


CALLS: dict[str, Callable[[Any], Any]] = {
    "record": lambda h: h.record(0, [3, 4]),
    "record_many": lambda h: h.record_many(1, [[1, 2], [5, 6]]),
    "record_batch": lambda h: h.record_batch(0, [[7, 0]], seq=[4], phase="prompt"),
    "record_prediction_many": lambda h: h.record_prediction_many(1, [[2, 3]]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_handler_writing_the_stream_mid_call_loses_nothing_on_either_core(
        tmp_path: Path, cores: tuple[Any, Any], quick_disk: None, name: str) -> None:
    # A signal handler (a plain one: it defers nothing) that writes the streamed capture at any
    # instant of a record call. Regression (pure core): the call committed on the state it read
    # before the handler's take, restoring the taken rows' lengths and offsets: every later frame
    # of that layer misplaced (50 of 100 passes loaded). The compiled core runs no Python code
    # between its read and its commit; the pure core now builds again when the state moved.
    for cls in cores:
        path = tmp_path / core_of(cls).__module__ / "c.json"
        path.parent.mkdir()
        hist = cls(str(path), LAYERS, EXPERTS, K, trace="stream", pilot="next")
        twin = cls(os.devnull, LAYERS, EXPERTS, K, trace=True, pilot="next")
        _lifecycle.settle(twin)
        try:
            _before(hist)
            _before(twin)
            points = _instants(lambda: CALLS[name](hist), 0, lambda: None)
            CALLS[name](twin)
            for point in range(1, points + 1):
                _before(hist)
                _before(twin)
                assert _instants(lambda: CALLS[name](hist), point, hist.write) >= points  # more: a rebuild
                before = twin.passes.tolist()
                CALLS[name](twin)
                # The handler's summary: the call's passes all or none, and only rows on disk.
                assert json.loads(path.read_text())["stream"]["passes"] in (before, twin.passes.tolist()), point
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    assert turbospark.load(path).stream.missing_passes.tolist() == [0] * LAYERS
            hist.close()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                capture = turbospark.load(path, verify=True)
            assert _exported(capture) == twin.to_json().encode("ascii"), cls
            if core_of(cls) is _recorder_py.RecorderCore:
                assert points > 30
        finally:
            twin.discard()
            hist.discard()


# --- the writer: durability and the queue's lock -------------------------------------------


def _is_sidecar(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(str(path) + ".trace").st_ino
    except OSError:
        return False


def test_after_a_failed_fsync_no_summary_counts_the_frames_before_it(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # Regression: after an EIO the kernel may drop the pages it could not write and report the
    # next fsync clean; the next checkpoint then wrote a summary counting frames never on disk.
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 2, trace="stream")
    hist.record(0, [1, 2])
    hist.write()
    first = path.read_bytes()
    real = os.fsync
    failures = []

    def fsync(fd: int) -> None:
        if _is_sidecar(fd, path) and not failures:
            failures.append(fd)
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    hist.record(0, [3, 4])
    with pytest.raises(OSError, match=r"^\[Errno 5\] Input/output error$"):
        hist.write()
    hist.record(0, [5, 6])
    message = ("an earlier fsync of the trace failed (Input/output error (os error 5)): frames written before it "
               "may not be on disk")
    with pytest.raises(OSError) as raised:
        hist.write()
    assert (raised.value.errno, raised.value.strerror, raised.value.filename) == (5, message, str(path) + ".trace")
    with pytest.raises(OSError, match=r"an earlier fsync of the trace failed"):
        hist._write_checkpoint()  # the checkpoint thread's call: it reports what it raises
    hist.close()
    assert path.read_bytes() == first  # the last summary whose frames were made durable
    assert capfd.readouterr().err.splitlines()[-2:] == [f"[router-hist] FAILED writing {path}: {message} (os error 5)",
                                                       f"[router-hist] FAILED closing {path}.trace: {message} (os error 5)"]


def test_the_sidecars_name_and_the_summarys_rename_are_made_durable(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: neither the directory entry of a new sidecar nor the rename of the JSON was
    # flushed, so a crash could keep a JSON naming a sidecar whose entry was lost, or undo the rename.
    events: list[tuple[str, Any]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        status = os.fstat(fd)
        if os.path.samestat(status, os.stat(tmp_path)):
            events.append(("fsync", "directory"))
        elif _is_sidecar(fd, tmp_path / "c.json"):
            events.append(("fsync", "sidecar"))
        else:
            events.append(("fsync", "file"))
        real_fsync(fd)

    def replace(source: Any, target: Any) -> None:
        real_replace(source, target)
        events.append(("replace", os.path.basename(target)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    hist = cls(str(tmp_path / "c.json"), 1, 8, 2, trace="stream")
    # The sidecar's entry at once, then the JSON a streamed recorder writes as it starts.
    assert events == [("fsync", "directory"), ("fsync", "sidecar"), ("fsync", "file"), ("replace", "c.json"),
                      ("fsync", "directory")]
    del events[:]
    hist.record(0, [1, 2])
    hist.close()
    assert events == [("fsync", "sidecar"), ("fsync", "file"), ("replace", "c.json"), ("fsync", "directory"),
                      ("fsync", "sidecar")]


def test_a_flush_does_not_hold_the_queue_while_it_waits_for_the_disk(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: StreamWriter.flush held the queue's lock across os.fsync, so every recording
    # thread that handed over a chunk waited for each checkpoint's fsync.
    monkeypatch.setattr(_stream, "CHUNK_IDS", 4)
    path = tmp_path / "c.json"
    hist = cls(str(path), 1, 8, 2, trace="stream")
    real = os.fsync
    inside, release = threading.Event(), threading.Event()

    def fsync(fd: int) -> None:
        if _is_sidecar(fd, path) and threading.current_thread().name == "checkpoint":
            inside.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint = threading.Thread(target=hist.write, name="checkpoint")
    checkpoint.start()
    assert inside.wait(10)
    recording = threading.Thread(target=lambda: [hist.record(0, [step % 8, (step + 1) % 8]) for step in range(8)])
    recording.start()
    recording.join(2)
    handed_over = not recording.is_alive()  # 8 hand-overs of 2 passes, while the fsync waits
    release.set()
    recording.join(10)
    checkpoint.join(10)
    assert handed_over
    hist.close()
    assert turbospark.load(path).trace[0].tolist() == [[step % 8, (step + 1) % 8] for step in range(8)]


def test_a_sigterm_inside_a_call_with_a_checkpoint_waiting_on_it_writes_and_dies(tmp_path: Path) -> None:
    # Regression (pure core): a checkpoint held the write lock while its take waited for the core's
    # lock, held by the main thread's call that the SIGTERM interrupted; the handler's write waited
    # for the write lock: the process hung. A stream's summary is now built outside the write lock.
    from childproc import run_with_files

    result, (path,) = run_with_files(
        tmp_path,
        """
        import threading
        from turbospark.recording import _recorder_py
        from turbospark.recording.recorder import recorder_class

        hist = recorder_class(_recorder_py.RecorderCore)(path, 1, 8, 2, trace="stream")
        hist.record(0, [1, 2])


        class Late:
            def __index__(self):
                threading.Thread(target=hist._write_checkpoint, daemon=True).start()
                time.sleep(0.3)  # the checkpoint now waits for the core's lock, which this call holds
                os.kill(os.getpid(), signal.SIGTERM)
                return 3


        hist.record(0, [Late(), 4])
        print("survived SIGTERM", file=sys.stderr)
        """,
        {"path": "c.json"},
        env={"TURBOSPARK_ROUTER_HIST_SIGTERM": "1"},
        timeout=20,
    )
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert result.stderr == f"[router-hist] wrote {path}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert turbospark.load(path, verify=True).trace[0].tolist() == [[1, 2]]
