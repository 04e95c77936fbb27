"""llama.cpp itself places exactly the tensors ``turbospark llama-plan``'s printed ``-ot`` names."""

from __future__ import annotations

import re

import pytest

from conftest import require_module

import llama_models

llama_cpp = require_module("llama_cpp")
require_module("gguf")

from turbospark.cli._main import main  # noqa: E402
from turbospark.llama_cpp import capture, override_tensors  # noqa: E402
from turbospark.offload import llama_plan as lp  # noqa: E402

PROJECTIONS = ("gate", "up", "down")


def load_with(gguf: str, pattern: str) -> dict[str, str]:
    with override_tensors([(pattern, "CPU")]) as loaded:
        llm = llama_cpp.Llama(model_path=gguf, n_ctx=32, verbose=False)
        del llm
    return loaded.overridden


def test_printed_override_places_exactly_the_cpu_layers(tmp_path, tmp_path_factory, capfd) -> None:
    built = llama_models.gguf_model("qwen3_moe", tmp_path_factory)
    sizes = lp.expert_tensor_bytes(str(built.gguf), built.layers)
    per_layer = 3 * built.experts * 16 * 32 * 4  # gate, up, down: [32, 16, 8] f32 each
    assert sizes == (per_layer,) * built.layers
    path = tmp_path / "cap.json"
    with capture(path, trace=True):
        llama_cpp.Llama(model_path=str(built.gguf), n_ctx=128, n_batch=64, logits_all=True, type_k=0, type_v=0,
                        flash_attn=False, n_threads=1, verbose=False).eval(list(range(3, 67)))
    assert main(["llama-plan", str(path), "--gguf", str(built.gguf), "--vram", str(per_layer), "--ubatch", "32"]) == 0
    out = capfd.readouterr().out
    found = re.search(r"-ot '([^']+)=CPU'", out)
    assert found is not None, out
    cpu = [int(x) for x in re.search(r"CPU layers: ([0-9, ]+)", out).group(1).split(", ")]
    assert len(cpu) == built.layers - 1
    expected = {f"blk.{layer}.ffn_{p}_exps.weight": "CPU" for layer in cpu for p in PROJECTIONS}
    assert load_with(str(built.gguf), found.group(1)) == expected
    # llama.cpp's own --n-cpu-moe 2 patterns (common.h llm_add_n_cpu_ffn_overrides) place layers 0 and 1.
    with override_tensors([(rf"blk\.{i}{lp.EXPS_REGEX}", "CPU") for i in range(2)]) as loaded:
        llama_cpp.Llama(model_path=str(built.gguf), n_ctx=32, verbose=False)
    assert loaded.overridden == {f"blk.{layer}.ffn_{p}_exps.weight": "CPU" for layer in (0, 1) for p in PROJECTIONS}


def test_unknown_buffer_type() -> None:
    with pytest.raises(ValueError, match=r"unknown buffer type 'GPU9' for 'blk'; available: CPU"):
        with override_tensors([("blk", "GPU9")]):
            pass
