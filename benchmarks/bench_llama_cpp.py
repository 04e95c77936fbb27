"""The per-step cost of ``turbospark.llama_cpp.capture`` in llama.cpp decode, in one process.

Run: ``pip install '.[llama-cpp]' && python benchmarks/bench_llama_cpp.py MODEL.gguf [--steps 128] [--repeats 5]``
(any MoE GGUF; the tests' tiny models are built by ``tests/llama_cpp/llama_models.py``, e.g.
``python benchmarks/bench_llama_cpp.py --build qwen3_moe`` with ``TURBOSPARK_LLAMA_CPP_SRC`` set).

Subject: ``Llama.eval([token])`` ``--steps`` times (one decode step each,
batch 1, one thread, F32 KV cache, flash attention off), inside
``capture(path)`` (counts only) and ``capture(path, trace=True)``.
Comparison: the same steps with no capture (no eval callback: llama.cpp
computes each graph in one piece). Runs are interleaved (none, counts, trace,
none, ...) and the minimum of the repeats is kept. Printed: ms per step,
the ratio to the bare decode and the added ms per routed layer per step.

What the added time is: with an eval callback llama.cpp asks it about every
graph node (a Python call per node), and each tensor taken
(``ffn_moe_topk-<layer>``) ends a graph split and synchronises (on CPU, the
thread pool stops and restarts) before the ids are copied out and recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Optional

import llama_cpp

from turbospark.llama_cpp import capture


def load(model: str) -> Any:
    return llama_cpp.Llama(model_path=model, n_ctx=256, n_batch=64, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False, n_threads=1, n_threads_batch=1,
                           verbose=False)


def run(model: str, steps: int, mode: Optional[str], folder: str) -> float:
    """Seconds for ``steps`` decode steps after a 4-token prompt, under ``mode`` (None: no capture)."""
    tokens = [5 + (i * 7) % 50 for i in range(steps)]
    if mode is None:
        llm = load(model)
        llm.eval([3, 4, 5, 6])
        start = time.perf_counter()
        for token in tokens:
            llm.eval([token])
        return time.perf_counter() - start
    with capture(os.path.join(folder, f"{mode}.json"), trace=mode == "trace"):
        llm = load(model)
        llm.eval([3, 4, 5, 6])
        start = time.perf_counter()
        for token in tokens:
            llm.eval([token])
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="a MoE GGUF")
    parser.add_argument("--build", choices=("qwen3_moe", "mixtral"), help="build the tests' tiny model instead")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = args.model
        if model is None:
            if args.build is None:
                parser.error("give MODEL.gguf or --build NAME")
            sys.path[0:0] = [os.path.join(os.path.dirname(__file__), "..", "tests", "llama_cpp"),
                             os.path.join(os.path.dirname(__file__), "..", "tests")]
            import llama_models

            class Factory:
                def mktemp(self, name: str) -> Any:
                    import pathlib

                    path = pathlib.Path(folder) / name
                    path.mkdir()
                    return path

            model = str(llama_models.gguf_model(args.build, Factory()).gguf)
        probe = load(model)
        layers = llama_cpp.llama_model_n_layer(probe.model)
        del probe
        best: dict[Optional[str], float] = {}
        for _ in range(args.repeats):
            for mode in (None, "counts", "trace"):
                seconds = run(model, args.steps, mode, folder)
                best[mode] = min(best.get(mode, seconds), seconds)
        bare = best[None] / args.steps * 1e3
        print(f"model {os.path.basename(model)}: {layers} layers; {args.steps} decode steps, min of {args.repeats}")
        print(f"{'mode':<22}{'ms/step':>10}{'ratio':>9}{'+ms/layer/step':>16}")
        print(f"{'no capture':<22}{bare:>10.3f}{1.0:>9.2f}{'':>16}")
        for mode, title in (("counts", "capture()"), ("trace", "capture(trace=True)")):
            per_step = best[mode] / args.steps * 1e3
            print(f"{title:<22}{per_step:>10.3f}{per_step / bare:>9.2f}{(per_step - bare) / layers:>16.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
