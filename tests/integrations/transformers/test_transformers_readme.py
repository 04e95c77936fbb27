"""Every example of the README's "Recording a transformers model" section, run."""

from __future__ import annotations

import contextlib
import io
import shlex
from typing import Any


from childproc import run_python
from conftest import require_module
from readme_blocks import block, documents

torch = require_module("torch")
transformers = require_module("transformers")

import turbospark  # noqa: E402
from turbospark.transformers._families import families  # noqa: E402

from hf_models import build, save_checkpoint  # noqa: E402

PROMPTS = "the router picks each expert\na sparse mixture of experts\nthe model\n"


def _inputs() -> dict[str, Any]:
    ids = torch.tensor([[0, 0, 1, 5, 9, 13], [1, 22, 7, 40, 3, 11]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def test_three_line_example(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    exec(block("with capture(model, \"capture.json\", trace=True, pilot=\"next\"):"),
         {"model": build("mixtral"), "inputs": _inputs()})
    cap = turbospark.load(tmp_path / "capture.json")
    assert cap.trace is not None and cap.pred is not None and cap.seq is not None
    assert [int(n) for n in cap.totals] == [cap.trace[0].shape[0] * 2] * 3


def test_verify_example_prints_what_the_comment_says(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    code = block("result = verify(")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"model": build("mixtral"), "inputs": _inputs()})
    printed = code.split("print(result.ok, result.passes, result.problems)")[1].split("#")[1].strip()
    assert out.getvalue() == printed + "\n"


def test_record_command(tmp_path: Any) -> None:
    save_checkpoint("qwen3_moe", tmp_path / "my-moe-checkpoint")
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    command = block("turbospark record ./my-moe-checkpoint").strip()
    argv = shlex.split(command)
    assert argv[0] == "turbospark"
    done = run_python("-m", "turbospark", *argv[1:], cwd=str(tmp_path), env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "  pilot across dense layers: layer 2 from layer 0 (2 layers ahead)\n" in done.stdout
    assert turbospark.load(tmp_path / "capture.json").pilot_distance == (0, 0, 2)


def test_supported_list_is_the_computed_one() -> None:
    text = documents()
    listed = text.split("<!-- supported-families -->\n")[1].split("<!-- /supported-families -->")[0]
    names = [name.strip() for name in listed.replace("\n", " ").split(",")]
    computed = [family.name for family in families() if family.supported]
    verified = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "granitemoe", "glm4_moe"}
    assert verified <= set(computed)
    if transformers.__version__ == "5.24.0":  # the version docs/transformers.md quotes
        assert names == computed
        assert f"it lists {len(computed)} families as supported" in text
