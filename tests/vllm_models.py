"""Tiny random-weight MoE checkpoints for the vLLM tests, built from transformers config classes (not a test).

``save(name, directory)`` writes a checkpoint vLLM's CPU backend can serve:
head_dim 32 (the CPU attention backend takes 32, 64, 80, ...), float32,
3 decoder layers, 8 experts, top-2, a 128-token vocabulary. The routers'
weights are scaled so each token's top-2 has clear margins: random
routers at their initial scale put experts within float32 rounding of each
other, and vLLM's kernels and transformers' would then break ties
differently. Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as hf

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
ROUTER_SCALE = 40.0

# name -> (config class, model class, extra config, routed layers)
MODELS: dict[str, tuple[Any, Any, dict[str, Any], list[int]]] = {
    # Layer 1 is dense (mlp_only_layers): its rows stay all zero.
    "qwen3_moe": (
        hf.Qwen3MoeConfig,
        hf.Qwen3MoeForCausalLM,
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1]),
        [0, 2],
    ),
    "mixtral": (hf.MixtralConfig, hf.MixtralForCausalLM, dict(num_local_experts=8, num_experts_per_tok=2), [0, 1, 2]),
}
NUM_LAYERS, NUM_EXPERTS, TOP_K = 3, 8, 2


def build(name: str, seed: int = 0) -> Any:
    """The model ``name`` in eval mode, float32, with scaled router weights."""
    config_cls, model_cls, extra, _ = MODELS[name]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**COMMON, **extra)).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                param.mul_(ROUTER_SCALE)
    return model


def save(name: str, directory: str) -> str:
    """Write model ``name`` to ``directory`` with ``save_pretrained``; returns the directory."""
    build(name).save_pretrained(directory)
    return directory
