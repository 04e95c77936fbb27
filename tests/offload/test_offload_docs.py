"""docs/offload.md's worked examples run as written and print what they show; the README points there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from childproc import child_env, run_isolated
from conftest import require_module
from readme_blocks import README

DOCS = README.parent / "docs" / "offload.md"


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``turbospark`` command is this interpreter's package."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "turbospark").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turbospark "$@"\n')
    (bin_dir / "turbospark").chmod(0o755)
    return child_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def sh(line: str, env: dict[str, str], cwd: Path) -> str:
    done: subprocess.CompletedProcess[str] = run_isolated(["bash", "-c", line], str(cwd), env, 600)
    assert done.returncode == 0, (line, done.stderr)
    return done.stdout


def example(name: str) -> tuple[list[str], dict[str, str]]:
    found = re.search(rf"<!-- example: {name} -->\s*```\n(.*?)```", DOCS.read_text(), re.S)
    assert found is not None, name
    commands: list[str] = []
    expected: dict[str, str] = {}
    for line in found.group(1).splitlines(keepends=True):
        if line.startswith("$ "):
            commands.append(line[2:].strip())
            expected[commands[-1]] = ""
        else:
            expected[commands[-1]] += line
    return commands, expected


def test_docs_worked_example(tmp_path: Path, shell: dict[str, str]) -> None:
    commands, expected = example("offload-demo")
    assert len(commands) == 5
    for command in commands:
        assert sh(command, shell, tmp_path) == expected[command], command


def test_docs_kt_example(tmp_path: Path, shell: dict[str, str]) -> None:
    torch = require_module("torch")
    sh("turbospark demo > /dev/null", shell, tmp_path)
    [command], expected = example("offload-kt")
    assert sh(command, shell, tmp_path) == expected[command]
    saved = torch.load(tmp_path / "gpu.pt", map_location="cpu", weights_only=True)
    counts = saved["logical_count"]
    assert list(saved) == ["logical_count"] and tuple(counts.shape) == (1, 16, 128)
    assert int((counts == 1000).sum()) == 512 and int((counts == 0).sum()) == 16 * 128 - 512


def test_readme_points_to_the_page() -> None:
    text = README.read_text()
    assert "[docs/offload.md](docs/offload.md)" in text
    assert "turbospark offload" in text
