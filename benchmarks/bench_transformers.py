"""The cost of ``turbospark.transformers.capture`` inside a real ``generate``, in one process.

Run: ``pip install '.[transformers]' && python benchmarks/bench_transformers.py [--repeats 7] [--new-tokens 128]``.

Subject: ``model.generate`` of 128 new tokens (greedy, ``min_new_tokens``
so every run decodes the same number) at batch 1 on CPU, on a tiny
random-weight Qwen3-MoE built from its config class (4 decoder layers, 8
experts, top-2, hidden size 64), inside ``capture(model, path, trace=True)``.
Comparison: the same call with no hook installed. The third row adds the
pilot probe (``pilot="next"``: one extra norm and router per routed layer
and token). Runs are interleaved (none, capture, capture+probe, none, ...),
one torch thread, and the minimum of the repeats is kept. Target: capture
<= 1.05x the bare generate.

On a shared, loaded machine whole-run minima still wander by several percent
(rows can even come out in the wrong order), so the script also measures the
capture's own time directly: one more run with a clock around each of the
capture's per-call functions (the model pre-hook, the sink's selections,
predictions and flushes), reported per generated token.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import transformers as hf

from turbospark.transformers import capture

TARGET = 1.05


def tiny_qwen3_moe() -> Any:
    torch.manual_seed(0)
    config = hf.Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    return hf.Qwen3MoeForCausalLM(config).eval()


def _time_inside(model: Any, path: str, generate: Callable[[], None], pilot: Any) -> float:
    """Seconds spent inside the capture's per-call functions during one captured generate."""
    from turbospark.transformers import _capture, _sink

    spent = [0.0]
    originals = []

    def clocked(owner: Any, name: str) -> None:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    for owner, name in [(_capture._Session, "_on_model_call"), (_sink.Sink, "selections"),
                        (_sink.Sink, "predictions")]:
        clocked(owner, name)
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")
    try:
        with capture(model, path, trace=True, pilot=pilot):
            generate()
    finally:
        sys.stderr = stderr
        for owner, name, original in originals:
            setattr(owner, name, original)
    return spent[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_qwen3_moe()
    prompt = torch.tensor([[1, 17, 42, 99, 7, 23, 64, 5]])
    mask = torch.ones_like(prompt)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "capture.json")

    def generate() -> None:
        with torch.no_grad():
            model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=args.new_tokens,
                           min_new_tokens=args.new_tokens, do_sample=False)

    def bare() -> None:
        generate()

    def captured() -> None:
        with capture(model, path, trace=True):
            generate()

    def probed() -> None:
        with capture(model, path, trace=True, pilot="next"):
            generate()

    subjects: dict[str, Callable[[], None]] = {"no hooks": bare, "capture(trace)": captured, "capture(trace, pilot)": probed}
    best = {name: float("inf") for name in subjects}
    devnull = open(os.devnull, "w")
    stderr = sys.stderr
    for _ in range(2):
        bare()  # warm-up: first-call allocations, lazy imports
    for _ in range(args.repeats):
        for name, run in subjects.items():
            sys.stderr = devnull  # the recorder's "[router-hist] wrote" line, once per run
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
            sys.stderr = stderr
    base = best["no hooks"]
    print(f"generate {args.new_tokens} new tokens, tiny Qwen3-MoE (4 layers, 8 experts, top-2), batch 1, CPU, "
          f"1 thread, min of {args.repeats} interleaved runs")
    for name, seconds in best.items():
        print(f"  {name:<24} {seconds * 1e3:8.1f} ms  {seconds / base:5.3f}x  "
              f"({(seconds - base) / args.new_tokens * 1e6:+.0f} us per token)")
    for pilot in (None, "next"):
        spent = _time_inside(model, path, generate, pilot)
        print(f"  time inside the capture's own functions, pilot={pilot}: {spent / args.new_tokens * 1e6:.0f} us per token "
              f"({spent / base:.1%} of the bare generate)")
    ratio = best["capture(trace)"] / base
    print(f"capture(trace) vs no hooks: {ratio:.3f}x (target <= {TARGET}x): {'met' if ratio <= TARGET else 'MISSED'}")
    print(f"pilot probe on top: {(best['capture(trace, pilot)'] - best['capture(trace)']) / args.new_tokens * 1e6:.0f} us "
          f"per token ({best['capture(trace, pilot)'] / best['capture(trace)']:.3f}x the capture without it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
