"""docs/llama_cpp.md's worked ``llama-plan`` example runs as written and prints what the page shows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from childproc import child_env, run_isolated
from readme_blocks import block_after


def test_llama_plan_worked_example(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "turbospark").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turbospark "$@"\n')
    (bin_dir / "turbospark").chmod(0o755)
    env = child_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    lines = [line for line in block_after("test: llama-plan-example").splitlines() if line.strip()]
    assert len(lines) == 2
    outputs = []
    for line in lines:
        done = run_isolated(["bash", "-c", line], str(tmp_path), env, 300)
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    assert outputs[1] == block_after("test: llama-plan-output")
