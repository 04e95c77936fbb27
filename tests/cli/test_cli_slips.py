"""The command line's small promises: --version, the `analyse` spelling, file names it reports,
errors it reports once, the demo's honesty about simulated routing, progress on a terminal."""

from __future__ import annotations

import errno
import importlib.metadata
import io
import json
import os
import pathlib
import sys
from typing import Any

import pytest

import turbospark
from conftest import require_module
from turbospark.cli import _progress, simulate
from turbospark.cli import main
from turbospark.cli.demo import NEXT_STEPS
from capture_helpers import RUST_TRACE

REPO = pathlib.Path(__file__).resolve().parents[2]


def write(tmp_path: pathlib.Path, text: str, name: str = "c.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_version(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capfd.readouterr().out == f"turbospark {turbospark.__version__}\n"
    assert importlib.metadata.version("turbospark") == turbospark.__version__


def test_analyse_is_analyze(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, RUST_TRACE)
    assert main(["analyze", path, "--json", "--cache", "2"]) == 0
    american = capfd.readouterr().out
    assert main(["analyse", path, "--json", "--cache", "2"]) == 0
    assert capfd.readouterr().out == american


def test_the_license_matches_the_metadata() -> None:
    tomllib = require_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("MIT", ["LICENSE"])
    assert (REPO / "LICENSE").read_text().startswith("MIT License\n")
    metadata = importlib.metadata.metadata("turbospark")
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the capture is empty (was it written?)"),
        ("\n", "the capture is empty (was it written?)"),
        (RUST_TRACE[:40], "the capture is truncated: it stops at byte 40, before the document is complete "
                       "(was it cut short, or still being written?)"),
        (RUST_TRACE[:30] + "\n", "the capture is truncated: it stops at byte 30, before the document is complete "
                              "(was it cut short, or still being written?)"),
    ],
)
def test_an_empty_or_truncated_capture_says_so(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = write(tmp_path, text)
    assert main(["analyze", path]) == 2
    assert capfd.readouterr().err == f"turbospark: cannot read {path}: not valid JSON: {problem}\n"


def test_plot_without_an_extension_writes_png_and_says_so(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("matplotlib")
    out = tmp_path / "noext"
    assert main(["plot", write(tmp_path, RUST_TRACE), "-o", str(out)]) == 0
    assert capfd.readouterr().out == f"wrote {out}.png ({str(out)!r} has no extension: PNG)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "noext.png"]
    assert (tmp_path / "noext.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_to_an_unknown_format_exits_2(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("matplotlib")
    out = tmp_path / "fig.nope"
    assert main(["plot", write(tmp_path, RUST_TRACE), "-o", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"turbospark: cannot write {out}: Format 'nope' is not supported") and err.count("\n") == 1
    assert not out.exists()


def test_demo_to_a_bad_path_fails_before_simulating_and_reports_once(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("simulated before checking the output path")

    monkeypatch.setattr(simulate.RouterSimulator, "passes", never)
    out = tmp_path / "no" / "such" / "x.json"
    assert main(["demo", "--out", str(out)]) == 2
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == (
        "", f"turbospark: cannot write {out}: the directory {str(out.parent)!r} does not exist\n"
    )


def test_a_demo_whose_write_fails_reports_once_and_never_analyses_a_stale_file(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "d.json"
    out.write_text(RUST_TRACE)  # an earlier capture at that path must not pass for this run's

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["demo", "--out", str(out), "--layers", "2", "--passes", "5"]) == 2
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", f"[router-hist] FAILED writing {out}: No space left on device (os error 28)\n")
    assert out.read_text() == RUST_TRACE


def test_the_demo_says_its_routing_is_simulated_and_what_next(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "d.json")
    argv = ["demo", "--out", out, "--layers", "2", "--experts", "8", "--top-k", "2", "--passes", "20"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    assert captured.out.endswith("\n\n" + NEXT_STEPS + "\n")
    assert captured.err == f"[router-hist] wrote {out}\n"
    assert main(argv + ["--json"]) == 0
    captured = capfd.readouterr()
    assert json.loads(captured.out)["num_layers"] == 2  # stdout: the document alone
    assert captured.err == f"[router-hist] wrote {out}\n\n{NEXT_STEPS}\n"
    assert NEXT_STEPS.startswith("note: the routing above is simulated")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """One second passes per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_progress_waits_two_seconds_then_rewrites_one_line_and_erases_it() -> None:
    stream = Terminal()
    progress = _progress.Progress(1000, stream, "demo", clock=Clock())  # starts at t=1, shows from t=3
    for done in (10, 20, 300, 1000):
        progress(done)
    progress.finish()  # already erased: nothing more
    line_300 = "demo: 300/1,000 (30%)"
    assert stream.getvalue() == "\rdemo: 20/1,000 (2%)" + "\r" + line_300 + "\r" + " " * len(line_300) + "\r"


def test_progress_only_on_a_terminal() -> None:
    assert _progress.progress_on(io.StringIO(), 10, "x") is None
    assert isinstance(_progress.progress_on(Terminal(), 10, "x"), _progress.Progress)


def test_a_long_demo_on_a_terminal_shows_progress_on_stderr(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_progress.time, "monotonic", Clock())  # every pass "takes" a second
    out = str(tmp_path / "d.json")
    assert main(["demo", "--out", out, "--layers", "2", "--experts", "8", "--top-k", "2", "--passes", "4"]) == 0
    label = "demo: simulating and recording passes"
    assert terminal.getvalue() == (
        f"\r{label}: 2/4 (50%)\r{label}: 3/4 (75%)\r" + " " * len(f"{label}: 3/4 (75%)") + "\r"
        + f"[router-hist] wrote {out}\n"
    )
    assert label not in capfd.readouterr().out  # progress never reaches stdout
