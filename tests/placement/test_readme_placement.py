"""The README's placement section: its commands run as written, and the output it shows is what they print."""

from __future__ import annotations

import json
from pathlib import Path

from readme_blocks import block_after, sh, working_directory

def block(marker: str) -> str:
    """The fenced block right after ``<!-- test: MARKER -->`` in the README."""
    return block_after(f"test: {marker}")


def commands(marker: str) -> list[str]:
    return [line for line in block(marker).splitlines() if line.strip()]


def test_placement_example_runs_and_prints_what_the_readme_shows(tmp_path: Path, shell: dict[str, str]) -> None:
    outputs = [sh(line, shell, tmp_path) for line in commands("placement-example")]
    assert outputs[1] == block("placement-output")
    assert list(json.loads((tmp_path / "sglang.json").read_text())) == ["physical_to_logical_map"]
    assert (tmp_path / "eplb.yaml").read_text().startswith("initial_global_assignments:\n  0: [")
    analysis = json.loads((tmp_path / "analysis.json").read_text())
    assert len(analysis["placement"]["layers"]) == 16
    assert list(json.loads((tmp_path / "logical_count.json").read_text())) == ["logical_count"]
    assert len(json.loads((tmp_path / "compare.json").read_text())["layers"]) == 16
    assert outputs[-2] == "merged 2 captures into merged.json\n"
    assert outputs[-1] == "wrote placement.png\n"
    assert (tmp_path / "placement.png").read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads((tmp_path / "merged.json").read_text())["seq"][0]) == 2000
    code = block("placement-python")
    namespace: dict[str, object] = {}
    with working_directory(tmp_path):
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 -- the README's own code
    assert namespace["doc"]["summary"]["routed_layers"] == 16  # type: ignore[index]


def test_dispatch_example_runs_and_prints_what_the_readme_shows(tmp_path: Path, shell: dict[str, str]) -> None:
    sh(commands("placement-example")[0], shell, tmp_path)  # the demo capture
    outputs = [sh(line, shell, tmp_path) for line in commands("placement-dispatch")]
    assert outputs[0] == block("placement-dispatch-output")
    rebalanced = json.loads((tmp_path / "rebalanced.json").read_text())
    assert all(row["moved_slots"] <= 8 for row in rebalanced["layers"])
    assert rebalanced["summary"]["moved_bytes"] == rebalanced["summary"]["moved_slots"] * 44040192
    assert rebalanced["inputs"]["from"] == "static.json"
