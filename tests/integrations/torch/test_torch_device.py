"""turbospark.torch.DeviceRecorder: exact, sync-free per-layer calls, flushed before every write."""

from __future__ import annotations

import contextlib
import gc
import pathlib
from typing import Any

import numpy as np
import pytest
from childproc import run_script, run_with_files
from conftest import require_module

torch = require_module("torch")

import turbospark  # noqa: E402
from turbospark.torch import COUNTS_ONLY_CAPACITY, DEFAULT_CAPACITY, DeviceRecorder, staging_bytes  # noqa: E402
from host_reads import no_host_read  # noqa: E402,F401 -- a fixture


# ------------------------------------------------------------------ exactness

MODES = {
    "trace+probe": {"trace": True, "pilot": "next"},
    "trace": {"trace": True},
    "probe": {"pilot": "self"},
    "counts-only": {},
}


def _blocks(seed: int, layers: int, experts: int, k: int, sequences: bool) -> list[dict[str, Any]]:
    """A random stream of per-layer calls: shapes, padding, valid counts, masks, predictions, flushes."""
    rng = np.random.default_rng(seed)
    stream = []
    for _ in range(int(rng.integers(20, 60))):
        n = int(rng.integers(1, 7))
        ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(n)])
        keep = np.ones(n, bool)
        block: dict[str, Any] = {"layer": int(rng.integers(layers)), "kind": "pred" if rng.random() < 0.25 else "sel"}
        style = int(rng.integers(4))
        if style in (1, 3):
            valid = int(rng.integers(0, n + 1))
            keep &= np.arange(n) < valid
            block["valid"] = valid if rng.random() < 0.5 else torch.tensor(valid)
        if style in (2, 3):
            mask = rng.random(n) < 0.6
            keep &= mask
            block["mask"] = torch.from_numpy(mask)
        ids[~keep] = -1  # padding in dropped rows is fine
        block["ids"], block["keep"] = ids, keep
        if sequences and block["kind"] == "sel" and rng.random() < 0.7:
            block["seq"] = rng.integers(0, 5, size=n)
            block["seq"][~keep] = -1  # so may the sequence ids of dropped rows be
            block["phase"] = "prompt" if rng.random() < 0.3 else "decode"
        block["flush"] = rng.random() < 0.1
        stream.append(block)
    return stream


def _direct(hist: Any, block: dict[str, Any]) -> None:
    ids, keep = block["ids"], block["keep"]
    if block["kind"] == "pred":
        for row in ids[keep]:
            hist.record_prediction(block["layer"], row)
    elif "seq" in block:
        hist.record_batch(block["layer"], ids, seq=block["seq"], phase=block["phase"], mask=keep)
    elif keep.any():
        hist.record_many(block["layer"], ids[keep])


def _device(dev: DeviceRecorder, block: dict[str, Any]) -> None:
    kwargs = {key: block[key] for key in ("valid", "mask") if key in block}
    ids = torch.from_numpy(block["ids"]).to(torch.int32)
    if block["kind"] == "pred":
        dev.record_prediction(block["layer"], ids, **kwargs)
    else:
        if "seq" in block:
            kwargs["seq"] = torch.from_numpy(block["seq"])
            kwargs["phase"] = block["phase"]
        dev.record(block["layer"], ids, **kwargs)
    if block["flush"]:
        dev.flush()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(8))
def test_device_path_json_equals_direct_calls(make: Any, mode: str, seed: int) -> None:
    options = MODES[mode]
    sequences = mode != "counts-only"
    stream = _blocks(seed, 4, 16, 3, sequences)
    # The probe without the trace is legal but warns: its predictions can never be scored.
    unscorable = mode == "probe"
    with pytest.warns(RuntimeWarning, match="can never be scored") if unscorable else contextlib.nullcontext():
        direct = make(4, 16, 0, name="direct.json", **options)
    for block in stream:
        _direct(direct, block)
    with pytest.warns(RuntimeWarning, match="can never be scored") if unscorable else contextlib.nullcontext():
        hist = make(4, 16, 0, name="device.json", **options)
    dev = DeviceRecorder(hist, device="cpu", top_k=3, capacity=int(np.random.default_rng(seed).integers(6, 40)))
    assert dev.counts_only == (mode == "counts-only")
    for block in stream:
        _device(dev, block)
    assert hist.to_json() == direct.to_json()
    hist.close()
    assert pathlib.Path(hist.path).read_text() == direct.to_json()


def test_graph_region_rows_reach_the_recorder_in_order(make: Any) -> None:
    direct = make(2, 8, 2, trace=True, name="direct.json")
    hist = make(2, 8, 2, trace=True, name="device.json")
    dev = DeviceRecorder(hist, device="cpu", capacity=8)
    region = dev.graph_region(rows=4)
    valid = torch.zeros((), dtype=torch.int64)
    ids = torch.zeros((2, 2), dtype=torch.int64)
    for step in range(7):
        ids.copy_(torch.tensor([[step % 8, (step + 1) % 8], [7, 6]]))
        valid.fill_(1 + step % 2)
        # On CUDA these calls are captured once and replayed; on the CPU they run each step.
        with region:
            dev.record(0, ids, valid=valid)
            dev.record(1, ids, valid=valid, seq=3, phase="decode")
        region.commit()
        direct.record_many(0, ids.numpy()[: 1 + step % 2])
        direct.record_batch(1, ids.numpy()[: 1 + step % 2], seq=[3] * (1 + step % 2), phase="decode")
    assert hist.to_json() == direct.to_json()


# ------------------------------------------------------------------ no host sync


def test_the_guard_catches_host_reads(no_host_read: Any) -> None:
    flags = torch.tensor([True, False])
    values = torch.tensor([3, 4])
    for read in (lambda: int(values[0]), lambda: bool(flags[0]), lambda: values[flags], lambda: values.nonzero(),
                 lambda: values.tolist(), lambda: torch.equal(values, values), lambda: values.masked_select(flags),
                 lambda: values.to("meta")):
        with pytest.raises(AssertionError, match="host read|boolean-mask|device transfer"), no_host_read():
            read()


@pytest.mark.parametrize("options", [{"trace": True, "pilot": "next"}, {}], ids=["staging", "counts-only"])
def test_per_layer_calls_never_read_device_data_on_the_host(make: Any, no_host_read: Any, options: Any) -> None:
    hist = make(3, 16, 4, **options)
    dev = DeviceRecorder(hist, device="cpu")
    ids = torch.randint(0, 16, (8, 4))
    valid = torch.tensor(5)
    mask = torch.rand(8) < 0.5
    seq = torch.arange(8)
    region = None if dev.counts_only else dev.graph_region(rows=24)
    with no_host_read():
        for step in range(20):
            for layer in range(3):
                if dev.counts_only:
                    dev.record(layer, ids, valid=valid, mask=mask)
                else:
                    dev.record(layer, ids, valid=valid, mask=mask, seq=seq, phase="decode")
                    dev.record_prediction(layer, ids[:2], valid=valid)
        if region is not None:
            with region:
                dev.record(0, ids, valid=valid, mask=mask)
            region.commit()
    dev.flush()
    keep = ((torch.arange(8) < 5) & mask).numpy()
    repeats = 20 if dev.counts_only else 21
    assert hist.counts[0].tolist() == np.bincount(np.tile(ids.numpy()[keep].ravel(), repeats), minlength=16).tolist()


# ------------------------------------------------------------------ flushing


def test_flush_when_full_and_on_demand_never_twice(make: Any) -> None:
    hist = make(1, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu", capacity=4)
    dev.record(0, torch.tensor([[0, 1], [2, 3], [4, 5]]))
    assert dev.staged_rows == 3 and hist.passes.tolist() == [0]
    dev.record(0, torch.tensor([[6, 7], [1, 0]]))  # does not fit: the first call is flushed
    assert dev.staged_rows == 2 and hist.passes.tolist() == [3]
    dev.flush()
    dev.flush()
    assert dev.staged_rows == 0
    assert hist.trace(0).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]]
    assert hist.to_json() == hist.to_json()


@pytest.mark.parametrize("how", ["close", "with", "drop", "write"])
def test_staged_ids_are_written(tmp_path: pathlib.Path, how: str, capfd: Any) -> None:
    path = tmp_path / "cap.json"
    hist = turbospark.RouterHistogram(str(path), 1, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu")
    if how == "with":
        with hist:
            dev.record(0, torch.tensor([[1, 2]]))
    else:
        dev.record(0, torch.tensor([[1, 2]]))
        if how == "close":
            hist.close()
        elif how == "write":
            hist.write()
        else:
            del hist, dev
            gc.collect()
    assert path.read_text() == '{"num_layers":1,"num_experts":8,"top_k":2,"counts":[[0,1,1,0,0,0,0,0]],"trace":[[1,2]]}'


@pytest.mark.parametrize("ending", ["exit", "sigterm"])
def test_staged_ids_are_written_at_exit_and_sigterm(tmp_path: pathlib.Path, ending: str) -> None:
    result, (path,) = run_with_files(
        tmp_path,
        f"""
        import torch
        from turbospark.torch import DeviceRecorder
        hist = R(path, 1, 8, 2, trace=True)
        dev = DeviceRecorder(hist, device="cpu")
        dev.record(0, torch.tensor([[1, 2], [3, 4]]), valid=torch.tensor(1))
        if {ending == "sigterm"}:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        """,
        {"path": "cap.json"},
        env={"TURBOSPARK_ROUTER_HIST_SIGTERM": "1"},
        timeout=120,
    )
    assert result.returncode == (-signal_number() if ending == "sigterm" else 0), result.stderr
    assert result.stderr.count(f"[router-hist] wrote {path}") == 1
    assert path.read_text() == '{"num_layers":1,"num_experts":8,"top_k":2,"counts":[[0,1,1,0,0,0,0,0]],"trace":[[1,2]]}'


def signal_number() -> int:
    import signal

    return int(signal.SIGTERM)


# ------------------------------------------------------------------ refusals


def test_bad_staged_ids_refuse_their_call_only(make: Any) -> None:
    hist = make(2, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu")
    dev.record(0, torch.tensor([[1, 2]]))
    dev.record(0, torch.tensor([[3, 9]]))
    dev.record(1, torch.tensor([[4, 5]]))
    with pytest.raises(ValueError, match=r"refused and recorded nothing: expert id 9 at position \(0, 1\) is out of range for 8 experts"):
        dev.flush()
    assert hist.trace(0).tolist() == [[1, 2]] and hist.trace(1).tolist() == [[4, 5]]
    dev.flush()  # nothing left, nothing twice
    assert hist.passes.tolist() == [1, 1]


def test_counts_only_refuses_layers_with_bad_ids(make: Any) -> None:
    hist = make(2, 8, 2)
    dev = DeviceRecorder(hist, device="cpu")
    dev.record(0, torch.tensor([[1, 2], [-1, -1]]), valid=1)
    dev.record(1, torch.tensor([[4, 8]]))
    with pytest.raises(ValueError, match=r"expert ids outside \[0, 8\) in kept rows of layer\(s\) \[1\] \(1 ids\)"):
        dev.flush()
    assert hist.counts.tolist() == [[0, 1, 1, 0, 0, 0, 0, 0], [0] * 8]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda d: d.record(3, torch.zeros((1, 2), dtype=torch.int64)), IndexError, "layer 3 is out of range"),
        (lambda d: d.record(0, [[0, 1]]), TypeError, "ids must be a torch.Tensor on cpu, got list"),
        (lambda d: d.record(0, torch.zeros((1, 2), device="meta")), TypeError, "ids are on device 'meta'"),
        (lambda d: d.record(0, torch.zeros((1, 2))), TypeError, "ids must have an integer dtype, got torch.float32"),
        (lambda d: d.record(0, torch.zeros((1, 3), dtype=torch.int64)), ValueError, "ids must be (n, 2) or (2,), got shape (1, 3)"),
        (lambda d: d.record(0, torch.zeros((2, 2), dtype=torch.int64), mask=torch.ones(2)), TypeError, "mask must be torch.bool, got torch.float32"),
        (lambda d: d.record(0, torch.zeros((2, 2), dtype=torch.int64), mask=torch.ones(3, dtype=torch.bool)), ValueError, "mask must have shape (2,), got (3,)"),
        (lambda d: d.record(0, torch.zeros((2, 2), dtype=torch.int64), valid=-1), TypeError, "valid must be a non-negative int"),
        (lambda d: d.record(0, torch.zeros((2, 2), dtype=torch.int64), seq=torch.arange(2)), ValueError, "seq and phase come together"),
        (lambda d: d.record(0, torch.zeros((2, 2), dtype=torch.int64), seq=torch.arange(2), phase="fill"), ValueError, "phase must be 'prompt' or 'decode', got 'fill'"),
        (lambda d: d.record(0, torch.zeros((9, 2), dtype=torch.int64)), ValueError, "9 rows in one call exceed the staging capacity of 8 rows"),
    ],
)
def test_host_visible_errors_record_nothing(make: Any, call: Any, error: type, message: str) -> None:
    hist = make(3, 8, 2, trace=True)
    dev = DeviceRecorder(hist, device="cpu", capacity=8)
    with pytest.raises(error) as info:
        call(dev)
    assert message in str(info.value)
    assert dev.staged_rows == 0 and hist.to_json() == '{"num_layers":3,"num_experts":8,"top_k":2,"counts":[[0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0]],"trace":[[],[],[]]}'


def test_construction_errors(make: Any) -> None:
    with pytest.raises(ValueError, match="top_k is unknown"):
        DeviceRecorder(make(1, 4), device="cpu")
    with pytest.raises(ValueError, match="top_k=3 conflicts with the recorder's top_k=2"):
        DeviceRecorder(make(1, 4, 2), device="cpu", top_k=3)
    with pytest.raises(ValueError, match="counts_only needs the recorder's trace and pilot probe off"):
        DeviceRecorder(make(1, 4, 2, trace=True), device="cpu", counts_only=True)
    with pytest.raises(ValueError, match="sequence ids need per-pass data"):
        DeviceRecorder(make(1, 4, 2), device="cpu").record(0, torch.zeros((1, 2), dtype=torch.int64), seq=0, phase="decode")
    closed = make(1, 4, 2)
    closed.discard()
    with pytest.raises(ValueError, match="closed"):
        DeviceRecorder(closed, device="cpu")


def test_memory_of_a_60_layer_top_8_model(make: Any) -> None:
    # The README's figures: default capacities, 60 layers, 128 experts, top-8.
    assert (DEFAULT_CAPACITY, COUNTS_ONLY_CAPACITY) == (65536, 4096)
    assert staging_bytes(DEFAULT_CAPACITY, 8) == (5_308_416, 4_784_128)
    staged = DeviceRecorder(make(60, 128, 8, trace=True, name="t.json"), device="cpu")
    assert staged.memory() == staging_bytes(DEFAULT_CAPACITY, 8)
    counted = DeviceRecorder(make(60, 128, 8, name="c.json"), device="cpu")
    assert counted.memory() == (398_760, 62_880)
    # Decoded tokens between two flushes at batch 1: one row per layer, another with the probe.
    assert DEFAULT_CAPACITY // 60 == 1092 and DEFAULT_CAPACITY // 120 == 546


def test_counts_only_counts_long_calls_in_chunks(make: Any) -> None:
    hist = make(1, 16, 2)
    direct = make(1, 16, 2, name="direct.json")
    dev = DeviceRecorder(hist, device="cpu", capacity=3)
    ids = torch.randint(0, 16, (11, 2))
    mask = torch.rand(11) < 0.7
    dev.record(0, ids, valid=torch.tensor(9), mask=mask)
    dev.record(0, ids, valid=5)
    keep = ((torch.arange(11) < 9) & mask).numpy()
    direct.record_many(0, ids.numpy()[keep])
    direct.record_many(0, ids.numpy()[:5])
    assert hist.to_json() == direct.to_json()


def test_import_turbospark_does_not_import_torch(tmp_path: pathlib.Path) -> None:
    result = run_script(tmp_path, "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')\n")
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


# ------------------------------------------------------------------ _add_counts, both cores


def test_add_counts_validates(make: Any) -> None:
    hist = make(2, 3)
    counts = np.array([[1, 1, 0], [0, 0, 0]], dtype=np.int64)
    for bad, error, message in [
        ((counts.astype(np.int32), np.array([1, 0]), 2), TypeError, "counts and passes must be int64, got int32 and int64"),
        ((counts[:1], np.array([1], dtype=np.int64), 2), ValueError, "counts must be (2, 3) and passes (2,), got (1, 3) and (1,)"),
        ((counts, np.array([1, 0], dtype=np.int64), 0), ValueError, "top_k must be a positive integer, got 0"),
        ((counts, np.array([2, 0], dtype=np.int64), 2), ValueError, "counts of layer 0 sum to 2, not passes x top_k = 2 x 2"),
        ((-counts, np.array([-1, 0], dtype=np.int64), 2), ValueError, "counts hold a negative value -1"),
    ]:
        with pytest.raises(error) as info:
            hist._add_counts(*bad)
        assert message in str(info.value)
    assert hist.top_k == 0
    hist._add_counts(counts, np.array([1, 0], dtype=np.int64), 2)
    hist._add_counts(counts, np.array([1, 0], dtype=np.int64), 2)
    assert hist.to_json() == '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[2,2,0],[0,0,0]]}'
    assert hist.passes.tolist() == [2, 0]
    with pytest.raises(ValueError, match="top_k is 2, got counts of top-1 passes"):
        hist._add_counts(np.zeros((2, 3), dtype=np.int64), np.zeros(2, dtype=np.int64), 1)
    with pytest.raises(ValueError, match="while the trace or the pilot probe is on"):
        make(2, 3, 2, trace=True, name="t.json")._add_counts(counts, np.array([1, 0], dtype=np.int64), 2)


# ------------------------------------------------------------------ CUDA

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")


@cuda
def test_cuda_no_sync_per_layer_call(make: Any) -> None:
    for options in ({"trace": True, "pilot": "next"}, {}):
        hist = make(4, 32, 4, name=f"c{len(options)}.json", **options)
        dev = DeviceRecorder(hist, device="cuda")
        ids = torch.randint(0, 32, (16, 4), device="cuda")
        valid = torch.tensor(9, device="cuda")
        mask = torch.rand(16, device="cuda") < 0.5
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for layer in range(4):
                dev.record(layer, ids, valid=valid, mask=mask)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        keep = ((torch.arange(16, device="cuda") < 9) & mask).cpu().numpy()
        dev.flush()
        expected = np.bincount(ids.cpu().numpy()[keep].ravel(), minlength=32)
        assert hist.counts.tolist() == [expected.tolist()] * 4


@cuda
@pytest.mark.parametrize("options", [{"trace": True}, {}], ids=["staging", "counts-only"])
def test_cuda_graph_capture_and_replay(make: Any, options: Any) -> None:
    hist = make(2, 16, 2, **options)
    direct = make(2, 16, 2, name="direct.json", **options)
    dev = DeviceRecorder(hist, device="cuda", capacity=64)
    ids = torch.zeros((4, 2), dtype=torch.int64, device="cuda")
    valid = torch.zeros((), dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    region = None if dev.counts_only else dev.graph_region(rows=8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if region is None:
            with torch.cuda.graph(graph):
                dev.record(0, ids, valid=valid)
                dev.record(1, ids, valid=valid)
        else:
            with region, torch.cuda.graph(graph):
                dev.record(0, ids, valid=valid)
                dev.record(1, ids, valid=valid)
    torch.cuda.current_stream().wait_stream(side)
    rng = np.random.default_rng(0)
    for step in range(40):
        block = np.stack([rng.choice(16, 2, replace=False) for _ in range(4)])
        count = int(rng.integers(0, 5))
        ids.copy_(torch.from_numpy(block))
        valid.fill_(count)
        graph.replay()
        if region is not None:
            region.commit()
        if count:
            direct.record_many(0, block[:count])
            direct.record_many(1, block[:count])
    assert hist.to_json() == direct.to_json()
