"""``turbospark record``: generate with a local checkpoint under ``capture`` (the analysis is the CLI's)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from turbospark.transformers._capture import capture

__all__ = ["record"]


def _progress(message: str) -> None:
    print(f"[turbospark record] {message}", file=sys.stderr, flush=True)


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    with open(args.prompts, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


def _load(model_dir: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # local_files_only: a checkpoint already on disk, never a download.
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def record(args: argparse.Namespace) -> bool:
    """Run the generation and write ``args.output``; False (message on stderr) when it cannot be done."""
    if not os.path.isdir(args.model_dir):
        print(f"turbospark record: {args.model_dir} is not a local checkpoint folder", file=sys.stderr)
        return False
    try:
        prompts = _prompts(args)
    except OSError as exc:
        print(f"turbospark record: cannot read {args.prompts}: {exc.strerror}", file=sys.stderr)
        return False
    if not prompts:
        print(f"turbospark record: {args.prompts} holds no prompt", file=sys.stderr)
        return False
    _progress(f"loading {args.model_dir}")
    try:
        tokenizer, model = _load(args.model_dir)
    except (OSError, ValueError) as exc:
        print(f"turbospark record: cannot load {args.model_dir}: {exc}", file=sys.stderr)
        return False
    batches = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    try:
        with capture(model, args.output, trace=args.trace, pilot=args.pilot):
            for number, batch in enumerate(batches, 1):
                inputs = tokenizer(batch, return_tensors="pt", padding=True)
                with torch.no_grad():
                    # Greedy, whatever the checkpoint's generation_config says: capture() refuses beam search.
                    out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, num_beams=1)
                _progress(
                    f"batch {number}/{len(batches)}: {len(batch)} prompt(s), "
                    f"{out.shape[1] - inputs['input_ids'].shape[1]} new tokens"
                )
    except TypeError as exc:
        print(f"turbospark record: {exc}", file=sys.stderr)
        return False
    return True
