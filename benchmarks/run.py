"""The performance suite: every figure beside its comparison, measured in one process.

Run: ``python benchmarks/run.py`` (after ``pip install '.[bench]'``). Shape: a
Qwen-MoE-like model, 40 layers x 128 experts, top-8, trace on. Each row times
the subject and its comparison interleaved (A, B, A, B, ...), keeps the
minimum of the repeats (the run least disturbed by the rest of the machine),
and prints both absolute figures and their ratio against the issue's target.
``--quick`` runs fewer repeats, for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any, Callable

# numpy's OpenBLAS starts worker threads that spin on a 2-core machine and
# steal time from whichever side of a comparison is running; nothing here
# calls BLAS, so one thread is enough. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import turbospark  # noqa: E402
from turbospark.recording import _recorder_py  # noqa: E402
from turbospark.recording.recorder import recorder_class  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_noop import load_noop_core  # noqa: E402

LAYERS, EXPERTS, TOP_K = 40, 128, 8
IDS = [3, 17, 5, 99, 12, 0, 64, 8]


def interleaved(subject: Callable[[], float], comparison: Callable[[], float], repeats: int) -> tuple[float, float]:
    """Minimum of ``repeats`` alternating runs of two timers (each returns seconds per unit)."""
    best_subject = best_comparison = float("inf")
    for _ in range(repeats):
        best_subject = min(best_subject, subject())
        best_comparison = min(best_comparison, comparison())
    return best_subject, best_comparison


def per_call(stmt: str, namespace: dict[str, Any], number: int) -> Callable[[], float]:
    timer = timeit.Timer(stmt, globals=namespace)
    return lambda: timer.timeit(number) / number


SCRATCH = tempfile.mkdtemp(prefix="turbospark-bench-")


def fresh(cls: Any, **options: Any) -> Any:
    return cls(os.path.join(SCRATCH, "capture.json"), LAYERS, EXPERTS, TOP_K, trace=True, **options)


def discard(recorder: Any) -> None:
    # Benchmarks never write a capture: stopping without writing keeps
    # interpreter exit from writing every recorder made.
    recorder.discard()


class Row:
    def _replace_target(self, target: str) -> "Row":
        """The same figures under another target (a row printed for reference has none)."""
        self.target, self.met = target, True
        return self

    def __init__(self, figure: str, subject: str, comparison: str, ratio: float, target: str, met: bool) -> None:
        self.figure, self.subject, self.comparison = figure, subject, comparison
        self.ratio, self.target, self.met = ratio, target, met


def bench_record_vs_noop(repeats: int, number: int) -> list[Row]:
    noop_cls = type("NoopHistogram", (load_noop_core(),), {})
    noop = noop_cls()
    hist = fresh(turbospark.RouterHistogram)
    arr = np.array(IDS, dtype=np.int64)
    rows = []
    for label, payload, target in (("list of 8 ints", IDS, 1.6), ("int64 ndarray of 8", arr, 2.0)):
        namespace = {"hist": hist, "noop": noop, "ids": payload}
        ours, floor = interleaved(
            per_call("hist.record(3, ids)", namespace, number),
            per_call("noop.record(3, ids)", namespace, number),
            repeats,
        )
        ratio = ours / floor
        rows.append(
            Row(
                f"record(layer, {label})",
                f"{ours * 1e9:.1f} ns/call",
                f"no-op method {floor * 1e9:.1f} ns/call",
                ratio,
                f"<= {target}x the no-op",
                ratio <= target,
            )
        )
    # Not a target: the same call with the trace off shows how much of the
    # figure above is the trace's fresh memory (first-touch page faults).
    untraced = turbospark.RouterHistogram(os.path.join(SCRATCH, "capture.json"), LAYERS, EXPERTS, TOP_K)
    namespace = {"hist": untraced, "noop": noop, "ids": IDS}
    ours, floor = interleaved(
        per_call("hist.record(3, ids)", namespace, number),
        per_call("noop.record(3, ids)", namespace, number),
        repeats,
    )
    rows.append(
        Row(
            "record(layer, list of 8 ints), trace off",
            f"{ours * 1e9:.1f} ns/call",
            f"no-op method {floor * 1e9:.1f} ns/call",
            ours / floor,
            "(for reference)",
            True,
        )
    )
    discard(hist)
    discard(untraced)
    return rows


def bench_record_vs_python(repeats: int, number: int) -> Row:
    compiled = fresh(turbospark.RouterHistogram)
    python = fresh(recorder_class(_recorder_py.RecorderCore))
    namespace = {"compiled": compiled, "python": python, "ids": IDS}
    ours, theirs = interleaved(
        per_call("compiled.record(3, ids)", namespace, number),
        per_call("python.record(3, ids)", namespace, number // 10),
        repeats,
    )
    discard(compiled)
    discard(python)
    speedup = theirs / ours
    return Row(
        "record(layer, list) vs pure Python",
        f"{ours * 1e9:.1f} ns/call",
        f"pure-Python backend {theirs * 1e9:.1f} ns/call",
        speedup,
        ">= 7x faster",
        speedup >= 7,
    )


def _decode_pass(hist: Any) -> None:
    for layer in range(LAYERS):
        if layer + 1 < LAYERS:
            hist.record_prediction(layer + 1, IDS)
        hist.record(layer, IDS)


def bench_decode_pass(repeats: int, number: int) -> Row:
    compiled = fresh(turbospark.RouterHistogram, pilot="next")
    python = fresh(recorder_class(_recorder_py.RecorderCore), pilot="next")
    namespace = {"compiled": compiled, "python": python, "run": _decode_pass}
    ours, theirs = interleaved(
        per_call("run(compiled)", namespace, number),
        per_call("run(python)", namespace, max(1, number // 10)),
        repeats,
    )
    discard(compiled)
    discard(python)
    speedup = theirs / ours
    return Row(
        "decode pass: record + record_prediction x 40 layers",
        f"{ours * 1e6:.2f} us/pass",
        f"pure-Python backend {theirs * 1e6:.2f} us/pass",
        speedup,
        ">= 7x faster",
        speedup >= 7,
    )


def bench_record_many(repeats: int) -> Row:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, EXPERTS, size=(250_000, TOP_K), dtype=np.int64)
    counts = np.zeros((LAYERS, EXPERTS), dtype=np.uint64)

    def ours() -> float:
        hist = fresh(turbospark.RouterHistogram)
        start = time.perf_counter()
        hist.record_many(3, ids)
        elapsed = time.perf_counter() - start
        discard(hist)
        return elapsed

    def numpy_way() -> float:
        start = time.perf_counter()
        counts[3] += np.bincount(ids.ravel(), minlength=EXPERTS).astype(np.uint64)
        ids.astype(np.uint32)
        return time.perf_counter() - start

    t_ours, t_numpy = interleaved(ours, numpy_way, repeats)
    speedup = t_numpy / t_ours
    return Row(
        "record_many(layer, int64 (250000, 8))",
        f"{ids.size / t_ours / 1e6:.0f} M ids/s",
        f"bincount + astype {ids.size / t_numpy / 1e6:.0f} M ids/s",
        speedup,
        ">= 1.5x numpy",
        speedup >= 1.5,
    )


def bench_to_json(repeats: int) -> Row:
    rng = np.random.default_rng(1)
    passes = 4_000
    hist = fresh(turbospark.RouterHistogram)
    for layer in range(LAYERS):
        hist.record_many(layer, rng.integers(0, EXPERTS, size=(passes, TOP_K)))
    data = {
        "num_layers": LAYERS,
        "num_experts": EXPERTS,
        "top_k": TOP_K,
        "counts": hist.counts.tolist(),
        "trace": [hist.trace(layer).ravel().tolist() for layer in range(LAYERS)],
    }
    assert json.dumps(data, separators=(",", ":")) == hist.to_json()

    def ours() -> float:
        start = time.perf_counter()
        hist.to_json()
        return time.perf_counter() - start

    def dumps() -> float:
        start = time.perf_counter()
        json.dumps(data, separators=(",", ":"))
        return time.perf_counter() - start

    t_ours, t_dumps = interleaved(ours, dumps, repeats)
    discard(hist)
    speedup = t_dumps / t_ours
    return Row(
        "to_json(), 4,000 passes x 40 layers traced",
        f"{t_ours * 1e3:.2f} ms",
        f"json.dumps of lists {t_dumps * 1e3:.2f} ms",
        speedup,
        ">= 5x faster",
        speedup >= 5,
    )


_MEMORY_CHILD = r"""
import sys
import numpy as np
import turbospark

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

passes, layers, k, experts = 100_000, 40, 8, 128
rng = np.random.default_rng(2)
block = rng.integers(0, experts, size=(1000, k)).tolist()
hist = turbospark.RouterHistogram("unused.json", layers, experts, k, trace=True)
before = rss()
for p in range(passes):
    ids = block[p % 1000]
    for layer in range(layers):
        hist.record(layer, ids)
after = rss()
hist.discard()
print((after - before) / (passes * layers * k))
"""


def bench_trace_memory() -> Row:
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD], capture_output=True, text=True, check=True)
    per_id = float(out.stdout.strip())
    return Row(
        "trace memory, 100,000 passes x 40 layers x top-8",
        f"{per_id:.2f} bytes/id resident",
        "4 bytes of a uint32 id",
        per_id / 4,
        "<= 4.4 bytes/id",
        per_id <= 4.4,
    )


def _ratio_row(figure: str, subject: tuple[str, Any], comparison: tuple[str, Any], namespace: dict[str, Any],
               repeats: int, number: int, target: float) -> Row:
    """Time two statements side by side; the row's ratio is subject / comparison, met when <= target."""
    ours, theirs = interleaved(
        per_call(subject[1], namespace, number), per_call(comparison[1], namespace, number), repeats
    )
    ratio = ours / theirs
    return Row(
        figure,
        f"{ours * 1e9:.1f} ns/call",
        f"{comparison[0]} {theirs * 1e9:.1f} ns/call",
        ratio,
        f"<= {target}x",
        ratio <= target,
    )


def bench_small_inputs(repeats: int, number: int) -> list[Row]:
    """Tensors against ndarrays, and small blocks against single passes (the batched-decode case)."""
    arr = np.array(IDS, dtype=np.int64)
    namespace: dict[str, Any] = {
        "arr": arr,
        "block1": arr.reshape(1, TOP_K).copy(),
        "block16": np.tile(arr, (16, 1)),
        "wide": np.tile(np.arange(2 * TOP_K), (16, 1))[:, :TOP_K],
        "scalars": list(arr),
    }
    rows = []
    untraced = turbospark.RouterHistogram(os.path.join(SCRATCH, "capture.json"), LAYERS, EXPERTS, TOP_K)
    # Trace off: the rows compare per-call work, not the trace's fresh memory.
    namespace["hist"] = untraced
    rows.append(_ratio_row("record_many(layer, ndarray (1, 8)), trace off", ("", "hist.record_many(3, block1)"),
                           ("record(ndarray of 8)", "hist.record(3, arr)"), namespace, repeats, number, 3.0))
    rows.append(_ratio_row("record_many(layer, wide[:, :8] (16, 8)), trace off", ("", "hist.record_many(3, wide)"),
                           ("contiguous (16, 8)", "hist.record_many(3, block16)"), namespace, repeats, number, 1.5))
    rows.append(_ratio_row("record(layer, list of 8 numpy ints), trace off", ("", "hist.record(3, scalars)"),
                           ("list of 8 ints", "hist.record(3, ids)"), {**namespace, "ids": IDS}, repeats, number, 5.0))
    rows.extend(bench_record_batch(repeats, number))
    try:
        import torch  # noqa: PLC0415 -- optional: the rows need it, the package never imports it
    except ImportError:
        print("note: torch is not installed; the tensor rows are left out")
        discard(untraced)
        return rows
    namespace["tensor"] = torch.from_numpy(arr.copy())
    namespace["tensor16"] = torch.from_numpy(namespace["block16"].copy())
    rows.append(_ratio_row("record(layer, int64 CPU tensor of 8), trace off", ("", "hist.record(3, tensor)"),
                           ("ndarray", "hist.record(3, arr)"), namespace, repeats, number, 5.0))
    rows.append(_ratio_row("record_many(layer, int64 CPU tensor (16, 8)), trace off",
                           ("", "hist.record_many(3, tensor16)"), ("ndarray", "hist.record_many(3, block16)"),
                           namespace, repeats, number, 1.5))
    discard(untraced)
    rows.append(bench_tensor_block(torch, repeats))
    return rows


def bench_record_batch(repeats: int, number: int) -> list[Row]:
    """record_batch of an (8, 2) block with its seq ids and phase against record_many of the same block
    (the per-step cost of a serving integration), trace on; the tags commit in the core."""
    hist = turbospark.RouterHistogram(os.path.join(SCRATCH, "batch.json"), LAYERS, EXPERTS, 2, trace=True)
    block = np.arange(16, dtype=np.int64).reshape(8, 2) % EXPERTS
    namespace: dict[str, Any] = {"hist": hist, "block": block, "seq": np.arange(8, dtype=np.int64),
                                 "seq_list": list(range(8)), "mask": np.ones(8, dtype=bool)}
    plain = ("record_many", "hist.record_many(3, block)")
    rows = [
        _ratio_row("record_batch(layer, ndarray (8, 2), seq=int64 ndarray)",
                   ("", "hist.record_batch(3, block, seq=seq, phase='decode')"), plain, namespace, repeats, number, 2.0),
        _ratio_row("record_batch(layer, ndarray (8, 2), seq=list, mask=bool ndarray)",
                   ("", "hist.record_batch(3, block, seq=seq_list, phase='decode', mask=mask)"), plain, namespace,
                   repeats, number, 2.0)._replace_target("(for reference)"),
    ]
    discard(hist)
    return rows


def bench_tensor_block(torch: Any, repeats: int) -> Row:
    """record_many of (512, 8) tensors into a fresh traced recorder: 2,000 calls (16 MB of trace) per repeat."""
    block = torch.from_numpy(np.random.default_rng(3).integers(0, EXPERTS, size=(512, TOP_K)))
    calls = 2000

    def timed(traced: bool) -> Callable[[], float]:
        def run() -> float:
            hist = turbospark.RouterHistogram(os.path.join(SCRATCH, "capture.json"), LAYERS, EXPERTS, TOP_K,
                                              trace=traced)
            start = time.perf_counter()
            for _ in range(calls):
                hist.record_many(3, block)
            elapsed = time.perf_counter() - start
            discard(hist)
            return elapsed / calls

        return run

    t_ours, t_untraced = interleaved(timed(True), timed(False), max(3, repeats // 3))
    rate = block.numel() / t_ours / 1e6
    return Row(
        "record_many(layer, int64 CPU tensor (512, 8))",
        f"{rate:.0f} M ids/s",
        f"trace off {block.numel() / t_untraced / 1e6:.0f} M ids/s",
        rate / 500,
        ">= 500 M ids/s",
        rate >= 500,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats: a smoke test, not a measurement")
    options = parser.parse_args(argv)
    repeats, number = (3, 20_000) if options.quick else (15, 200_000)
    print(f"turbospark {turbospark.__version__}, backend {turbospark.BACKEND}, Python {sys.version.split()[0]}, "
          f"numpy {np.__version__}; {LAYERS} layers x {EXPERTS} experts, top-{TOP_K}, trace on")
    if turbospark.BACKEND != "cython":
        print("warning: the compiled core is not in use; these figures measure the fallback")
    rows = bench_record_vs_noop(repeats, number)
    rows.append(bench_record_vs_python(repeats, number))
    rows.append(bench_decode_pass(repeats, number // 40))
    rows.append(bench_record_many(max(repeats, 30)))
    rows.extend(bench_small_inputs(repeats, number // 4))
    rows.append(bench_to_json(max(3, repeats // 3)))
    rows.append(bench_trace_memory())
    widths = [max(len(getattr(row, field)) for row in rows) for field in ("figure", "subject", "comparison")]
    for row in rows:
        print(
            f"{row.figure:<{widths[0]}}  {row.subject:>{widths[1]}}  {row.comparison:<{widths[2]}}  "
            f"ratio {row.ratio:6.2f}  target {row.target:<18} "
            f"{'' if row.target.startswith('(') else 'met' if row.met else 'MISSED'}"
        )
    return 0 if all(row.met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
