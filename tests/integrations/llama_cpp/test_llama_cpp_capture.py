"""turbospark.llama_cpp.capture against transformers: tiny Qwen3-MoE and Mixtral GGUFs, teacher-forced.

Every comparison is exact: the ids llama.cpp's graph routes (``ffn_moe_topk``)
equal the ids transformers' routers pick (turbospark.transformers.capture),
row for row and rank for rank, with llama.cpp's KV cache in F32 and flash
attention off (the conditions under which its attention matches transformers'
fp32 bit for bit often enough that no near tie flips; docs/llama_cpp.md). The
one allowance: two ranks of a row may be swapped where transformers' own router
logits for those two experts are within ``NEAR_TIE`` of each other, well inside
the two engines' disagreement on router logits (up to ~5e-3 on this Qwen3-MoE;
docs/llama_cpp.md). The Qwen3-MoE model has one such row: layer 2, token 18,
experts 4 and 7, 9.1e-5 apart; a smaller ``NEAR_TIE`` fails there.
"""

from __future__ import annotations

import ctypes
import itertools
import json

import numpy as np
import pytest

from conftest import require_module

import llama_models

llama_cpp = require_module("llama_cpp")
torch = require_module("torch")
require_module("transformers")

from turbospark.capture.reader import load  # noqa: E402
from turbospark.llama_cpp import LayoutError, capture  # noqa: E402
from turbospark.llama_cpp import _ggml  # noqa: E402
from turbospark.transformers import capture as hf_capture  # noqa: E402

MODELS = ["qwen3_moe", "mixtral"]
N_TOKENS = 24


@pytest.fixture(params=MODELS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> llama_models.Built:
    return llama_models.gguf_model(request.param, tmp_path_factory)


def tokens_for(built: llama_models.Built, n: int = N_TOKENS, seed: int = 1) -> list[int]:
    rng = np.random.default_rng(seed)
    vocab = len(llama_models.bpe_tokenizer())
    return rng.integers(3, vocab, size=n).tolist()


#: Router logits closer than this are a near tie: their rank order may differ between the engines.
NEAR_TIE = 1e-4


class Routed(list[np.ndarray]):
    """Per layer, the (tokens, top_k) ids transformers' routers picked; ``logits``: their router logits."""

    logits: list[np.ndarray]


_reference: dict[tuple[str, tuple[int, ...]], Routed] = {}


def reference(built: llama_models.Built, tokens: list[int], tmp_path: object) -> Routed:
    """transformers' router top-k per layer for ``tokens`` (one forward pass, teacher-forced), and the
    router logits behind them (a forward hook on each layer's router, whose first output they are)."""
    key = (built.name, tuple(tokens))
    if key not in _reference:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(built.folder, local_files_only=True).eval()
        logits: list[np.ndarray] = []
        routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
        assert len(routers) == built.layers, [type(m).__name__ for m in routers]
        hooks = [m.register_forward_hook(lambda _m, _i, out: logits.append(out[0].detach().double().numpy()))
                 for m in routers]
        with hf_capture(model, f"{tmp_path}/hf.json", trace=True) as recorder, torch.no_grad():
            model(torch.tensor([tokens]))
            routed = Routed(recorder.trace(layer).astype(np.int64) for layer in range(built.layers))
        for hook in hooks:
            hook.remove()
        routed.logits = logits
        _reference[key] = routed
    return _reference[key]


def make_llama(built: llama_models.Built, **overrides: object) -> object:
    settings = dict(model_path=str(built.gguf), n_ctx=128, n_batch=64, n_ubatch=64, logits_all=True,
                    type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
                    n_threads=1, n_threads_batch=1, verbose=False)
    settings.update(overrides)
    return llama_cpp.Llama(**settings)


def same_ids(got: np.ndarray, want: np.ndarray, logits: np.ndarray, what: str = "") -> None:
    """Row for row, rank for rank equal; where two ranks differ, the experts there are a near tie in the
    reference's own router ``logits`` (rows, experts) and each row still holds the same experts."""
    assert got.shape == want.shape and logits.shape[0] == want.shape[0], what
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(want, axis=1), err_msg=what)
    for row in np.flatnonzero((got != want).any(axis=1)).tolist():
        differ = got[row] != want[row]
        gap = np.abs(logits[row, got[row][differ]] - logits[row, want[row][differ]])
        assert (gap < NEAR_TIE).all(), (what, row, got[row].tolist(), want[row].tolist(), gap.tolist())


def traces(path: object, layers: int) -> list[np.ndarray]:
    cap = load(path)
    assert cap.trace is not None
    return [np.asarray(cap.trace[layer], dtype=np.int64) for layer in range(layers)]


@pytest.mark.parametrize("mode", ["batched", "incremental", "ubatches"])
def test_ids_equal_transformers(built: llama_models.Built, mode: str, tmp_path: object) -> None:
    tokens = tokens_for(built)
    expected = reference(built, tokens, tmp_path)
    path = f"{tmp_path}/cap.json"
    with capture(path, trace=True) as cap:
        llm = make_llama(built, **({"n_ubatch": 7} if mode == "ubatches" else {}))
        if mode == "incremental":
            for token in tokens:
                llm.eval([token])
        else:
            llm.eval(tokens)  # one llama_decode; with n_ubatch=7 llama.cpp splits it into 4 ubatches
        assert cap.contexts[0].exact and cap.contexts[0].n_ubatch == (7 if mode == "ubatches" else 64)
    got = traces(path, built.layers)
    for layer in range(built.layers):
        assert got[layer].shape == (N_TOKENS, built.top_k)
        same_ids(got[layer], expected[layer], expected.logits[layer], f"{built.name} layer {layer} {mode}")
    # Engine steps: one per llama_decode call (its ubatches together).
    per_decode = [1] * N_TOKENS if mode == "incremental" else [N_TOKENS]
    assert load(path).step_passes.tolist() == [per_decode] * built.layers
    with open(path) as handle:
        document = json.load(handle)
    assert document["num_layers"] == built.layers and document["num_experts"] == built.experts
    assert document["top_k"] == built.top_k


def test_last_layer_only_for_output_tokens(built: llama_models.Built, tmp_path: object) -> None:
    """Without logits_all only the batch's last token has an output: llama.cpp routes its last layer alone."""
    tokens = tokens_for(built)
    expected = reference(built, tokens, tmp_path)
    path = f"{tmp_path}/cap.json"
    with capture(path, trace=True) as cap:
        llm = make_llama(built, logits_all=False)
        llm.eval(tokens)
        assert cap.passes.tolist() == [N_TOKENS] * (built.layers - 1) + [1]
    assert load(path).step_passes.tolist() == [[N_TOKENS]] * (built.layers - 1) + [[1]]
    got = traces(path, built.layers)
    for layer in range(built.layers - 1):
        same_ids(got[layer], expected[layer], expected.logits[layer])
    same_ids(got[-1], expected[-1][-1:], expected.logits[-1][-1:])  # the one output token, never the others


def test_generate_tags_sequences_and_phases(built: llama_models.Built, tmp_path: object) -> None:
    """Two completions: each is a sequence, its prompt tokens "prompt" (0), its fed-back tokens "decode" (1)."""
    path = f"{tmp_path}/cap.json"
    prompts = [tokens_for(built, 6, seed=2), tokens_for(built, 5, seed=3)]
    with capture(path, trace=True):
        llm = make_llama(built, logits_all=False)
        for prompt in prompts:
            generator = llm.generate(prompt, top_k=1, temp=0.0, reset=True)
            assert len(list(itertools.islice(generator, 4))) == 4
            generator.close()
    cap = load(path)
    assert cap.seq is not None and cap.phase is not None
    # Layer 0 routes every evaluated token: 6 prompt, then generate feeds back each sampled token
    # (the generator was closed after 4 were taken: 3 were fed back), then the second prompt.
    seq0, phase0 = cap.seq[0].tolist(), cap.phase[0].tolist()
    assert seq0 == [0] * 9 + [1] * 8
    assert phase0 == [0] * 6 + [1] * 3 + [0] * 5 + [1] * 3
    # The last layer: only output tokens (each prompt's last, each decode token).
    assert cap.seq[-1].tolist() == [0] * 4 + [1] * 4
    assert cap.phase[-1].tolist() == [0, 1, 1, 1, 0, 1, 1, 1]


def test_two_sequences_in_one_batch(built: llama_models.Built, tmp_path: object) -> None:
    """A low-level batch holding two sequences (kv_unified): rows tagged per sequence, ids equal each alone."""
    first, second = tokens_for(built, 8, seed=4), tokens_for(built, 5, seed=5)
    expected = [reference(built, first, tmp_path), reference(built, second, tmp_path)]
    path = f"{tmp_path}/cap.json"
    low = llama_cpp.llama_cpp
    with capture(path, trace=True):
        model_params = low.llama_model_default_params()
        model = low.llama_model_load_from_file(str(built.gguf).encode(), model_params)
        params = low.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 64, 64, 64, 2
        params.kv_unified = True
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        params.flash_attn_type = low.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.n_threads = params.n_threads_batch = 1
        ctx = low.llama_init_from_model(model, params)
        batch = low.llama_batch_init(16, 0, 2)
        rows = [(t, i, 0) for i, t in enumerate(first)] + [(t, i, 1) for i, t in enumerate(second)]
        for index, (token, pos, seq) in enumerate(rows):
            batch.token[index], batch.pos[index], batch.n_seq_id[index] = token, pos, 1
            batch.seq_id[index][0] = seq
            batch.logits[index] = True
        batch.n_tokens = len(rows)
        assert low.llama_decode(ctx, batch) == 0
        low.llama_batch_free(batch)
        low.llama_free(ctx)
        low.llama_model_free(model)
    cap = load(path)
    for layer in range(built.layers):
        assert cap.seq[layer].tolist() == [0] * 8 + [1] * 5
        ids = np.asarray(cap.trace[layer], dtype=np.int64)
        same_ids(ids[:8], expected[0][layer], expected[0].logits[layer])
        same_ids(ids[8:], expected[1][layer], expected[1].logits[layer])


def test_router_logits_row(built: llama_models.Built, tmp_path: object) -> None:
    """router_logits=(layer, pass) keeps ffn_moe_logits' row of that pass: transformers' router logits.

    The values agree to float rounding of the attention before them (Mixtral within 2e-5, Qwen3-MoE,
    whose q/k norms add rounding, within 5e-3), not bit for bit: the check is a tolerance.
    """
    from transformers import AutoModelForCausalLM

    tokens = tokens_for(built)
    path = f"{tmp_path}/cap.json"
    with capture(path, trace=True, router_logits=(1, 5)):
        make_llama(built).eval(tokens)
    row = load(path).router_logits
    assert row is not None and (row.layer, row.pass_index) == (1, 5)
    model = AutoModelForCausalLM.from_pretrained(built.folder, local_files_only=True).eval()
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_router_logits=True)
    want = out.router_logits[1].reshape(-1, built.experts)[5].numpy()
    np.testing.assert_allclose(np.asarray(row.values, dtype=np.float32), want, rtol=0, atol=5e-3)


def test_refusals(built: llama_models.Built, tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="cannot run a pilot probe"):
        with capture(f"{tmp_path}/a.json", pilot="next"):
            pass
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", f"{tmp_path}/env.json")
    monkeypatch.setenv("TURBOSPARK_PILOT_PROBE", "1")
    with pytest.raises(ValueError, match="TURBOSPARK_PILOT_PROBE is set"):
        with capture():
            pass
    monkeypatch.delenv("TURBOSPARK_PILOT_PROBE")
    with capture(f"{tmp_path}/b.json"):
        with pytest.raises(ValueError, match="speculative decoding"):
            llama_cpp.Llama(model_path=str(built.gguf), draft_model=object(), verbose=False)
        with pytest.raises(ValueError, match="n_seq_max=2 and kv_unified=False"):
            low = llama_cpp.llama_cpp
            model = low.llama_model_load_from_file(str(built.gguf).encode(), low.llama_model_default_params())
            params = low.llama_context_default_params()
            params.n_seq_max, params.kv_unified = 2, False
            try:
                low.llama_init_from_model(model, params)
            finally:
                low.llama_model_free(model)
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()  # type: ignore[operator]


def test_layout_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    bound = _ggml.ggml()
    assert bound.version and ctypes.sizeof(_ggml.GgmlTensor) == 336
    monkeypatch.setattr(_ggml, "_OBJECT_SIZE", 40)
    with pytest.raises(LayoutError, match=r"ggml_tensor_overhead\(\) is 368 bytes, the declared struct gives 376"):
        _ggml.ggml.__wrapped__()


def test_off_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURBOSPARK_ROUTER_HIST", raising=False)
    decode = llama_cpp.llama_cpp.llama_decode
    with capture() as cap:
        assert cap is None and llama_cpp.llama_cpp.llama_decode is decode
