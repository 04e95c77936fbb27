"""The EPLB replays (vLLM's, SGLang's) and the sweep, serial and on Dask: time per setting, ids per second, and
stated comparisons.

Run: ``python benchmarks/bench_rebalance.py [--layers 16] [--experts 128] [--passes 100000] [--batch 256]
[--dask-workers 2]``.

A synthetic capture (random top-8 routing whose hot experts move every
quarter of the capture) is cut into steps of ``--batch`` passes. In one process:

* replay: one vLLM setting (R = E / 8, W = 40, I = 100) with
  ``turbospark.rebalance.replay.replay``; its rate in routed ids per second;
  then the same numbers under SGLang's loop (``Setting("sglang", ...)``: its
  algorithm and static dispatch; W <= I as SGLang requires), as a ratio to vLLM's;
* sweep: the 12 settings R in {0, E / 8} x W in {10, 40} x I in {25, 100, 400}
  in one ``replay`` call (each layer read once for all settings), against 12
  separate calls: the ratio is what running the settings together saves;
* the same sweep through ``turbospark rebalance --sweep --json`` on the capture
  written to a JSON file, serially, against ``--dask`` on a LocalCluster of
  ``--dask-workers`` single-threaded worker processes already running, started as
  ``--dask local`` starts its own (each worker parses the file once, then replays
  its settings), and against
  ``--dask local`` (the cluster started and closed inside the command); the
  outputs are compared byte for byte;
* against the transliteration: the token-at-a-time transcription of vLLM's
  ``EplbState`` in ``tests/vllm_eplb_harness.py`` (``simulate``, turbospark's
  policy) on the first ``--naive-passes`` passes of 2 layers, against the
  replay on the same input: the ratio is the vectorised replay's speed-up.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from turbospark.capture.reader import Capture  # noqa: E402
from turbospark.rebalance.replay import Setting, replay  # noqa: E402
from turbospark.rebalance.steps import form_steps  # noqa: E402
from turbospark.rebalance.vllm_policy import rebalance_experts  # noqa: E402


def synthetic(layers: int, experts: int, top_k: int, passes: int, seed: int = 0) -> Capture:
    """Random routing, Zipf-skewed per layer, the popularity reshuffled every quarter of the passes."""
    rng = np.random.default_rng(seed)
    trace = []
    weight = 1.0 / np.arange(1, experts + 1)
    for _ in range(layers):
        rows = np.empty((passes, top_k), dtype=np.uint8 if experts <= 256 else np.uint16)
        for quarter in range(4):
            lo, hi = quarter * passes // 4, (quarter + 1) * passes // 4
            p = rng.permutation(weight)
            # Gumbel top-k: distinct ids per pass, drawn by popularity.
            keys = np.log(p / p.sum()) + rng.gumbel(size=(hi - lo, experts))
            rows[lo:hi] = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        trace.append(rows)
    counts = np.stack([np.bincount(t.ravel().astype(np.int64), minlength=experts) for t in trace])
    return Capture(layers, experts, top_k, counts, trace=tuple(trace))


def dask_sweep(capture: Capture, args: argparse.Namespace, spare: int) -> None:
    """The 12-setting sweep through the command, serial against --dask (module docstring)."""
    try:
        import distributed
    except ImportError:
        print("sweep on Dask: skipped (pip install 'turbospark[dask]')")
        return
    from turbospark.cli import main as cli

    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "capture.json")
        write_capture(capture, path)
        argv = ["rebalance", path, "--gpus", str(args.gpus), "--batch", str(args.batch), "--num-redundant-experts",
                f"0,{spare}", "--window-size", "10,40", "--step-interval", "25,100,400", "--sweep", "--json"]

        def timed(extra: list[str]) -> tuple[float, str]:
            out = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(out):
                assert cli(argv + extra) == 0
            return time.perf_counter() - start, out.getvalue()

        serial, expected = timed([])
        import dask

        # As --dask local starts its workers (turbospark.metrics.distributed.connect): without dask's
        # MALLOC_TRIM_THRESHOLD_, which makes every large numpy temporary fault its pages in again.
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
            cluster = distributed.LocalCluster(n_workers=args.dask_workers, threads_per_worker=1, processes=True,
                                               dashboard_address=":0")
        with cluster:
            running, text = timed(["--dask", cluster.scheduler_address])
            assert text == expected, "--dask changed the output"
        local, text = timed(["--dask", "local"])
        assert text == expected, "--dask local changed the output"
    print(f"sweep of 12 settings via the command (JSON file): serial {serial:.2f} s; --dask on a running "
          f"{args.dask_workers}-process LocalCluster {running:.2f} s (ratio {serial / running:.2f}x); --dask local "
          f"with the cluster's start {local:.2f} s (ratio {serial / local:.2f}x); outputs identical")


def write_capture(capture: Capture, path: str) -> None:
    """``capture`` as a turbospark JSON capture file (counts and trace)."""
    doc = {"num_layers": capture.num_layers, "num_experts": capture.num_experts, "top_k": capture.top_k,
           "counts": capture.counts.tolist(), "trace": [rows.astype(np.int64).ravel().tolist() for rows in capture.trace]}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--passes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--naive-passes", type=int, default=2_048)
    parser.add_argument("--dask-workers", type=int, default=2)
    args = parser.parse_args()
    capture = synthetic(args.layers, args.experts, args.top_k, args.passes)
    steps = form_steps(capture, args.batch)
    ids = args.layers * args.passes * args.top_k
    spare = args.experts // 8
    print(f"capture: {args.layers} layers x {args.experts} experts, top-{args.top_k}, {args.passes:,} passes, "
          f"{steps.count:,} steps of {args.batch}; {args.gpus} GPUs")

    one = Setting("vllm", spare, 40, 100)
    start = time.perf_counter()
    (result,) = replay(capture, steps, args.gpus, [one], keep_maps=False)
    single = time.perf_counter() - start
    print(f"replay ({one.label()}): {single:.2f} s, {len(result.steps)} rearrangements, {ids / single / 1e6:.1f} M ids/s")

    theirs = Setting("sglang", spare, 40, 100)
    start = time.perf_counter()
    (result,) = replay(capture, steps, args.gpus, [theirs], keep_maps=False)
    sglang = time.perf_counter() - start
    print(f"replay ({theirs.label()}): {sglang:.2f} s, {len(result.steps)} rearrangements, "
          f"{ids / sglang / 1e6:.1f} M ids/s (ratio {sglang / single:.2f}x vLLM's time)")

    grid = [Setting("vllm", r, w, i) for r in (0, spare) for w in (10, 40) for i in (25, 100, 400)]
    start = time.perf_counter()
    replay(capture, steps, args.gpus, grid, keep_maps=False)
    together = time.perf_counter() - start
    start = time.perf_counter()
    for setting in grid:
        replay(capture, steps, args.gpus, [setting], keep_maps=False)
    apart = time.perf_counter() - start
    print(f"sweep of {len(grid)} settings: {together:.2f} s in one call, {apart:.2f} s in {len(grid)} calls "
          f"(ratio {apart / together:.2f}x)")
    dask_sweep(capture, args, spare)

    import vllm_eplb_harness

    small = Capture(2, args.experts, args.top_k, capture.counts[:2],
                    trace=tuple(t[:args.naive_passes].astype(np.int64) for t in capture.trace[:2]))
    slots = args.experts + spare
    naive_batch = max(1, args.naive_passes // 64)
    start = time.perf_counter()
    vllm_eplb_harness.simulate(
        lambda w, old: rebalance_experts(np.array(w, dtype=np.int32), slots, 1, 1, args.gpus, np.array(old)).tolist(),
        [t.tolist() for t in small.trace], args.experts, naive_batch, args.gpus, spare, 4, 8)
    naive = time.perf_counter() - start
    start = time.perf_counter()
    replay(small, form_steps(small, naive_batch), args.gpus, [Setting("vllm", spare, 4, 8)], keep_maps=False)
    fast = time.perf_counter() - start
    print(f"against the token-at-a-time transliteration ({args.naive_passes:,} passes x 2 layers, 64 steps): "
          f"{naive:.2f} s vs {fast:.3f} s (ratio {naive / fast:.0f}x)")


if __name__ == "__main__":
    main()
