"""Cost of one per-layer call of the device path, on the CPU, against the host calls it replaces.

Run: ``python benchmarks/bench_torch.py`` (torch installed). Shape: 40 layers x
128 experts, top-8, trace on, a decode batch of 16 rows with a valid-row count
(a 0-d tensor) and sequence ids. Each row is the minimum over repeats of the
mean time of a 40-layer step, subject and comparison interleaved, with the
ratio. Flushes are included (the staging buffer fills and is handed over).
On the CPU nothing is saved by avoiding a sync: these figures bound the
Python-side cost per call that a CUDA runtime also pays when not graphed.
"""

from __future__ import annotations

import os
import tempfile
import timeit

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

from turbospark import RouterHistogram  # noqa: E402
from turbospark.torch import DeviceRecorder  # noqa: E402

LAYERS, EXPERTS, TOP_K, BATCH = 40, 128, 8, 16
STEPS, REPEATS = 50, 7


def main() -> None:
    torch.manual_seed(0)
    ids = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(BATCH)])
    valid = torch.tensor(12)
    seq = torch.arange(BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        device_hist = RouterHistogram(os.path.join(tmp, "d.json"), LAYERS, EXPERTS, TOP_K, trace=True)
        dev = DeviceRecorder(device_hist, device="cpu")
        batch_hist = RouterHistogram(os.path.join(tmp, "b.json"), LAYERS, EXPERTS, TOP_K, trace=True)
        many_hist = RouterHistogram(os.path.join(tmp, "m.json"), LAYERS, EXPERTS, TOP_K, trace=True)

        def device_step() -> None:
            for layer in range(LAYERS):
                dev.record(layer, ids, valid=valid, seq=seq, phase="decode")

        def batch_step() -> None:
            # The host path: read the count, slice, hand over CPU tensors.
            n = int(valid)
            for layer in range(LAYERS):
                batch_hist.record_batch(layer, ids[:n], seq=seq[:n], phase="decode")

        def many_step() -> None:
            n = int(valid)
            for layer in range(LAYERS):
                many_hist.record_many(layer, ids[:n].numpy())

        rows = {"DeviceRecorder.record": device_step, "record_batch (CPU tensors)": batch_step,
                "record_many (ndarray view, no sequences)": many_step}
        best = {name: float("inf") for name in rows}
        for _ in range(REPEATS):
            for name, step in rows.items():
                best[name] = min(best[name], timeit.timeit(step, number=STEPS) / STEPS / LAYERS)
        dev.flush()
        base = best["record_many (ndarray view, no sequences)"]
        for name, seconds in best.items():
            print(f"{name:45s} {seconds * 1e6:8.2f} us/call  {seconds / base:5.2f}x record_many")
        for hist in (device_hist, batch_hist, many_hist):
            hist.discard()


if __name__ == "__main__":
    main()
