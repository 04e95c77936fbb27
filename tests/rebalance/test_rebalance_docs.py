"""docs/rebalance.md's worked example: its commands run as written and print what the page shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from childproc import child_env, run_isolated
from readme_blocks import block_after


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``turbospark`` is this checkout's, run by this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "turbospark"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turbospark "$@"\n')
    wrapper.chmod(0o755)
    return child_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def run(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = run_isolated(["bash", "-c", line], str(cwd), env, 300)
    assert done.returncode == 0, (line, done.stderr)
    return done


def test_worked_example_prints_what_the_page_shows(tmp_path: Path, shell: dict[str, str]) -> None:
    lines = [line for line in block_after("test: rebalance-example").splitlines() if line.strip()]
    outputs = [run(line, shell, tmp_path).stdout for line in lines]
    assert outputs[1] == block_after("test: rebalance-output")
    assert outputs[2] == block_after("test: rebalance-turbospark-output")
    doc = json.loads((tmp_path / "sweep.json").read_text())
    chosen = doc["settings"][doc["recommended"]]
    assert (chosen["window_size"], chosen["step_interval"], chosen["num_redundant_experts"]) == (10, 30, 16)
    first = chosen["rearrangements"][0]
    assert first["step"] == 6 and len(first["physical_to_logical_map"]) == 8
    assert all(len(row) == 80 for row in first["physical_to_logical_map"])
