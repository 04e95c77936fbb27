"""The README's recording examples run as written, and pass ``mypy --strict`` against the package's stubs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import turbospark
from childproc import run_isolated
from conftest import require_module
from readme_blocks import block_after

# Stand-ins for the model the decode-loop example leaves to the reader, typed
# so that mypy checks the example's own calls.
DECODE_LOOP_PRELUDE = '''
max_new_tokens: int = 3
hidden: int = 0


def attention(layer: int, hidden: int) -> int:
    return hidden + 1


def router_topk(layer: int, hidden: int) -> list[int]:
    return [(layer + hidden + j) % 128 for j in range(8)]


def experts(layer: int, hidden: int, ids: list[int]) -> int:
    return hidden
'''


def example(name: str) -> str:
    """The fenced Python block that follows ``<!-- example: NAME -->`` in the README."""
    return block_after(f"example: {name}", "python")


def run(source: str, tmp_path: Path, monkeypatch: Any) -> str:
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"README:{len(source)}", "exec"), {"__name__": "readme"})  # noqa: S102
    return out.getvalue()


def test_the_decode_loop_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    path = tmp_path / "capture.json"
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(path))
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "1")
    monkeypatch.setenv("TURBOSPARK_PILOT_PROBE", "1")
    run(DECODE_LOOP_PRELUDE + example("decode-loop"), tmp_path, monkeypatch)
    assert capfd.readouterr().err == f"[router-hist] wrote {path}\n"
    doc = json.loads(path.read_text())
    # hidden grows by one per layer: layer l of token t routes from hidden = 40 t + l + 1.
    for layer in (0, 17, 39):
        assert doc["trace"][layer] == [
            (layer + 40 * t + layer + 1 + j) % 128 for t in range(3) for j in range(8)
        ]
    assert doc["pred"][0] == [] and len(doc["pred"][1]) == 3 * 8
    assert [sum(row) for row in doc["counts"]] == [24] * 40


def test_the_context_manager_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    assert run(example("context-manager"), tmp_path, monkeypatch) == "(40, 128) int64 (1, 8)\n"
    assert capfd.readouterr().err == "[router-hist] wrote capture.json\n"
    assert json.loads((tmp_path / "capture.json").read_text())["trace"][1] == [
        3, 17, 5, 99, 12, 0, 64, 8, 1, 2, 3, 4, 5, 6, 7, 9,
    ]


def test_the_torch_batch_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    require_module("torch")
    source = example("torch-batch")
    printed = run(source, tmp_path, monkeypatch)
    promised = re.search(r"^# (\{.*\})$", source, re.M)
    assert promised is not None
    assert printed == promised.group(1) + "\n"
    assert (tmp_path / "capture.json").read_text() == promised.group(1)
    capfd.readouterr()


MYPY_CONFIG = """
[mypy]
strict = True
# The package as a user's checker sees an installed one: its stubs and
# annotations are used, its own findings are not the example's.
[mypy-turbospark.*]
ignore_errors = True
[mypy-torch.*]
follow_imports = skip
"""


def _package_root() -> str:
    """Where mypy finds turbospark: nothing to add when installed, the checkout for an editable install."""
    root = Path(turbospark.__file__).resolve().parent.parent
    return "" if "site-packages" in root.parts else str(root)


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    require_module("mypy")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    (tmp_path / "example.py").write_text(source)
    # Not child_env: mypy finds turbospark through MYPYPATH, as a user's would.
    return run_isolated(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / "cache"), "example.py"],
        str(tmp_path),
        {**os.environ, "MYPYPATH": _package_root()},
        600,
    )


def test_the_recording_examples_pass_mypy_strict(tmp_path: Path) -> None:
    require_module("torch")  # the torch-batch example imports it; mypy needs its stubs
    source = DECODE_LOOP_PRELUDE + "\n\ndef loop() -> None:\n" + "".join(
        f"    {line}\n" for line in example("decode-loop").splitlines()
    )
    for name in ("context-manager", "torch-batch"):
        source += f"\n\ndef {name.replace('-', '_')}() -> None:\n" + "".join(
            f"    {line}\n" for line in example(name).splitlines()
        )
    result = mypy(tmp_path, source)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_rejects_calls_of_the_wrong_types(tmp_path: Path) -> None:
    result = mypy(
        tmp_path,
        "import numpy as np\n"
        "from turbospark import RouterHistogram\n"
        "h = RouterHistogram('c.json', 2, 4)\n"
        "h.record('0', [1])\n"
        "h.record(0, 'ab')\n"
        "h.record_many(0, np.array([[1, 2]]), mask=[1, 0])\n"
        "h.record_prediction(0, 3.5)\n"
        "h.record(0, [1, 2])\n",
    )
    assert result.returncode == 1
    flagged = sorted({int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line})
    assert flagged == [4, 5, 6, 7], result.stdout


def test_the_trace_cap_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    source = example("trace-cap")
    printed = run(source, tmp_path, monkeypatch).splitlines()
    assert printed[0] == "[5, 0] [3, 0] [[0, 7], [1, 7]]"
    # The document the example shows is the one it prints, and the one written.
    shown = re.search(r"^# (\{.*\})$", source, re.M)
    assert shown is not None and printed[1] == shown.group(1)
    assert (tmp_path / "capped.json").read_text() == shown.group(1)
    assert capfd.readouterr().err == "[router-hist] wrote capped.json\n"


def test_the_checkpoint_example(tmp_path: Path, monkeypatch: Any, capfd: Any) -> None:
    source = example("checkpoint")
    printed = run(source, tmp_path, monkeypatch).splitlines()
    assert printed == ["[0, 1, 0, 0, 0, 0, 0, 1]"]
    assert json.loads((tmp_path / "long.json").read_text())["trace"] == [[1, 7], []]
    assert capfd.readouterr().err == "[router-hist] wrote long.json\n"
