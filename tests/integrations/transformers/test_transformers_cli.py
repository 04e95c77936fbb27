"""``turbospark record`` end to end on a tiny checkpoint saved to disk, ``--list``, and a pipeline."""

from __future__ import annotations

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


def test_record_command_generates_greedily_from_a_beam_search_checkpoint(tmp_path: Any, capfd: Any) -> None:
    model = save_checkpoint("qwen3_moe", tmp_path / "ckpt")
    model.generation_config.num_beams = 4  # capture() refuses beam search: record must not inherit it
    model.generation_config.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "c.json"
    assert main(["record", str(tmp_path / "ckpt"), "--prompt", "the router picks", "--max-new-tokens", "3",
                 "--trace", "-o", str(out)]) == 0
    assert "[turbospark record] batch 1/1: 1 prompt(s), 3 new tokens\n" in capfd.readouterr().err
    # "the router picks": 3 prompt tokens, then 2 fed decode tokens; layer 1 is dense.
    assert [t.shape[0] for t in turbospark.load(out).trace] == [5, 0, 5]


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
    starts = [i for i, line in enumerate(lines) if not line.startswith("  ")]
    assert len(starts) == 3
    supported, unchecked, refused = (
        {line.split()[0]: line for line in lines[a + 1 : b]} for a, b in zip(starts, starts[1:] + [len(lines)])
    )
    assert lines[0] == (f"supported ({len(supported)} families): counts and trace recorded exactly; "
                        "probe yes = pilot= records exactly, else why it is refused:")
    assert lines[starts[1]] == (f"router checked only ({len(unchecked)} families): the router returns its ids, but the "
                                "default config builds no model here, so capture() makes the other checks when it starts:")
    assert lines[starts[2]] == f"not supported ({len(refused)}):"
    for family, router in [("mixtral", "MixtralTopKRouter"), ("qwen2_moe", "Qwen2MoeTopKRouter"),
                           ("qwen3_moe", "Qwen3MoeTopKRouter"), ("olmoe", "OlmoeTopKRouter"),
                           ("deepseek_v3", "DeepseekV3TopkRouter"), ("gpt_oss", "GptOssTopKRouter"),
                           ("granitemoe", "GraniteMoeTopKRouter"), ("glm4_moe", "Glm4MoeTopkRouter"),
                           ("llama4", "Llama4Router"), ("jamba", "JambaTopKRouter")]:
        assert supported[family] == f"  {family:<24} {router:<32} probe: yes"
    # What capture() refuses at set-up or on the first call is what the list says it refuses.
    assert supported["flex_olmo"] == (
        "  flex_olmo                FlexOlmoTopKRouter               probe: refused on the first forward call: decoder "
        "layer 0 is post-norm (post_attention_layernorm normalises the attention output; the MoE block gets the raw "
        "residual)")
    assert supported["cohere2_moe"] == (
        "  cohere2_moe              Cohere2MoeTopKRouter             probe: refused at set-up: the pilot probe needs the "
        "pre-MoE norm of decoder layer 0 (Cohere2MoeDecoderLayer); it has none of pre_feedforward_layernorm, "
        "pre_ff_layernorm, ffn_norm, post_attention_layernorm")
    assert supported["nemotron_h"].split("probe: ")[1].startswith("refused at set-up: the pilot probe needs")
    # Looped layers: not supported, with capture()'s own refusal.
    assert refused["inkling2_loop"] == (
        "  inkling2_loop            Inkling2LoopForCausalLM is not supported: it runs 48 decoder-layer calls per forward "
        "(config.total_num_hidden_layers) over its 24 decoder layers, so looped layers route every token more than "
        "once per forward, and a capture holds one pass per token and layer")
    assert "inkling2_loop" not in supported and "inkling2" in supported
    assert "switch_transformers" in refused and "dbrx" in refused and "mixtral" not in refused
    assert "returns no top-k indices" in refused["switch_transformers"]
    assert all(line.split("probe: ")[1].startswith("not checked (its default config builds no ")
               for line in unchecked.values())


def test_list_verdicts_match_what_capture_does(tmp_path: Any) -> None:
    import transformers as hf

    from hf_models import COMMON, build
    from turbospark.transformers import families

    verdicts = {family.name: family for family in families()}
    assert (verdicts["mixtral"].problem, verdicts["mixtral"].probe, verdicts["mixtral"].checked) == ("", "", True)
    assert verdicts["flex_olmo"].supported and verdicts["flex_olmo"].probe.startswith("refused on the first forward call")
    # Only the router checked: not called supported.
    assert (verdicts["qwen4_exp"].problem, verdicts["qwen4_exp"].checked, verdicts["qwen4_exp"].supported) == ("", False, False)
    assert not verdicts["inkling2_loop"].supported
    # mixtral: the probe records exactly (self-test: every prediction is the routed ids).
    path = tmp_path / "c.json"
    prompt = torch.tensor([[1, 5, 9, 13]])
    mixtral = build("mixtral")
    with capture(mixtral, path, trace=True, pilot="self"):
        with torch.no_grad():
            mixtral(prompt)
    cap = turbospark.load(path)
    assert [t.shape[0] for t in cap.trace] == [4, 4, 4] and all((p == t).all() for p, t in zip(cap.pred, cap.trace))
    # flex_olmo: refused on the first call, as listed; counts and trace still record.
    torch.manual_seed(0)
    model = hf.FlexOlmoForCausalLM(hf.FlexOlmoConfig(**COMMON, num_experts=8, num_experts_per_tok=2)).eval()
    with capture(model, path, trace=True, pilot="self"):
        try:
            model(prompt)
        except RuntimeError as exc:
            assert str(exc).startswith("the pilot probe cannot predict layer 0 exactly")
        else:
            raise AssertionError("the probe was not refused")
    with capture(model, path, trace=True):
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3,
                             min_new_tokens=3, do_sample=False)
    assert verify(model, path, out, torch.ones_like(prompt)).ok


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
