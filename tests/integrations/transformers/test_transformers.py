"""turbospark.transformers on tiny random models of every verified architecture.

Each capture is checked two ways: by ``verify`` (a teacher-forced forward
through the package's own router discovery) and by an independent
recomputation here, with the test's own hooks on router classes named by
hand and its own idea of which tokens count.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

from childproc import run_python
from conftest import require_module

torch = require_module("torch")
require_module("transformers")

import turbospark  # noqa: E402
from turbospark.transformers import capture, find_routing, verify  # noqa: E402

from hf_models import ARCHITECTURES, build  # noqa: E402

ROUTER_CLASS = {
    "mixtral": "MixtralTopKRouter",
    "qwen2_moe": "Qwen2MoeTopKRouter",
    "qwen3_moe": "Qwen3MoeTopKRouter",
    "olmoe": "OlmoeTopKRouter",
    "deepseek_v3": "DeepseekV3TopkRouter",
    "gpt_oss": "GptOssTopKRouter",
    "granitemoe": "GraniteMoeTopKRouter",
    "glm4_moe": "Glm4MoeTopkRouter",
    "jamba": "JambaTopKRouter",
}
NAMES = sorted(ARCHITECTURES)
PROMPT = torch.tensor([[1, 5, 9, 13, 7, 22]])


class OwnHooks:
    """The test's own router hooks: every router call's ids, per layer, in call order."""

    def __init__(self, model: Any, name: str) -> None:
        self.calls: dict[int, list[torch.Tensor]] = {}
        self.handles = []
        for path, module in model.named_modules():
            if type(module).__name__ == ROUTER_CLASS[name]:
                layer = int(path.split("layers.")[1].split(".")[0])
                self.handles.append(module.register_forward_hook(self._hook(layer)))

    def _hook(self, layer: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self.calls.setdefault(layer, []).append(output[2].detach().clone())

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _trace(path: Any) -> Any:
    return turbospark.load(path)


@pytest.mark.parametrize("name", NAMES)
def test_discovery_finds_the_decoder_layers_and_routers(name: str) -> None:
    *_, routed, experts, top_k = ARCHITECTURES[name]
    routing = find_routing(build(name))
    assert (len(routing.layers), routing.routed_layers, routing.num_experts, routing.top_k) == (3, routed, experts, top_k)
    assert {type(site.router).__name__ for site in routing.sites} == {ROUTER_CLASS[name]}


@pytest.mark.parametrize("name", NAMES)
def test_batch_one_generate_records_exactly_the_models_routing(name: str, tmp_path: Any) -> None:
    model = build(name)
    path = tmp_path / "c.json"
    own = OwnHooks(model, name)
    with capture(model, path, trace=True):
        out = model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=8,
                             min_new_tokens=8, do_sample=False)
    own.remove()
    cap = _trace(path)
    # prompt (6) + 7 decode steps: the 8th token is never fed.
    result = verify(model, path, out, torch.ones_like(PROMPT))
    assert (result.ok, result.passes, result.problems) == (True, 13, ())
    *_, routed, experts, top_k = ARCHITECTURES[name]
    for layer in range(3):
        if layer not in routed:
            assert cap.trace[layer].shape == (0, top_k) and not cap.counts[layer].any()
            continue
        # Independent: exactly what the routers returned, in order (6 prompt rows, then 1 per step).
        mine = torch.cat(own.calls[layer]).numpy()
        assert [c.shape[0] for c in own.calls[layer]] == [6] + [1] * 7
        np.testing.assert_array_equal(cap.trace[layer], mine)
        np.testing.assert_array_equal(cap.counts[layer], np.bincount(mine.ravel(), minlength=experts))


def _batch(name: str) -> tuple[Any, Any, Any]:
    """A left-padded batch of 4 prompts, and an EOS id that finishes row 1 early."""
    lengths = [6, 3, 5, 2]
    width = max(lengths)
    generator = torch.Generator().manual_seed(7)
    ids = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, 64, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids, mask, lengths


@pytest.mark.parametrize("name", NAMES)
def test_padded_batch_with_early_finishers_records_only_real_tokens(name: str, tmp_path: Any) -> None:
    model = build(name)
    ids, mask, lengths = _batch(name)
    free = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    # Row 1's third generated token becomes the EOS (a generate argument): row 1 stops early.
    eos = int(free[1, ids.shape[1] + 2])
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=eos)
    result = verify(model, path, out, mask, eos_token_id=eos)
    assert result.ok, result.problems
    # Independent recomputation: each sequence alone, unpadded, batch 1, the test's own hooks.
    generated = out[:, ids.shape[1]:]
    fed = []
    for row in range(4):
        tokens = generated[row].tolist()
        stop = tokens.index(eos) if eos in tokens else len(tokens) - 1
        fed.append(min(stop, len(tokens) - 1))
    assert fed[1] <= 2 and max(fed) > fed[1], fed
    cap = _trace(path)
    *_, routed, _, top_k = ARCHITECTURES[name]
    expected_passes = sum(lengths) + sum(fed)
    assert result.passes == expected_passes
    per_row = {}
    for row in range(4):
        sequence = torch.cat([ids[row, ids.shape[1] - lengths[row]:], generated[row, : fed[row]]])[None]
        own = OwnHooks(model, name)
        with torch.no_grad():
            model(sequence)
        own.remove()
        per_row[row] = {layer: calls[0] for layer, calls in own.calls.items()}
    for layer in routed:
        rows = [per_row[r][layer][: lengths[r]] for r in range(4)]
        for step in range(max(fed)):
            rows.extend(per_row[r][layer][lengths[r] + step][None] for r in range(4) if step < fed[r])
        mine = torch.cat(rows).numpy()
        assert cap.trace[layer].shape == (expected_passes, top_k)
        np.testing.assert_array_equal(np.sort(cap.trace[layer], axis=1), np.sort(mine, axis=1))
        # Each pass tagged with its sequence (the batch row) and phase.
        want_seq = [r for r in range(4) for _ in range(lengths[r])]
        want_seq += [r for step in range(max(fed)) for r in range(4) if step < fed[r]]
        assert cap.seq[layer].tolist() == want_seq
        assert cap.phase[layer].tolist() == [0] * sum(lengths) + [1] * sum(fed)
    # Engine steps: the prompt forward (real tokens only), then one per decode forward, each holding the
    # rows not finished yet (generate feeds generated.shape[1] - 1 decode steps).
    steps = [sum(lengths)] + [sum(step < n for n in fed) for step in range(generated.shape[1] - 1)]
    assert steps[-1] > 0
    assert cap.step_passes.tolist() == [steps if layer in routed else [0] * len(steps) for layer in range(3)]
    assert turbospark.analyze(cap)["sequences"] == 4


@pytest.mark.parametrize("name", NAMES)
def test_self_probe_reads_100_percent(name: str, tmp_path: Any, capfd: Any) -> None:
    model = build(name)
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="self"):
        model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    cap = _trace(path)
    *_, routed, _, _ = ARCHITECTURES[name]
    for layer in routed:
        np.testing.assert_array_equal(cap.pred[layer], cap.trace[layer])
    assert "pilot_distance" not in path.read_text()
    # The cache simulation prefetches every routed layer perfectly, the first one included.
    from turbospark.offload.cache import cache_report

    layers = cache_report(cap, [cap.top_k], ["pilot"])["layers"]
    assert [entry["hit_rate"]["pilot+lru"] for entry in layers if entry["needed"]] == [[1.0]] * len(routed)
    capfd.readouterr()
    from turbospark.cli import main

    assert main(["analyze", str(path), "--self-test"]) == 0
    assert "self-test" in capfd.readouterr().out.lower()


def test_next_probe_across_a_dense_layer_records_the_distance(tmp_path: Any, capfd: Any) -> None:
    model = build("qwen3_moe")  # routed layers 0 and 2
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="next"):
        model(PROMPT[:, :3])
    text = path.read_text()
    assert text.endswith(',"pilot_distance":[0,0,2]}')
    doc = json.loads(text)
    assert doc["pred"][0] == [] and doc["pred"][1] == [] and len(doc["pred"][2]) == 6
    # The prediction is layer 2's norm and router on layer 0's post-attention residual.
    residual = {}
    layer0 = model.model.layers[0]
    handle = layer0.post_attention_layernorm.register_forward_pre_hook(lambda m, a: residual.setdefault("h", a[0]))
    with torch.no_grad():
        model(PROMPT[:, :3])
    handle.remove()
    layer2 = model.model.layers[2]
    with torch.no_grad():
        _, _, ids = layer2.mlp.gate(layer2.post_attention_layernorm(residual["h"]).reshape(-1, 32))
    assert doc["pred"][2] == ids.reshape(-1).tolist()
    assert turbospark.load(path).pilot_distance == (0, 0, 2)
    from turbospark.cli import main

    capfd.readouterr()
    assert main(["analyze", str(path)]) == 0
    assert "  pilot across dense layers: layer 2 from layer 0 (2 layers ahead)\n" in capfd.readouterr().out


def test_next_probe_without_dense_gaps_keeps_the_reference_json(tmp_path: Any) -> None:
    model = build("mixtral")
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="next") as rec:
        model(PROMPT[:, :2])
    doc = json.loads(path.read_text())
    # The reference's keys, then the sequence tags (one prompt block of sequence 0) and the one engine step.
    assert list(doc) == ["num_layers", "num_experts", "top_k", "counts", "trace", "pred", "seq", "phase", "step_passes"]
    assert doc["seq"] == [[0, 0]] * 3 and doc["phase"] == [[0, 0]] * 3 and doc["step_passes"] == [[2]] * 3
    assert [len(row) for row in doc["pred"]] == [0, 4, 4]
    assert rec.closed


def test_a_streamed_model_capture_is_the_in_memory_capture(tmp_path: Any) -> None:
    from turbospark.outputs.export_json import write_json
    import io

    model = build("qwen3_moe")  # a dense layer between routed ones: pilot_distance is written
    tokens = torch.tensor([[1, 5, 9, 13], [7, 22, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    for trace, name in ((True, "m.json"), ("stream", "s.json")):
        with capture(model, tmp_path / name, trace=trace, pilot="next", checkpoint=30.0) as rec:
            assert rec is not None and rec.checkpoint == 30.0
            model.generate(input_ids=tokens, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    streamed = turbospark.load(tmp_path / "s.json")
    assert streamed.stream is not None and streamed.pilot_distance == (0, 0, 2)
    out = io.BytesIO()
    write_json(streamed, out)
    assert out.getvalue() == (tmp_path / "m.json").read_bytes()


def test_probe_calls_fire_no_hook(tmp_path: Any) -> None:
    model = build("mixtral")
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules() if type(m).__name__ == "MixtralTopKRouter"]
    with capture(model, tmp_path / "c.json", trace=True, pilot="next"):
        out = model(PROMPT, output_router_logits=True)
    for handle in handles:
        handle.remove()
    # One call per router per forward: the probe's two extra router runs fired nothing,
    # and transformers' own output recording saw three routers, not five.
    assert len(calls) == 3
    assert len(out.router_logits) == 3


def _hooks(model: Any) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_every_hook_is_removed_on_exit_and_on_exception(tmp_path: Any) -> None:
    model = build("olmoe")
    before = _hooks(model)
    with capture(model, tmp_path / "a.json", trace=True, pilot="next"):
        assert _hooks(model) > before and "generate" in model.__dict__
    assert _hooks(model) == before and "generate" not in model.__dict__ and "_prefill" not in model.__dict__
    with pytest.raises(KeyError):
        with capture(model, tmp_path / "b.json") as rec:
            model(PROMPT)
            raise KeyError("boom")
    assert _hooks(model) == before and rec.closed
    assert json.loads((tmp_path / "b.json").read_text())["counts"][0] == rec.counts[0].tolist()
    assert sum(json.loads((tmp_path / "b.json").read_text())["counts"][0]) == 12


def test_path_none_follows_the_environment(tmp_path: Any, monkeypatch: Any) -> None:
    model = build("mixtral")
    monkeypatch.delenv("TURBOSPARK_ROUTER_HIST", raising=False)
    before = _hooks(model)
    with capture(model) as rec:
        assert rec is None and _hooks(model) == before
        model(PROMPT)
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "env.json"))
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "")
    with capture(model) as rec:
        model(PROMPT[:, :2])
    assert rec.trace_enabled and not rec.pilot_enabled()
    doc = json.loads((tmp_path / "env.json").read_text())
    assert [len(row) for row in doc["trace"]] == [4, 4, 4] and "pred" not in doc


def test_bad_arguments_are_refused_before_anything_is_installed(tmp_path: Any) -> None:
    model = build("mixtral")
    before = _hooks(model)
    with pytest.raises(ValueError, match=r"pilot must be None, 'next' or 'self', got 'ahead'"):
        with capture(model, tmp_path / "c.json", pilot="ahead"):
            pass
    with pytest.raises(ValueError, match=r"^trace must be None, True, False or 'stream', got 'yes'$"):
        with capture(model, tmp_path / "c.json", trace="yes"):  # type: ignore[arg-type]
            pass
    with capture(model, tmp_path / "c.json"):
        with pytest.raises(RuntimeError, match="a capture is already running on this MixtralForCausalLM"):
            with capture(model, tmp_path / "d.json"):
                pass
        with pytest.raises(RuntimeError, match=r"verify\(\) runs a forward pass"):
            verify(model, tmp_path / "c.json", PROMPT)
    assert _hooks(model) == before and not (tmp_path / "d.json").exists()


def test_unsupported_models_are_named(tmp_path: Any) -> None:
    import transformers as hf

    dense = hf.LlamaForCausalLM(hf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(TypeError, match=r"^LlamaForCausalLM is not a supported MoE model: it declares no router "):
        with capture(dense, tmp_path / "c.json"):
            pass
    dbrx = hf.DbrxForCausalLM(hf.DbrxConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=1, max_seq_len=64,
                                            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0},
                                            ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}))
    with pytest.raises(TypeError, match=r"^DbrxForCausalLM is not supported: router DbrxRouter returns no top-k indices "
                                        r"\(no integer \(tokens, top_k\) tensor among its outputs: float32 \(1, 4\)\)$"):
        with capture(dbrx, tmp_path / "c.json"):
            pass
    assert not (tmp_path / "c.json").exists()


def test_plain_forward_with_padding_records_real_tokens_only(tmp_path: Any) -> None:
    model = build("granitemoe")
    ids, mask, lengths = _batch("granitemoe")
    path = tmp_path / "c.json"
    # Positions as generate (and verify) derive them from the mask.
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with capture(model, path, trace=True):
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=positions)
    result = verify(model, path, ids, mask)
    assert (result.ok, result.passes) == (True, sum(lengths))
    assert turbospark.load(path).trace[0].shape == (sum(lengths), 2)


def test_each_generate_call_starts_new_sequences(tmp_path: Any) -> None:
    model = build("mixtral")
    ids, mask, lengths = _batch("mixtral")
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        model.generate(input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=3, min_new_tokens=3, do_sample=False)
        model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=3, min_new_tokens=3,
                       do_sample=False)
    cap = turbospark.load(path)
    # Rows 0 and 1 (6 and 3 prompt tokens, 2 decode steps each), then sequence 2 (6 + 2).
    assert cap.seq[0].tolist() == [0] * 6 + [1] * 3 + [0, 1, 0, 1] + [2] * 8
    assert cap.phase[0].tolist() == [0] * 9 + [1] * 4 + [0] * 6 + [1] * 2


def test_a_chunked_prefill_keeps_each_prompts_sequence(tmp_path: Any) -> None:
    model = build("mixtral")
    ids, mask, _ = _batch("mixtral")
    ids, mask = ids[:2], mask[:2]  # 6 tokens, and 3 left-padded to columns 3..5
    path = tmp_path / "c.json"
    own = OwnHooks(model, "mixtral")
    with capture(model, path, trace=True):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3,
                             do_sample=False, prefill_chunk_size=2)
    own.remove()
    cap = turbospark.load(path)
    # Chunks of 2 columns, each row by row: (0, 0), (0, 0, 1), (0, 0, 1, 1); then 2 decode steps.
    # Every chunk used to start new sequences: 2 prompts read as 6.
    assert cap.seq[0].tolist() == [0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1]
    assert cap.phase[0].tolist() == [0] * 9 + [1] * 4
    # One engine step per chunk (its real tokens: 2, 2 + 1, 2 + 2), then the 2 decode steps.
    assert cap.step_passes.tolist() == [[2, 3, 4, 2, 2]] * 3
    assert turbospark.analyze(cap)["sequences"] == 2
    result = verify(model, path, out, mask, prefill_chunk_size=2)
    assert (result.ok, result.passes, result.problems) == (True, 13, ())
    # Independent: what the routers returned, call by call, padding dropped by hand.
    keeps = [mask[:, c:c + 2].reshape(-1).bool() for c in (0, 2, 4)] + [torch.ones(2, dtype=torch.bool)] * 2
    for layer in range(3):
        assert [c.shape[0] for c in own.calls[layer]] == [4, 4, 4, 2, 2]
        mine = torch.cat([call[keep] for call, keep in zip(own.calls[layer], keeps)]).numpy()
        np.testing.assert_array_equal(cap.trace[layer], mine)
    # Verified as an unchunked prompt block, the order differs, and verify says what to pass.
    unchunked = verify(model, path, out, mask)
    assert not unchunked.ok and unchunked.problems[-1] == (
        "the prompt passes return to earlier sequences, as when generate prefills in chunks: "
        "pass the same prefill_chunk_size= to verify")
    with pytest.raises(ValueError) as info:
        verify(model, path, out, mask, prefill_chunk_size=0)
    assert str(info.value) == "prefill_chunk_size must be a positive integer, got 0"



@pytest.mark.parametrize("pilot", [None, "next"])
def test_device_path_writes_what_the_host_path_writes(tmp_path: Any, monkeypatch: Any, pilot: Any) -> None:
    """The DeviceRecorder route a CUDA model takes, forced on the CPU: the same JSON, byte for byte."""
    from turbospark.transformers import _sink

    model = build("qwen3_moe")
    ids, mask, _ = _batch("qwen3_moe")

    def run(path: Any) -> bytes:
        with capture(model, path, trace=True, pilot=pilot):
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, eos_token_id=[7, 9, 11])
        return path.read_bytes()

    host = run(tmp_path / "host.json")
    monkeypatch.setattr(_sink, "uses_device_path", lambda device: True)
    monkeypatch.setattr("turbospark.torch._buffers.DEFAULT_CAPACITY", 5)  # the prompt block goes in slices
    assert run(tmp_path / "device.json") == host
    assert b'"seq":' in host and (pilot is None) == (b'"pred":' not in host)


def test_ctrl_c_in_the_middle_of_a_generate_keeps_every_completed_call(tmp_path: Any) -> None:
    """Issue 16 item 5: blocks used to wait in the sink and a Ctrl-C during their hand-over lost a whole
    layer (passes [0, 8, 8]). Each call now commits at once: an interrupted generate leaves a prefix of
    its forward calls, layer by layer, and the written capture holds every call completed before it."""
    model = build("olmoe")
    ids, mask, _ = _batch("olmoe")
    path = tmp_path / "c.json"
    delivered: list[tuple[int, int]] = []
    with pytest.raises(KeyboardInterrupt):
        with capture(model, path, trace=True) as rec:
            real = rec.record_batch

            def record_batch(layer: int, block: Any, **tags: Any) -> None:
                if len(delivered) == 4:  # the second layer of the second forward call
                    raise KeyboardInterrupt
                real(layer, block, **tags)
                kept = block.shape[0] if tags.get("mask") is None else int(tags["mask"].sum())
                delivered.append((layer, kept))

            rec.record_batch = record_batch
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    doc = json.loads(path.read_text())
    passes = [len(row) // 2 for row in doc["trace"]]
    expected = [sum(n for layer, n in delivered if layer == index) for index in range(3)]
    assert passes == expected and expected[0] == expected[1] + 4 > expected[2], (passes, delivered)
    assert [len(row) for row in doc["seq"]] == passes


def test_override_table_llama4(tmp_path: Any) -> None:
    """Llama4Router returns (scores, logits): its ids come from the override, recomputed exactly."""
    import transformers as hf

    torch.manual_seed(0)
    config = hf.Llama4TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, intermediate_size_mlp=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=8, num_experts_per_tok=2,
        interleave_moe_layer_step=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    model = hf.Llama4ForCausalLM(config).eval()
    routing = find_routing(model)
    assert [(site.layer, site.ids_index, site.top_k, site.num_experts) for site in routing.sites] == [(0, None, 2, 8), (1, None, 2, 8)]
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="self"):
        out = model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=6, min_new_tokens=6,
                             do_sample=False)
    result = verify(model, path, out, torch.ones_like(PROMPT))
    assert (result.ok, result.passes) == (True, 11)
    cap = turbospark.load(path)
    np.testing.assert_array_equal(cap.pred[1], cap.trace[1])


def test_import_turbospark_imports_neither_torch_nor_this_package() -> None:
    code = "import sys, turbospark; print(sorted(m for m in ('torch', 'transformers', 'turbospark.transformers') if m in sys.modules))"
    done = run_python("-c", code)
    assert done.stdout == "[]\n", done.stderr


def test_a_configuration_warning_points_at_the_users_line(tmp_path: Any) -> None:
    # Raised by the recorder the capture builds, three package frames and
    # contextlib's __enter__ below the user's `with` line.
    model = build("mixtral")
    with pytest.warns(RuntimeWarning) as caught:
        with capture(model, tmp_path / "c.json", pilot="next"):
            model(PROMPT[:, :2])
    assert [(str(w.message), w.filename) for w in caught] == [
        ("pilot='next' with trace=False: the predictions can never be scored (pilot recall compares them with "
         "the trace); pass trace=True", __file__)
    ]


NO_NORM = ("the pilot probe needs the pre-MoE norm of decoder layer 1 (MixtralDecoderLayer); it has none of "
           "pre_feedforward_layernorm, pre_ff_layernorm, ffn_norm, post_attention_layernorm")


@pytest.mark.parametrize("from_env", [False, True])
def test_a_refused_probe_writes_nothing_and_leaves_an_existing_file_alone(
    tmp_path: Any, monkeypatch: Any, capfd: Any, from_env: bool
) -> None:
    from turbospark.transformers import is_capturing

    model = build("mixtral")
    layer = model.model.layers[1]
    layer.odd_norm = layer.post_attention_layernorm  # a norm under a name the probe does not know
    del layer.post_attention_layernorm
    path = tmp_path / "c.json"
    path.write_text("an earlier capture")
    before = _hooks(model)
    if from_env:
        monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(path))
        monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "1")
        monkeypatch.setenv("TURBOSPARK_PILOT_PROBE", "next")
    capfd.readouterr()
    with pytest.raises(ValueError) as caught:
        with capture(model) if from_env else capture(model, path, trace=True, pilot="next"):
            raise AssertionError("the block must not run")
    assert str(caught.value) == NO_NORM
    assert path.read_text() == "an earlier capture" and sorted(os.listdir(tmp_path)) == ["c.json"]
    assert capfd.readouterr().err == ""
    assert _hooks(model) == before and "generate" not in model.__dict__ and not is_capturing(model)


def test_jamba_next_probe_predicts_from_its_pre_ff_layernorm(tmp_path: Any) -> None:
    model = build("jamba")  # Mamba, attention, Mamba; all routed
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="next"):
        model(PROMPT[:, :3])
    doc = json.loads(path.read_text())
    assert "pilot_distance" not in doc and [len(row) for row in doc["pred"]] == [0, 6, 6]
    residual = {}
    handles = [model.model.layers[i].pre_ff_layernorm.register_forward_pre_hook(
        lambda m, a, i=i: residual.setdefault(i, a[0])) for i in (0, 1)]
    with torch.no_grad():
        model(PROMPT[:, :3])
    for handle in handles:
        handle.remove()
    for source in (0, 1):
        target = model.model.layers[source + 1]
        with torch.no_grad():
            _, _, ids = target.feed_forward.router(target.pre_ff_layernorm(residual[source]).reshape(-1, 32))
        assert doc["pred"][source + 1] == ids.reshape(-1).tolist()


def test_an_instance_generate_override_is_followed_and_put_back(tmp_path: Any) -> None:
    model = build("mixtral")
    calls = []

    def my_generate(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["max_new_tokens"])
        return type(model).generate(model, *args, **kwargs)

    model.generate = my_generate
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        assert model.generate is not my_generate
        out = model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4,
                             min_new_tokens=4, do_sample=False)
    assert model.__dict__["generate"] is my_generate and calls == [4]
    assert not {"_prefill", "_get_stopping_criteria", "_validate_generation_mode"} & set(model.__dict__)
    result = verify(model, path, out, torch.ones_like(PROMPT))
    assert (result.ok, result.passes) == (True, 9)
    # A second capture wraps the same override again and puts it back again.
    with capture(model, tmp_path / "d.json"):
        model.generate(input_ids=PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert model.__dict__["generate"] is my_generate and calls == [4, 2]


@pytest.mark.parametrize("device_path", [False, True])
def test_reads_inside_the_block_show_every_row_recorded_so_far(tmp_path: Any, monkeypatch: Any, device_path: bool) -> None:
    from turbospark.transformers import _sink

    if device_path:
        monkeypatch.setattr(_sink, "uses_device_path", lambda device: True)
    model = build("mixtral")
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="next") as rec:
        model(PROMPT)
        assert rec.passes.tolist() == [6, 6, 6]
        assert rec.counts.sum(axis=1).tolist() == [12, 12, 12]
        assert [rec.trace(i).shape for i in range(3)] == [(6, 2)] * 3
        assert [rec.predictions(i).shape for i in range(3)] == [(0, 2), (6, 2), (6, 2)]
        model(PROMPT[:, :2])
        assert rec.passes.tolist() == [8, 8, 8]
        inside = ([rec.trace(i) for i in range(3)], rec.counts.copy())
    cap = turbospark.load(path)
    for layer in range(3):
        np.testing.assert_array_equal(inside[0][layer], cap.trace[layer])
    np.testing.assert_array_equal(inside[1], cap.counts)
    # After the block the reads still hold everything.
    assert rec.passes.tolist() == [8, 8, 8]


def test_counts_only_reads_show_the_device_counts(tmp_path: Any, monkeypatch: Any) -> None:
    from turbospark.transformers import _sink

    monkeypatch.setattr(_sink, "uses_device_path", lambda device: True)
    model = build("mixtral")
    with capture(model, tmp_path / "c.json") as rec:
        model(PROMPT)
        assert rec.passes.tolist() == [6, 6, 6]
        assert rec.counts.sum(axis=1).tolist() == [12, 12, 12]
    np.testing.assert_array_equal(rec.counts, turbospark.load(tmp_path / "c.json").counts)


def test_trace_and_pilot_with_path_none_override_the_environment(tmp_path: Any, monkeypatch: Any, capfd: Any) -> None:
    model = build("mixtral")
    monkeypatch.chdir(tmp_path)
    for name in ("TURBOSPARK_ROUTER_HIST", "TURBOSPARK_ROUTER_TRACE", "TURBOSPARK_PILOT_PROBE"):
        monkeypatch.delenv(name, raising=False)
    before = _hooks(model)
    # Environment off: the keywords change nothing, nothing is installed or written.
    with capture(model, trace=True, pilot="next") as rec:
        assert rec is None and _hooks(model) == before and "generate" not in model.__dict__
        model(PROMPT)
    assert os.listdir(tmp_path) == [] and capfd.readouterr().err == ""
    path = tmp_path / "env.json"
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(path))
    with capture(model, trace=True) as rec:  # the trace although TURBOSPARK_ROUTER_TRACE is unset
        model(PROMPT[:, :2])
    assert (rec.trace_enabled, rec.pilot_enabled(), rec.path) == (True, False, str(path))
    assert list(json.loads(path.read_text())) == ["num_layers", "num_experts", "top_k", "counts", "trace", "seq", "phase",
                                                  "step_passes"]
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "1")
    monkeypatch.setenv("TURBOSPARK_PILOT_PROBE", "self")
    with capture(model, pilot="next") as rec:  # pilot overridden, trace from the environment
        model(PROMPT[:, :2])
    assert (rec.trace_enabled, rec.pilot_offset()) == (True, 1)
    assert [len(row) for row in json.loads(path.read_text())["pred"]] == [0, 4, 4]
    # A probe without the trace is warned about as each setting was made.
    scored = ": the predictions can never be scored (pilot recall compares them with the trace); "
    with pytest.warns(RuntimeWarning) as caught:
        with capture(model, trace=False):
            pass
    assert [str(w.message) for w in caught] == ["TURBOSPARK_PILOT_PROBE is set but trace=False" + scored + "pass trace=True"]
    monkeypatch.delenv("TURBOSPARK_ROUTER_TRACE")
    with pytest.warns(RuntimeWarning) as caught:
        with capture(model, pilot="next"):
            pass
    assert [str(w.message) for w in caught] == [
        "pilot='next' with TURBOSPARK_ROUTER_TRACE unset" + scored + "set TURBOSPARK_ROUTER_TRACE=1 or pass trace=True"]
    monkeypatch.setenv("TURBOSPARK_ROUTER_TRACE", "1")
    monkeypatch.delenv("TURBOSPARK_PILOT_PROBE")
    with capture(model, trace=False) as rec:  # trace off although TURBOSPARK_ROUTER_TRACE is set
        model(PROMPT[:, :2])
    assert (rec.trace_enabled, rec.pilot_enabled()) == (False, False)
    assert list(json.loads(path.read_text())) == ["num_layers", "num_experts", "top_k", "counts", "seq", "phase",
                                                  "step_passes"]


class _StopRow:
    """A stopping criterion: finishes batch row ``row`` once it has ``after`` generated tokens."""

    def __init__(self, prompt: int, row: int, after: int) -> None:
        self.prompt, self.row, self.after = prompt, row, after

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[self.row] = input_ids.shape[1] - self.prompt >= self.after
        return done


def test_verify_follows_a_stopping_criterion(tmp_path: Any) -> None:
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

    class StopRow(_StopRow, StoppingCriteria):
        pass

    model = build("mixtral")
    ids, mask, lengths = _batch("mixtral")
    path = tmp_path / "c.json"
    criteria = StoppingCriteriaList([StopRow(ids.shape[1], 1, 2)])
    with capture(model, path, trace=True):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             stopping_criteria=criteria)
    # Row 1 stopped at its 2nd generated token (padding after it): 1 decode pass, the others 5.
    assert out[1, ids.shape[1] + 2:].tolist() == [0] * 4
    cap = turbospark.load(path)
    assert cap.seq[0].tolist()[sum(lengths):] == [0, 1, 2, 3] + [0, 2, 3] * 4
    result = verify(model, path, out, mask, stopping_criteria=criteria)
    assert (result.ok, result.passes, result.problems) == (True, sum(lengths) + 16, ())
    wrong = verify(model, path, out, mask)
    assert not wrong.ok and wrong.problems[-1] == (
        "sequence(s) [1] end in padding (token 0) with no EOS: if generate stopped them with a StoppingCriteria or "
        "stop strings, pass the same stopping_criteria=, or stop_strings= and tokenizer=, to verify")


def _full_tokenizer() -> Any:
    """A word-level tokenizer over all 64 ids: 0-3 special, 4 "abcdef", then w05x ... w63x, decoded without spaces.

    (StopStringCriteria reads each token's string after the prefix "abcdef";
    no token string ends another's, so a stop string matches one token.)
    """
    import transformers as hf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[PAD]": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "abcdef": 4, **{f"w{i:02d}x": i for i in range(5, 64)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.Fuse()
    return hf.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="<s>", eos_token="</s>",
                                      unk_token="[UNK]")


def test_verify_follows_stop_strings(tmp_path: Any) -> None:
    model = build("mixtral")
    ids, mask, lengths = _batch("mixtral")
    free = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    # The token row 2 generates third stops it (and any row generating it earlier).
    token = int(free[2, ids.shape[1] + 2])
    assert token >= 5
    tokenizer = _full_tokenizer()
    stop = f"w{token:02d}x"
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             stop_strings=[stop], tokenizer=tokenizer)
    generated = out[:, ids.shape[1]:].tolist()
    fed = [row.index(token) if token in row else 5 for row in generated]
    assert fed[2] <= 2 and max(fed) == 5, fed
    result = verify(model, path, out, mask, stop_strings=[stop], tokenizer=tokenizer)
    assert (result.ok, result.passes, result.problems) == (True, sum(lengths) + sum(fed), ())
    assert not verify(model, path, out, mask).ok
    with pytest.raises(ValueError, match=r"^stop_strings=\['w\d\dx'\] needs the tokenizer generate was given: pass tokenizer=$"):
        verify(model, path, out, mask, stop_strings=[stop])


ASSISTED = ("capture() cannot record assisted generation ({}): the model verifies blocks of candidate tokens per step, "
            "which the capture would record as one decode token; generate without it inside capture()")


def test_assisted_generation_is_refused_naming_the_argument(tmp_path: Any) -> None:
    model = build("mixtral")
    path = tmp_path / "c.json"
    kwargs = dict(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with capture(model, path, trace=True) as rec:
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs, prompt_lookup_num_tokens=3)
        assert str(caught.value) == ASSISTED.format("prompt_lookup_num_tokens=3")
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs, assistant_model=build("mixtral", seed=1))
        assert str(caught.value) == ASSISTED.format("assistant_model=MixtralForCausalLM")
        model.generation_config.prompt_lookup_num_tokens = 2  # a default set on the model counts too
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs)
        assert str(caught.value) == ASSISTED.format("prompt_lookup_num_tokens=2")
        model.generation_config.prompt_lookup_num_tokens = None
        # Refused before the model ran: nothing recorded; a plain generate still records exactly.
        assert rec.passes.tolist() == [0, 0, 0]
        out = model.generate(**kwargs)
    result = verify(model, path, out, torch.ones_like(PROMPT))
    assert (result.ok, result.passes) == (True, 9)
    # Outside a capture, assisted generation is the model's business.
    model.generate(**kwargs, prompt_lookup_num_tokens=3)


BEAMS = ("capture() cannot record beam search ({}): it reorders the batch rows every step (each row continues whichever "
         "beam it is handed), so the sequence tags, which follow batch rows, would follow no beam, and beams it drops "
         "would be recorded as sequences; generate with num_beams=1 inside capture()")


def test_beam_search_is_refused_naming_the_argument(tmp_path: Any) -> None:
    model = build("mixtral")
    path = tmp_path / "c.json"
    kwargs = dict(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4, min_new_tokens=4)
    with capture(model, path, trace=True) as rec:
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs, num_beams=3, do_sample=False)
        assert str(caught.value) == BEAMS.format("num_beams=3")
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs, num_beams=2, do_sample=True)
        assert str(caught.value) == BEAMS.format("num_beams=2, do_sample=True")
        model.generation_config.num_beams = 4  # a default set on the model counts too
        with pytest.raises(ValueError) as caught:
            model.generate(**kwargs, do_sample=False)
        assert str(caught.value) == BEAMS.format("num_beams=4")
        # Refused before the model ran: nothing recorded; num_beams=1 still records exactly.
        assert rec.passes.tolist() == [0, 0, 0]
        out = model.generate(**kwargs, num_beams=1, do_sample=False)
    model.generation_config.num_beams = 1
    result = verify(model, path, out, torch.ones_like(PROMPT))
    assert (result.ok, result.passes) == (True, 9)
    # Outside a capture, beam search is the model's business.
    model.generate(**kwargs, num_beams=3, do_sample=False)


def _compiled(model: Any, how: str) -> Any:
    """``model`` compiled (eager backend: dynamo's tracing without inductor), as a user would: returns what to call."""
    if how == "wrapper":
        return torch.compile(model, backend="eager")
    if how == "method":
        model.compile(backend="eager")
    else:
        model.forward = torch.compile(model.forward, backend="eager")
    return model


@pytest.mark.parametrize("how", ["wrapper", "method", "forward"])
def test_a_model_compiled_and_warmed_up_before_capture_is_recorded_exactly(tmp_path: Any, how: str) -> None:
    from turbospark.transformers import is_capturing

    ids, mask, _ = _batch("mixtral")
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, eos_token_id=[7, 9, 11])

    def run(target: Any, model: Any, path: Any) -> bytes:
        with capture(target, path, trace=True, pilot="next"):
            assert is_capturing(target) and is_capturing(model)
            target.generate(**kwargs)
            with torch.no_grad():
                target(input_ids=ids, attention_mask=mask, position_ids=positions)
        return path.read_bytes()

    plain = build("mixtral")
    eager = run(plain, plain, tmp_path / "eager.json")
    model = build("mixtral")
    target = _compiled(model, how)
    # Warm: the compiled graphs exist before the capture's hooks do.
    target.generate(**kwargs)
    with torch.no_grad():
        target(input_ids=ids, attention_mask=mask, position_ids=positions)
    holder = target if how == "wrapper" else model
    name = "_compiled_call_impl" if how == "method" else "forward"
    compiled_call = holder.__dict__[name]
    assert run(target, model, tmp_path / "compiled.json") == eager
    # The compiled call is put back, and is the one that runs again.
    assert holder.__dict__[name] is compiled_call and not is_capturing(target)


def test_routers_that_stay_silent_are_refused_loudly(tmp_path: Any) -> None:
    model = build("mixtral")
    mlp = model.model.layers[0].mlp
    compiled = torch.compile(mlp.forward, backend="eager")
    # Hidden behind a plain function, so capture cannot set it back to eager.
    mlp.forward = lambda hidden: compiled(hidden)
    kwargs = dict(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=3, min_new_tokens=3, do_sample=False)
    model.generate(**kwargs)
    with torch.no_grad():
        model(PROMPT)
    message = ("capture() recorded nothing of layer(s) [0] during {}: their routers' hooks did not run, as when a graph "
               "torch.compile built before capture() runs the model (dynamo does not guard on hooks); capture the model "
               "uncompiled")
    with capture(model, tmp_path / "c.json", trace=True):
        with pytest.raises(RuntimeError) as caught:
            model.generate(**kwargs)
        assert str(caught.value) == message.format("generate()")
        with pytest.raises(RuntimeError) as caught:
            with torch.no_grad():
                model(PROMPT)
        assert str(caught.value) == message.format("a forward call of MixtralForCausalLM")


def test_a_probe_norm_that_does_not_feed_the_router_is_refused_on_the_first_call(tmp_path: Any) -> None:
    import transformers as hf

    from hf_models import COMMON

    # FlexOlmo normalises after attention (post_attention_layernorm on the attention output) and feeds its
    # MoE block the raw residual: the probe has no pre-MoE norm to run.
    torch.manual_seed(0)
    model = hf.FlexOlmoForCausalLM(hf.FlexOlmoConfig(**COMMON, num_experts=8, num_experts_per_tok=2)).eval()
    path = tmp_path / "c.json"
    with capture(model, path, trace=True, pilot="self"):
        with pytest.raises(RuntimeError) as caught:
            model(PROMPT)
    assert str(caught.value) == (
        "the pilot probe cannot predict layer 0 exactly: its post_attention_layernorm (FlexOlmoRMSNorm) does not "
        "produce the input of its router (model.layers.0.mlp.gate), so the probe would route the wrong activations; "
        "capture without pilot=")
    # Without the probe the same model records exactly.
    with capture(model, path, trace=True):
        out = model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=3, min_new_tokens=3,
                             do_sample=False)
    assert verify(model, path, out, torch.ones_like(PROMPT)).ok


def _looped_model() -> Any:
    """A tiny Inkling2Loop: 4 decoder layers, layers 1 and 2 looped twice per forward (6 layer calls)."""
    import transformers as hf

    from hf_models import COMMON

    config = hf.Inkling2LoopTextConfig(
        **{**COMMON, "num_hidden_layers": 4}, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, head_dim=8, n_layers_per_attn_res_block=1,
        loop_layer_index_start=1, loop_layer_index_end=3, loop_num_passes=2, loop_gate_rank=4, unpadded_vocab_size=64,
        sliding_window_size=8, d_rel=4,
    )
    torch.manual_seed(0)
    return hf.Inkling2LoopForCausalLM(config).eval()


@pytest.mark.parametrize("pilot", [None, "next"])
def test_looped_decoder_layers_are_refused_before_anything_is_written(pilot: Any, tmp_path: Any) -> None:
    model = _looped_model()
    path = tmp_path / "c.json"
    path.write_text("earlier capture")
    with pytest.raises(TypeError) as caught:
        with capture(model, path, trace=True, pilot=pilot):
            pass
    assert str(caught.value) == (
        "Inkling2LoopForCausalLM is not supported: it runs 6 decoder-layer calls per forward "
        "(config.total_num_hidden_layers) over its 4 decoder layers, so looped layers route every token more than "
        "once per forward, and a capture holds one pass per token and layer")
    assert path.read_text() == "earlier capture"
    with pytest.raises(TypeError):
        find_routing(model)


def test_a_router_that_fires_twice_in_one_forward_is_refused_and_nothing_is_written(tmp_path: Any) -> None:
    model = build("mixtral")
    layer = model.model.layers[1]
    once = layer.forward

    def twice(*args: Any, **kwargs: Any) -> Any:
        # A shared layer run twice per forward, as a loop would.
        once(*args, **kwargs)
        return once(*args, **kwargs)

    layer.forward = twice
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        with pytest.raises(RuntimeError) as caught:
            with torch.no_grad():
                model(PROMPT)
    assert str(caught.value) == (
        "capture() cannot record MixtralForCausalLM: the router of decoder layer 1 (model.layers.1.mlp.gate) ran "
        "twice in one forward call (a looped or shared decoder layer routes each token more than once per forward, "
        "and a capture holds one pass per token and layer); the capture is discarded, nothing is written")
    assert not path.exists()
    # The same model without the doubled layer records one pass per token and layer (no false refusal
    # across calls, the inner model called directly included).
    layer.forward = once
    with capture(model, path, trace=True):
        with torch.no_grad():
            model(PROMPT)
            model.model(PROMPT)
        model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=3, min_new_tokens=3,
                       do_sample=False)
    assert [t.shape[0] for t in turbospark.load(path).trace] == [6 + 6 + 6 + 2] * 3
