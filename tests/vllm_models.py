"""Tiny random-weight MoE checkpoints for the vLLM tests, built by ``tiny_models`` (not a test).

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

import tiny_models

#: What vLLM's CPU backend serves, over ``tiny_models.COMMON`` (and each architecture's own settings).
OVERRIDES: dict[str, Any] = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                                 tie_word_embeddings=False)
#: Per architecture, beyond ``OVERRIDES``.
MODEL_OVERRIDES: dict[str, dict[str, Any]] = {"qwen3_moe": dict(moe_intermediate_size=32)}
ROUTER_SCALE = 40.0

# name -> tiny_models.ARCHITECTURES[name]: (config class, model class, extra config, routed layers, experts, top_k).
# Qwen3-MoE's layer 1 is dense (mlp_only_layers): its rows stay all zero.
MODELS: dict[str, tuple[Any, ...]] = {name: tiny_models.ARCHITECTURES[name] for name in ("qwen3_moe", "mixtral")}
NUM_LAYERS, NUM_EXPERTS, TOP_K = 3, 8, 2


def config(name: str) -> Any:
    """The config of model ``name``, as vLLM serves it."""
    return tiny_models.config(name, **OVERRIDES, **MODEL_OVERRIDES.get(name, {}))


def build(name: str, seed: int = 0) -> Any:
    """The model ``name`` in eval mode, float32, with scaled router weights."""
    model = tiny_models.build(name, seed, **OVERRIDES, **MODEL_OVERRIDES.get(name, {}))
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                param.mul_(ROUTER_SCALE)
    return model


def save(name: str, directory: str) -> str:
    """Write model ``name`` to ``directory`` with ``save_pretrained``; returns the directory."""
    build(name).save_pretrained(directory)
    return directory
