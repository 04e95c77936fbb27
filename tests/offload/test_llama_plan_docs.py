"""docs/llama_cpp.md's worked ``llama-plan`` example runs as written and prints what the page shows."""

from __future__ import annotations

from pathlib import Path

from readme_blocks import block_after, sh


def test_llama_plan_worked_example(tmp_path: Path, shell: dict[str, str]) -> None:
    lines = [line for line in block_after("test: llama-plan-example").splitlines() if line.strip()]
    assert len(lines) == 2
    outputs = [sh(line, shell, tmp_path) for line in lines]
    assert outputs[1] == block_after("test: llama-plan-output")
