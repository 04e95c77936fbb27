"""docs/offload.md's worked examples run as written and print what they show; the README points there."""

from __future__ import annotations

from pathlib import Path

from conftest import require_module
from readme_blocks import README, block_after, sh, transcript


def example(name: str) -> tuple[list[str], dict[str, str]]:
    """The commands of docs/offload.md's ``<!-- example: NAME -->`` session, and what each prints."""
    return transcript(block_after(f"example: {name}", ""))


def test_docs_worked_example(tmp_path: Path, shell: dict[str, str]) -> None:
    commands, expected = example("offload-demo")
    assert len(commands) == 5
    for command in commands:
        assert sh(command, shell, tmp_path, 600) == expected[command], command


def test_docs_kt_example(tmp_path: Path, shell: dict[str, str]) -> None:
    torch = require_module("torch")
    sh("turbospark demo > /dev/null", shell, tmp_path, 600)
    [command], expected = example("offload-kt")
    assert sh(command, shell, tmp_path, 600) == expected[command]
    saved = torch.load(tmp_path / "gpu.pt", map_location="cpu", weights_only=True)
    counts = saved["logical_count"]
    assert list(saved) == ["logical_count"] and tuple(counts.shape) == (1, 16, 128)
    assert int((counts == 1000).sum()) == 512 and int((counts == 0).sum()) == 16 * 128 - 512


def test_readme_points_to_the_page() -> None:
    text = README.read_text()
    assert "[docs/offload.md](docs/offload.md)" in text
    assert "turbospark offload" in text
