"""Atomic writes, and failures that are reported rather than raised.

Every write goes to a temporary file in the destination's own directory and
is moved into place with ``os.replace``. Whatever fails (a full disk, a file
size limit, permissions, a read-only or vanished directory), an earlier file
at the path stays whole byte for byte and no temporary file is left behind;
``close()``, a drop and interpreter exit print the reference's
``[router-hist] FAILED writing PATH: ERROR`` line once, with no traceback,
and leave the exit status alone.

``tests/recording/test_lifecycle.py`` covers ``write()`` failing at ``os.replace``,
``os.fsync`` and ``os.chmod``; this file covers the other failure points, the
``close()``/drop/exit reporting of each, and real kernel failures in child
interpreters.
"""

from __future__ import annotations

import errno
import gc
import os
import pathlib
import stat
import tempfile
from typing import Any, Callable, NamedTuple

import pytest

from childproc import run_script, run_with_files
from conftest import unprivileged
from turbospark import RouterHistogram
from capture_helpers import DOC, ONE_PASS, fill, leftovers


EARLIER = b'{"num_layers":1,"earlier":"capture, which must survive byte for byte"}'


# --- failure injection ------------------------------------------------------------


class _FailingHandle:
    """The temporary file's handle, failing like a disk that fills up halfway through ``write``."""

    def __init__(self, handle: Any, error: OSError, at: str) -> None:
        self._handle = handle
        self._error = error
        self._at = at

    def __enter__(self) -> "_FailingHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._handle.close()

    def write(self, data: bytes) -> int:
        if self._at == "write":
            # A partial write first: the temporary file holds half a capture.
            self._handle.write(data[: len(data) // 2])
            self._handle.flush()
            raise self._error
        return int(self._handle.write(data))

    def flush(self) -> None:
        if self._at == "flush":
            raise self._error
        self._handle.flush()

    def fileno(self) -> int:
        return int(self._handle.fileno())


def _raiser(error: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


class Failure(NamedTuple):
    """Where the atomic write fails, with which error, and how the report shows it."""

    point: str
    error: OSError
    shown: str


def _inject(monkeypatch: pytest.MonkeyPatch, failure: Failure) -> None:
    """Make the atomic write fail at ``failure.point`` with ``failure.error``."""
    point, error = failure.point, failure.error
    if point in ("write", "flush"):
        real_fdopen = os.fdopen

        def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
            return _FailingHandle(real_fdopen(fd, *args, **kwargs), error, point)

        monkeypatch.setattr(os, "fdopen", fdopen)
    elif point == "mkstemp":
        monkeypatch.setattr(tempfile, "mkstemp", _raiser(error))
    else:
        monkeypatch.setattr(os, point, _raiser(error))


def _earlier(directory: pathlib.Path) -> pathlib.Path:
    """directory/capture.json, holding EARLIER: the capture a failed write must leave whole."""
    target = directory / "capture.json"
    target.write_bytes(EARLIER)
    return target


FAILURES = [
    Failure("write", OSError(errno.ENOSPC, "No space left on device"), "No space left on device (os error 28)"),
    Failure("write", OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded (os error 122)"),
    Failure("flush", OSError(errno.ENOSPC, "No space left on device"), "No space left on device (os error 28)"),
    Failure("fsync", OSError(errno.ENOSPC, "No space left on device"), "No space left on device (os error 28)"),
    Failure("mkstemp", PermissionError(errno.EACCES, "Permission denied"), "Permission denied (os error 13)"),
    Failure("mkstemp", OSError(errno.EROFS, "Read-only file system"), "Read-only file system (os error 30)"),
    Failure("mkstemp", OSError(errno.ENOSPC, "No space left on device"), "No space left on device (os error 28)"),
    Failure("chmod", PermissionError(errno.EPERM, "Operation not permitted"), "Operation not permitted (os error 1)"),
    Failure("replace", PermissionError(errno.EACCES, "Permission denied"), "Permission denied (os error 13)"),
    Failure("replace", OSError(errno.EXDEV, "Invalid cross-device link"), "Invalid cross-device link (os error 18)"),
]
FAILURE_IDS = [f"{point}-{errno.errorcode[error.errno]}" for point, error, _ in FAILURES]


@pytest.mark.parametrize("failure", FAILURES, ids=FAILURE_IDS)
def test_a_failed_close_keeps_the_earlier_file_and_reports_once(
    make: Callable[..., Any],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    failure: Failure,
) -> None:
    target = _earlier(tmp_path)
    target.chmod(0o604)
    hist = fill(make(2, 3, trace=True))
    _inject(monkeypatch, failure)
    hist.close()  # must not raise
    monkeypatch.undo()
    assert capfd.readouterr().err == f"[router-hist] FAILED writing {target}: {failure.shown}\n"
    assert target.read_bytes() == EARLIER
    assert stat.S_IMODE(target.stat().st_mode) == 0o604
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.json"]
    assert hist.closed
    # Once: no retry and no second report, even with the disk back.
    hist.close()
    assert capfd.readouterr().err == ""
    assert target.read_bytes() == EARLIER
    # The data is still there for a deliberate write().
    assert hist.to_json() == DOC
    hist.write()
    assert target.read_text() == DOC


@pytest.mark.parametrize("failure", FAILURES, ids=FAILURE_IDS)
def test_a_failed_write_raises_the_os_error_and_keeps_the_earlier_file(
    make: Callable[..., Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, failure: Failure
) -> None:
    target = _earlier(tmp_path)
    hist = fill(make(2, 3, trace=True))
    _inject(monkeypatch, failure)
    with pytest.raises(OSError) as info:
        hist.write()
    monkeypatch.undo()
    assert info.value.errno == failure.error.errno
    assert target.read_bytes() == EARLIER
    assert leftovers(tmp_path) == []
    assert not hist.closed


@pytest.mark.parametrize("failure", FAILURES[:1] + FAILURES[4:5], ids=FAILURE_IDS[:1] + FAILURE_IDS[4:5])
def test_a_failed_write_at_drop_is_reported_once_and_not_raised(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], failure: Failure
) -> None:
    # The autouse guard in conftest fails the test on "Exception ignored".
    target = _earlier(tmp_path)
    hist = fill(RouterHistogram(str(target), 2, 3, trace=True))
    _inject(monkeypatch, failure)
    del hist
    gc.collect()
    monkeypatch.undo()
    assert capfd.readouterr().err == f"[router-hist] FAILED writing {target}: {failure.shown}\n"
    assert target.read_bytes() == EARLIER
    assert leftovers(tmp_path) == []


def test_a_directory_removed_under_the_recorder(make: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hist = fill(make(2, 3, trace=True, name="run/capture.json"))
    run_dir.rmdir()
    hist.close()
    assert capfd.readouterr().err == (
        f"[router-hist] FAILED writing {run_dir / 'capture.json'}: No such file or directory (os error 2)\n"
    )
    assert list(tmp_path.iterdir()) == []  # not re-created


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_read_only_directory(read_only_dir: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    read_only_dir.chmod(0o755)  # writable while the earlier file and the recorder are made
    target = _earlier(read_only_dir)
    hist = fill(RouterHistogram(str(target), 2, 3, trace=True))
    read_only_dir.chmod(0o555)
    with unprivileged():  # root would write anyway: close as nobody
        hist.close()
    assert capfd.readouterr().err == f"[router-hist] FAILED writing {target}: Permission denied (os error 13)\n"
    assert target.read_bytes() == EARLIER
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["capture.json"]


# --- how a write succeeds ------------------------------------------------------------


@pytest.mark.parametrize("how", ["write", "close", "drop", "symlink"])
def test_every_write_is_a_complete_synced_temporary_file_renamed_into_place(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], how: str
) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = _earlier(real_dir)
    path = target
    if how == "symlink":
        path = tmp_path / "latest.json"
        path.symlink_to(target)
    synced: list[int] = []
    replaced: list[tuple[str, str, bytes, bytes, bool]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        src, dst = os.fspath(src), os.fspath(dst)
        # What is on disk at the moment of the rename: the whole new capture
        # beside the untouched earlier file.
        replaced.append((src, dst, pathlib.Path(src).read_bytes(), target.read_bytes(), bool(synced)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    hist = fill(RouterHistogram(str(path), 2, 3, trace=True))
    if how == "write":
        hist.write()
        hist.discard()
    elif how == "drop":
        del hist
        gc.collect()
    else:
        hist.close()
    monkeypatch.undo()
    assert len(replaced) == 1
    src, dst, written, before, was_synced = replaced[0]
    assert dst == str(target)  # through the symlink, to the file it names
    assert os.path.dirname(src) == str(real_dir)  # same directory: a same-filesystem rename
    assert os.path.basename(src).startswith(".capture.json.") and src.endswith(".tmp")
    assert written == DOC.encode("ascii")
    assert before == EARLIER
    assert was_synced
    assert target.read_text() == DOC
    assert leftovers(real_dir) == [] and leftovers(tmp_path) == []
    if how == "symlink":
        assert path.is_symlink()
    capfd.readouterr()


# --- at interpreter exit, in a child interpreter -----------------------------------------


# Each sets up a failure that the exit-time write then meets for real.
EXIT_FAILURES = {
    # The directory exists when the recorder is made (which checks it), then goes.
    "missing-directory": (
        "path = os.path.join(os.path.dirname(path), 'gone', 'capture.json')\n"
        "os.mkdir(os.path.dirname(path))\n",
        "No such file or directory (os error 2)",
    ),
    # A real short write and EFBIG from the kernel (CPython ignores SIGXFSZ).
    "file-size-limit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))\n",
        "File too large (os error 27)",
    ),
    "permission": (
        "def refuse(*args, **kwargs):\n"
        "    raise PermissionError(errno.EACCES, 'Permission denied')\n"
        "tempfile.mkstemp = refuse\n",
        "Permission denied (os error 13)",
    ),
    "full-disk": (
        "real_fsync = os.fsync\n"
        "def fsync(fd):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "os.fsync = fsync\n",
        "No space left on device (os error 28)",
    ),
}


@pytest.mark.parametrize("failure", sorted(EXIT_FAILURES))
@pytest.mark.parametrize(
    ("ending", "status"),
    [("", 0), ("sys.exit(3)\n", 3), ("raise SystemExit('stopping')\n", 1), ("hist.close()\n", 0)],
    ids=["falls-off-the-end", "sys.exit(3)", "SystemExit-message", "closed-then-exit"],
)
def test_a_failed_write_at_exit_is_reported_once_without_a_traceback(
    tmp_path: pathlib.Path, failure: str, ending: str, status: int
) -> None:
    setup, shown = EXIT_FAILURES[failure]
    target = tmp_path / "capture.json"
    target.write_bytes(EARLIER + b" " * 4096)  # bigger than the capture
    result = run_script(
        tmp_path,
        "path = sys.argv[1]\n"
        + setup
        + "hist = R(path, 2, 3, trace=True)\nhist.record(0, [2, 0])\nhist.record(1, [1, 2])\n"
        + ("os.rmdir(os.path.dirname(path))\n" if failure == "missing-directory" else "")
        + ending,
        str(target),
    )
    failed_path = tmp_path / "gone" / "capture.json" if failure == "missing-directory" else target
    assert result.returncode == status
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "Exception ignored" not in result.stderr
    expected = [f"[router-hist] FAILED writing {failed_path}: {shown}"]
    if ending.startswith("raise SystemExit"):
        expected.append("stopping")
    assert sorted(result.stderr.splitlines()) == sorted(expected)
    assert target.read_bytes() == EARLIER + b" " * 4096
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "gone").exists()


def test_one_failed_write_at_exit_does_not_stop_the_others(tmp_path: pathlib.Path) -> None:
    result, (good_a, good_b, bad) = run_with_files(
        tmp_path,
        """
        a = R(a_path, 1, 2)
        os.mkdir(os.path.dirname(c_path))
        c = R(c_path, 1, 2)
        os.rmdir(os.path.dirname(c_path))  # gone by the time of the write
        b = R(b_path, 1, 2)
        for hist in (a, b, c):
            hist.record(0, [1])
        """,
        {"a_path": "a.json", "b_path": "b.json", "c_path": "gone/c.json"},
    )
    assert result.returncode == 0
    assert sorted(result.stderr.splitlines()) == sorted(
        [
            f"[router-hist] wrote {good_a}",
            f"[router-hist] wrote {good_b}",
            f"[router-hist] FAILED writing {bad}: No such file or directory (os error 2)",
        ]
    )
    assert good_a.read_text() == good_b.read_text() == ONE_PASS
