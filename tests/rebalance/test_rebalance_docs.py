"""docs/rebalance.md's worked example: its commands run as written and print what the page shows."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from readme_blocks import block_after, sh


def test_worked_example_prints_what_the_page_shows(tmp_path: Path, shell: dict[str, str]) -> None:
    lines = [line for line in block_after("test: rebalance-example").splitlines() if line.strip()]
    outputs = [sh(line, shell, tmp_path) for line in lines]
    assert outputs[1] == block_after("test: rebalance-output")
    assert outputs[2] == block_after("test: rebalance-turbospark-output")
    assert outputs[3] == block_after("test: rebalance-sglang-output")
    doc = json.loads((tmp_path / "sweep.json").read_text())
    chosen = doc["settings"][doc["recommended"]]
    assert (chosen["window_size"], chosen["step_interval"], chosen["num_redundant_experts"]) == (10, 30, 16)
    first = chosen["rearrangements"][0]
    assert first["step"] == 6 and len(first["physical_to_logical_map"]) == 8
    assert all(len(row) == 80 for row in first["physical_to_logical_map"])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="OpenBLAS's x86 kernel names")
def test_the_rebalancer_does_not_follow_the_blas_kernel(tmp_path: Path, shell: dict[str, str]) -> None:
    """The page's turbospark sweep prints the same under two of OpenBLAS's kernels (numpy's wheels pick one
    by CPU): its loads are summed in a fixed order, not by a matmul whose order is the kernel's (on this
    capture the two kernels once chose different moves)."""
    lines = [line for line in block_after("test: rebalance-example").splitlines() if line.strip()]
    sh(lines[0], shell, tmp_path)
    printed = [sh(f"OPENBLAS_CORETYPE={kernel} {lines[2]}", shell, tmp_path) for kernel in ("Haswell", "Prescott")]
    assert printed[0] == printed[1] == block_after("test: rebalance-turbospark-output")
