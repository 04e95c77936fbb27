"""The cache section of the README and the worked example of docs/cache.md run as written and
print what they show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import turbospark
from childproc import child_env, run_isolated
from conftest import require_module
from readme_blocks import README, block_after

DOCS = README.parent / "docs" / "cache.md"


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``turbospark`` command is this interpreter's package."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "turbospark").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turbospark "$@"\n')
    (bin_dir / "turbospark").chmod(0o755)
    return child_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def sh(line: str, env: dict[str, str], cwd: Path) -> str:
    done: subprocess.CompletedProcess[str] = run_isolated(["bash", "-c", line], str(cwd), env, 300)
    assert done.returncode == 0, (line, done.stderr)
    return done.stdout


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
    text = DOCS.read_text()
    found = re.search(r"<!-- example: cache-demo -->\s*```\n(.*?)```", text, re.S)
    assert found is not None
    commands, expected, current = [], {}, None
    for line in found.group(1).splitlines(keepends=True):
        if line.startswith("$ "):
            current = line[2:].strip()
            commands.append(current)
            expected[current] = ""
        else:
            expected[current] += line
    for command in commands:
        assert sh(command, shell, tmp_path) == expected[command], command
    assert turbospark.load(tmp_path / "turbospark-demo.json").pred is not None


def _quote(code: str) -> str:
    return "'" + code.replace("'", "'\\''") + "'"
