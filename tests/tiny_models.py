"""Tiny random-weight transformers MoE models: one config builder, with per-engine overrides (not a test).

``ARCHITECTURES`` holds each architecture's classes and MoE settings;
``config(name, **overrides)`` builds its config from ``COMMON`` (the
transformers tests' shape: 3 decoder layers, 8 experts (16 for the
group-limited ones), top-2, token ids 0 (pad), 1 (bos), 2 (eos) inside a
64-token vocabulary), then the architecture's settings, then an engine's
``overrides`` (``vllm_models.OVERRIDES``: the shape vLLM's CPU backend
serves). ``build`` seeds torch and returns the model in eval mode, float32,
on CPU. Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as hf

TOKENS = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
COMMON = dict(
    TOKENS,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# MLA attention wants as many key/value heads as query heads once a mask is given.
DEEPSEEK = dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)

# name -> (config class, model class, extra config, routed layers, experts, top_k)
ARCHITECTURES: dict[str, tuple[Any, Any, dict[str, Any], list[int], int, int]] = {
    "mixtral": (hf.MixtralConfig, hf.MixtralForCausalLM, dict(num_local_experts=8, num_experts_per_tok=2), [0, 1, 2], 8, 2),
    "qwen2_moe": (
        hf.Qwen2MoeConfig,
        hf.Qwen2MoeForCausalLM,
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16),
        [0, 1, 2],
        8,
        2,
    ),
    # Layer 1 dense (mlp_only_layers): the pilot crosses it.
    "qwen3_moe": (
        hf.Qwen3MoeConfig,
        hf.Qwen3MoeForCausalLM,
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1], head_dim=8),
        [0, 2],
        8,
        2,
    ),
    "olmoe": (hf.OlmoeConfig, hf.OlmoeForCausalLM, dict(num_experts=8, num_experts_per_tok=2), [0, 1, 2], 8, 2),
    # Group-limited routing (4 groups, 2 kept), dense first layer.
    "deepseek_v3": (
        hf.DeepseekV3Config,
        hf.DeepseekV3ForCausalLM,
        dict(DEEPSEEK, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
             moe_intermediate_size=16, n_shared_experts=1),
        [1, 2],
        16,
        3,
    ),
    "gpt_oss": (hf.GptOssConfig, hf.GptOssForCausalLM, dict(num_local_experts=8, num_experts_per_tok=2, head_dim=8, sliding_window=8), [0, 1, 2], 8, 2),
    "granitemoe": (hf.GraniteMoeConfig, hf.GraniteMoeForCausalLM, dict(num_local_experts=8, num_experts_per_tok=2), [0, 1, 2], 8, 2),
    "glm4_moe": (
        hf.Glm4MoeConfig,
        hf.Glm4MoeForCausalLM,
        dict(n_routed_experts=16, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
             moe_intermediate_size=16, head_dim=8),
        [1, 2],
        16,
        2,
    ),
    # Hybrid: layers 0 and 2 Mamba, layer 1 attention, every layer routed;
    # its pre-MoE norm is called pre_ff_layernorm.
    "jamba": (
        hf.JambaConfig,
        hf.JambaForCausalLM,
        dict(num_experts=8, num_experts_per_tok=2, expert_layer_period=1, expert_layer_offset=0, attn_layer_period=2,
             attn_layer_offset=1, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2, mamba_dt_rank=4),
        [0, 1, 2],
        8,
        2,
    ),
}


def config(name: str, **overrides: Any) -> Any:
    """The tiny config of architecture ``name``: ``COMMON``, its own settings, then ``overrides``."""
    config_class, _, extra, *_ = ARCHITECTURES[name]
    return config_class(**{**COMMON, **extra, **overrides})


def build(name: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random-weight model of architecture ``name`` (``config(name, **overrides)``), in eval mode."""
    _, model_class, *_ = ARCHITECTURES[name]
    torch.manual_seed(seed)
    return model_class(config(name, **overrides)).eval()
