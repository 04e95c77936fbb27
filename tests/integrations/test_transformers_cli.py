"""``turbospark record`` end to end on a tiny checkpoint saved to disk, ``--list``, and a pipeline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from childproc import run_python
from conftest import require_module

torch = require_module("torch")
require_module("transformers")

import turbospark  # noqa: E402
from turbospark.cli import main  # noqa: E402
from turbospark.transformers import capture, verify  # noqa: E402

from hf_models import save_checkpoint, tokenizer  # noqa: E402

PROMPTS = "the router picks each expert\n\na sparse mixture of experts\nthe model\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: Any) -> Any:
    folder = tmp_path_factory.mktemp("qwen3_moe")
    save_checkpoint("qwen3_moe", folder)
    return folder


def test_record_command_end_to_end(checkpoint: Any, tmp_path: Any) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    out = tmp_path / "capture.json"
    done = run_python(
        "-m", "turbospark", "record", str(checkpoint), "--prompts", str(prompts),
        "--batch-size", "2", "--max-new-tokens", "5", "--trace", "--pilot", "self", "-o", str(out),
        cwd=str(tmp_path), env={"HF_HUB_OFFLINE": "1"}, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(("[turbospark record]", "[router-hist]"))]
    assert lines == [
        f"[turbospark record] loading {checkpoint}",
        "[turbospark record] batch 1/2: 2 prompt(s), 5 new tokens",
        "[turbospark record] batch 2/2: 1 prompt(s), 5 new tokens",
        f"[router-hist] wrote {out}",
    ]
    # Three prompts, three sequences: the analysis works per sequence and per phase.
    assert done.stdout.startswith("capture: 3 layers x 8 experts, top-2; trace: yes; predictions: yes; sequences: 3 (")
    assert "by phase (means over routed layers; each sequence's passes of that phase alone):\n" in done.stdout
    assert done.stdout.endswith("self-test: pilot recall 100% on all 1 layers with predictions: ok\n")
    cap = turbospark.load(out)
    # 5 + 5 + 2 real prompt tokens, 4 fed decode tokens per prompt; layer 1 is dense.
    assert [t.shape[0] for t in cap.trace] == [24, 0, 24]
    assert (cap.pred[2] == cap.trace[2]).all()


def test_record_command_refuses_what_it_cannot_use(tmp_path: Any, capfd: Any) -> None:
    assert main(["record", str(tmp_path / "missing"), "--prompt", "the", "-o", str(tmp_path / "c.json")]) == 2
    assert capfd.readouterr().err == f"turbospark record: {tmp_path / 'missing'} is not a local checkpoint folder\n"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["record", str(tmp_path), "--prompts", str(empty), "-o", str(tmp_path / "c.json")]) == 2
    assert capfd.readouterr().err == f"turbospark record: {empty} holds no prompt\n"
    assert not (tmp_path / "c.json").exists()


def test_list_prints_the_computed_support_table() -> None:
    done = run_python("-m", "turbospark.transformers", "--list", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    supported = lines[1 : lines.index(next(line for line in lines if line.startswith("not supported")))]
    names = {line.split()[0]: line.split()[1] for line in supported}
    for family, router in [("mixtral", "MixtralTopKRouter"), ("qwen2_moe", "Qwen2MoeTopKRouter"),
                           ("qwen3_moe", "Qwen3MoeTopKRouter"), ("olmoe", "OlmoeTopKRouter"),
                           ("deepseek_v3", "DeepseekV3TopkRouter"), ("gpt_oss", "GptOssTopKRouter"),
                           ("granitemoe", "GraniteMoeTopKRouter"), ("glm4_moe", "Glm4MoeTopkRouter"),
                           ("llama4", "Llama4Router")]:
        assert names[family] == router
    assert lines[0] == f"supported ({len(supported)} families; transformers discovers the router, capture reads its ids):"
    unsupported = {line.split()[0]: line for line in lines[len(supported) + 2 :]}
    assert "switch_transformers" in unsupported and "dbrx" in unsupported and "mixtral" not in unsupported
    assert "returns no top-k indices" in unsupported["switch_transformers"]


def test_pipeline_records_through_capture(checkpoint: Any, tmp_path: Any) -> None:
    from transformers import AutoModelForCausalLM, pipeline

    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer())
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        generator("the router picks", max_new_tokens=4, do_sample=False)
    cap = turbospark.load(path)
    # "the router picks": 3 prompt tokens, then 3 fed decode tokens.
    assert [t.shape[0] for t in cap.trace] == [6, 0, 6]
    prompt = tokenizer()("the router picks", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert verify(model, path, out, prompt["attention_mask"]).ok
