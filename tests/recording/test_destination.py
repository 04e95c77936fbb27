"""A capture's destination is checked when the recorder is made, not discovered at exit.

The constructor raises (naming the path, creating nothing); ``from_env``
warns once and records anyway, since an environment setting must never stop
a runtime; ``write()`` names the destination, never its temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
import warnings
from typing import Any

import pytest

import turbospark.recording.recorder
from conftest import unprivileged
from turbospark import RouterHistogram
from capture_helpers import ONE_PASS

HIST = "TURBOSPARK_ROUTER_HIST"


def live_count() -> int:
    return turbospark.recording.durable._lifecycle.pending_count()


@pytest.mark.parametrize(
    ("where", "error", "code", "why"),
    [
        ("missing/c.json", FileNotFoundError, errno.ENOENT, "the directory {dir!r} does not exist"),
        ("file/c.json", NotADirectoryError, errno.ENOTDIR, "{dir!r} is not a directory"),
        ("file/deeper/c.json", NotADirectoryError, errno.ENOTDIR, "a component of {dir!r} is not a directory"),
        ("a-directory", IsADirectoryError, errno.EISDIR, "it is a directory"),
    ],
)
def test_the_constructor_rejects_a_destination_it_could_never_write(
    tmp_path: pathlib.Path, where: str, error: type, code: int, why: str
) -> None:
    (tmp_path / "file").write_text("a file, not a directory")
    (tmp_path / "a-directory").mkdir()
    before = sorted(tmp_path.iterdir())
    live = live_count()
    path = str(tmp_path / where)
    with pytest.raises(error) as info:
        RouterHistogram(path, 2, 4, 2, trace=True)
    assert (info.value.errno, info.value.filename) == (code, path)
    reason = why.format(dir=os.path.dirname(path))
    assert str(info.value) == f"[Errno {code}] {reason}: {path!r}"
    assert sorted(tmp_path.iterdir()) == before
    assert live_count() == live  # nothing registered to be written at exit


def test_the_constructor_rejects_a_directory_it_may_not_write_in(read_only_dir: pathlib.Path) -> None:
    path = str(read_only_dir / "c.json")
    with unprivileged(), pytest.raises(PermissionError) as info:
        RouterHistogram(path, 1, 2)
    assert str(info.value) == (
        f"[Errno 13] no permission to create files in {str(read_only_dir)!r}: {path!r}"
    )
    assert list(read_only_dir.iterdir()) == []


def test_writable_destinations_are_accepted(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "old.json"
    existing.write_text("earlier")
    link = tmp_path / "link.json"
    link.symlink_to(existing)
    for path in (tmp_path / "new.json", existing, link, pathlib.Path(os.devnull)):
        hist = RouterHistogram(str(path), 1, 2)
        hist.record(0, [1])
        hist.close()
    assert capfd.readouterr().err.count("[router-hist] wrote ") == 4
    assert existing.read_text() == ONE_PASS


def test_from_env_warns_once_and_still_records(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "missing" / "c.json")
    monkeypatch.setenv(HIST, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = RouterHistogram.from_env(1, 2)
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            RuntimeWarning,
            f"{HIST}={path!r}: cannot write the capture there: the directory {os.path.dirname(path)!r} does not "
            "exist; recording anyway, but it will be lost unless that is fixed before it is written",
        )
    ]
    assert caught[0].filename == __file__  # attributed to the caller's line
    assert hist is not None
    hist.record(0, [1])
    assert hist.to_json() == ONE_PASS
    # Fixed in time, the capture is written after all.
    os.mkdir(os.path.dirname(path))
    hist.close()
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"
    assert pathlib.Path(path).read_text() == ONE_PASS


def test_write_names_the_destination_not_its_temporary_file(tmp_path: pathlib.Path, read_only_dir: pathlib.Path) -> None:
    hist = RouterHistogram(str(tmp_path / "c.json"), 1, 2)
    cases = [
        (str(tmp_path / "gone" / "c.json"), FileNotFoundError, contextlib.nullcontext()),
        (str(read_only_dir / "c.json"), PermissionError, unprivileged()),
    ]
    for target, error, context in cases:
        with context, pytest.raises(error) as info:
            hist.write(target)
        assert info.value.filename == target
        assert info.value.filename2 is None
        assert ".tmp" not in str(info.value)
    hist.discard()


def test_a_failing_replace_names_the_destination(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = str(tmp_path / "c.json")
    hist = RouterHistogram(target, 1, 2)

    def refuse(source: Any, destination: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", source, None, destination)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError) as info:
        hist.write()
    assert str(info.value) == f"[Errno {errno.EXDEV}] Invalid cross-device link: {target!r}"
    assert [p.name for p in tmp_path.iterdir()] == []
    hist.discard()
    assert stat.S_ISDIR(tmp_path.stat().st_mode)
