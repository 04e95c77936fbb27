"""docs/stream.md's example runs as written, and its shell lines do what they say."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import turbospark
from readme_blocks import block, block_after
from turbospark.cli import main


def test_the_stream_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    monkeypatch.chdir(tmp_path)
    source = block_after("example: stream", "python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "docs/stream.md", "exec"), {"__name__": "docs"})  # noqa: S102
    assert out.getvalue().splitlines() == ["uint8 (500, 2) 2", "[[1, 2], [3, 4]]"]
    # The shell block: analyze reads it, export writes what trace=True would have written.
    shell = block("turbospark export long.json --to json -o long-full.json")
    for line in shell.splitlines():
        argv = line.split("#")[0].split()
        assert argv[0] == "turbospark"
        capfd.readouterr()
        assert main(argv[1:]) == 0
    with turbospark.RouterHistogram("memory.json", 2, 64, 2, trace=True) as hist:
        for step in range(1000):
            hist.record(step % 2, [step % 64, (step + 1) % 64])
    assert (tmp_path / "long-full.json").read_bytes() == (tmp_path / "memory.json").read_bytes()
