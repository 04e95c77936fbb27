"""The cache section of the README and the worked example of docs/cache.md run as written and
print what they show."""

from __future__ import annotations

import sys
from pathlib import Path

import turbospark
from conftest import require_module
from readme_blocks import block_after, sh, transcript


def test_readme_cache_example(tmp_path: Path, shell: dict[str, str]) -> None:
    require_module("matplotlib")
    lines = [line for line in block_after("test: cache-example").splitlines() if line.strip()]
    outputs = [sh(line, shell, tmp_path) for line in lines]
    assert block_after("test: cache-output") in outputs[1]
    assert outputs[3] == "wrote cache.png\n"
    assert (tmp_path / "cache.png").read_bytes()[:4] == b"\x89PNG"
    code = block_after("test: cache-python", "python")
    printed = sh(f"{sys.executable} -c {_quote(code)}", shell, tmp_path)
    assert printed == code.rstrip().splitlines()[-1].removeprefix("# ") + "\n"


def test_docs_worked_example(tmp_path: Path, shell: dict[str, str]) -> None:
    commands, expected = transcript(block_after("example: cache-demo", ""))
    for command in commands:
        assert sh(command, shell, tmp_path) == expected[command], command
    assert turbospark.load(tmp_path / "turbospark-demo.json").pred is not None


def _quote(code: str) -> str:
    return "'" + code.replace("'", "'\\''") + "'"
