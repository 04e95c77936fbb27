"""Tiny random-weight transformers MoE models for the transformers tests (a helper module, not a test).

``build(name)`` returns the model for each architecture the suite verifies,
from ``tiny_models`` (the one config builder, shared with ``vllm_models``):
every model has 3 decoder layers, 8 experts (16 for the group-limited ones),
top-2, and token ids 0 (pad), 1 (bos), 2 (eos) inside a 64-token vocabulary.
"""

from __future__ import annotations

from typing import Any

import transformers as hf

import tiny_models
from tiny_models import ARCHITECTURES, COMMON, TOKENS, config

__all__ = ["ARCHITECTURES", "COMMON", "TOKENS", "WORDS", "build", "config", "save_checkpoint", "tokenizer"]


def build(name: str, seed: int = 0) -> Any:
    """A tiny random-weight model of architecture ``name``, in eval mode, float32, on CPU."""
    model = tiny_models.build(name, seed)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


WORDS = ["the", "a", "expert", "router", "token", "layer", "model", "picks", "each", "of", "mixture", "sparse"]


def tokenizer() -> Any:
    """A word-level tokenizer over ``WORDS`` (ids 0-3 special), built offline with the tokenizers library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "<s>": 1, "</s>": 2, "[UNK]": 3}
    vocab.update({word: 4 + i for i, word in enumerate(WORDS)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return hf.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", bos_token="<s>", eos_token="</s>", unk_token="[UNK]"
    )


def save_checkpoint(name: str, folder: Any) -> Any:
    """Write a tiny ``name`` model and the tokenizer to ``folder`` with save_pretrained; returns the model."""
    model = build(name)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return model
