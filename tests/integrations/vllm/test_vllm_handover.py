"""The vLLM plugin's two hand-overs on fake steps (no vLLM): device staging records exactly what the direct
one records, never reads device data on the host between flushes, and reports a silent router at its flush.
The CUDA-only tests (CUDA-graph capture of the capture hook, no sync under torch's sync debug mode) run where
CUDA is present."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from typing import Any, Optional

import numpy as np
import pytest
from conftest import require_module

torch = require_module("torch")

import turbospark  # noqa: E402
from turbospark.vllm import _checks, _handover, _signals  # noqa: E402
from turbospark.vllm._buffer import StaticBuffer  # noqa: E402
from turbospark.vllm._data_parallel import RankRows  # noqa: E402
from turbospark.vllm._handover import DeviceStaging, Direct, choose  # noqa: E402
from turbospark.vllm._requests import RequestTable  # noqa: E402
from host_reads import no_host_read  # noqa: E402,F401 -- a fixture
from vllm_steps import engine_steps  # noqa: E402

LAYERS = [0, 2, 3]  # routed decoder layers; layer 1 is dense
NUM_LAYERS, EXPERTS, K, STEP_ROWS = 4, 16, 2, 32
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")


class FakeRunner:
    """The one runner method the data-parallel path wraps: its 4th result is the step's per-rank counts."""

    across: Any = None

    def _determine_batch_execution_and_padding(self, **kwargs: Any) -> tuple[Any, ...]:
        return (None, None, False, self.across, None)


class Engine:
    """One fake worker: a recorder, its static buffer, a request table and a hand-over."""

    def __init__(self, path: pathlib.Path, kind: str, device: str = "cpu", **options: Any) -> None:
        self.recorder = turbospark.RouterHistogram(str(path), NUM_LAYERS, EXPERTS, K, trace=True)
        self.buffer = StaticBuffer(len(LAYERS), STEP_ROWS, K, torch.device(device))
        self.hooks = [self.buffer.capture_fn(slot) for slot in range(len(LAYERS))]
        self.table = RequestTable()
        cls = DeviceStaging if kind == "device" else Direct
        self.handover = cls(self.recorder, self.buffer, LAYERS, **options)
        self.runner = FakeRunner()

    def data_parallel(self, rank: int) -> "Engine":
        """Make this a data-parallel rank's engine, as the session does."""
        self.handover.ranks = RankRows(self.runner, rank, self.handover.mark_unwritten)
        return self

    def forward(self, ids: Any, skip: Optional[int] = None) -> None:
        """What the routers do inside the model: each hook gets its layer's (rows, top_k) ids."""
        for slot, hook in enumerate(self.hooks):
            if slot != skip:
                hook(ids[slot])

    def after(self, output: Any, order: list[str], now: float) -> None:
        total = output.total_num_scheduled_tokens
        if total:
            self.handover.step(total, self.table.step(output, order), now)


def routed(rng: Any, total: int, pad: int) -> np.ndarray:
    """Per routed layer, ``total + pad`` rows of distinct top-k ids (pad: a CUDA graph's padded rows)."""
    return np.stack([np.stack([rng.choice(EXPERTS, K, replace=False) for _ in range(total + pad)])
                     for _ in LAYERS]).astype(np.int32)


def run(engines: list[Engine], seed: int, count: int, clock: float = 0.3) -> int:
    """The same steps through every engine, ``clock`` seconds apart; returns the steps run."""
    rng = np.random.default_rng(seed + 100)
    start = time.monotonic()
    steps = engine_steps(seed, count)
    for index, (output, order) in enumerate(steps):
        total = output.total_num_scheduled_tokens
        ids = routed(rng, total, int(rng.integers(0, 3)) if total < STEP_ROWS - 2 else 0)
        for engine in engines:
            engine.forward(torch.from_numpy(ids).to(engine.buffer.ids.device))
            engine.after(output, order, start + index * clock)
    return len(steps)


@pytest.mark.parametrize("rows, flush_every, max_steps", [(None, 1.0, 1024), (40, 1e9, 1024), (STEP_ROWS, 0.0, 1024),
                                                          (None, 1e9, 3)],
                         ids=["by-time", "by-room", "every-step", "by-step-log"])
def test_staged_capture_equals_the_direct_one(tmp_path: pathlib.Path, monkeypatch: Any, rows: Optional[int],
                                              flush_every: float, max_steps: int) -> None:
    monkeypatch.setattr(_handover, "MAX_STEPS", max_steps)
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", rows=rows, flush_every=flush_every)
    flushes = []
    to_host = staged.handover._to_host
    monkeypatch.setattr(staged.handover, "_to_host", lambda n, m: (flushes.append(m), to_host(n, m)))
    run([direct, staged], seed=1, count=60)
    left = staged.handover.staged_steps
    direct.recorder.close()
    staged.recorder.close()  # its drain records what is still staged
    assert (tmp_path / "staged.json").read_bytes() == (tmp_path / "direct.json").read_bytes()
    passes = turbospark.load(tmp_path / "direct.json").trace[0].shape[0]
    assert passes > 100 and sum(flushes) == 60 and flushes[-1] == left
    assert len(flushes) > 3 and max(flushes) <= max_steps


@pytest.mark.parametrize("rows, flush_every, max_steps", [(None, 1.0, 1024), (40, 1e9, 1024), (STEP_ROWS, 0.0, 1024),
                                                          (None, 1e9, 3)],
                         ids=["by-time", "by-room", "every-step", "by-step-log"])
def test_each_step_is_marked_as_its_rows_are_recorded(tmp_path: pathlib.Path, monkeypatch: Any, rows: Optional[int],
                                                      flush_every: float, max_steps: int) -> None:
    """One engine step per step() call, in step_passes: the direct hand-over marks it at once, the staged one
    as its flush records it, so a staged step is neither rows nor mark until then, and never one without the
    other."""
    monkeypatch.setattr(_handover, "MAX_STEPS", max_steps)
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", rows=rows, flush_every=flush_every)
    seen = []
    record = staged.recorder.record_batch

    def record_and_check(*args: Any, **kwargs: Any) -> None:
        # Between two record_batch calls of a flush, every step recorded whole so far is marked.
        marked = staged.recorder._step_marks
        seen.append(0 if marked is None else marked.per_step().shape[1])
        record(*args, **kwargs)

    monkeypatch.setattr(staged.recorder, "record_batch", record_and_check)
    run([direct, staged], seed=1, count=60)
    totals = [output.total_num_scheduled_tokens for output, _ in engine_steps(1, 60)]
    table = RequestTable()  # the pieces (record_batch calls per layer) of each step
    pieces = [len(table.step(output, order).pieces) for output, order in engine_steps(1, 60)]
    left = staged.handover.staged_steps
    assert 0 < left < 60
    marked = staged.recorder._step_marks.per_step()
    assert marked.shape == (NUM_LAYERS, 60 - left)  # the staged steps are not marked yet ...
    assert (staged.recorder._passes_array() == marked.sum(axis=1)).all()  # ... nor recorded
    direct.recorder.close()
    staged.recorder.close()  # its drain records and marks what is still staged
    # Each step's calls (one per layer and piece) saw every earlier step marked.
    calls = [step for step, n in enumerate(pieces) for _ in range(n * len(LAYERS))]
    assert seen == calls
    for path in ("direct.json", "staged.json"):
        steps = turbospark.load(tmp_path / path).step_passes
        assert steps.tolist() == [totals if layer in LAYERS else [0] * 60 for layer in range(NUM_LAYERS)]


def test_staging_steps_never_read_device_data(tmp_path: pathlib.Path, no_host_read: Any) -> None:
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", flush_every=1e9)
    rng = np.random.default_rng(5)
    steps = engine_steps(5, 40)
    for index, (output, order) in enumerate(steps):
        ids = torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 1))
        direct.forward(ids)
        direct.after(output, order, index)
        with no_host_read():
            staged.forward(ids)
            staged.after(output, order, index)
    assert staged.handover.staged_steps == 40
    staged.handover.flush()
    assert staged.handover.staged_steps == 0
    assert staged.recorder.to_json() == direct.recorder.to_json()
    direct.recorder.discard()
    staged.recorder.discard()


def test_a_silent_router_is_reported_by_the_flush(tmp_path: pathlib.Path) -> None:
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", flush_every=1e9)
    rng = np.random.default_rng(2)
    steps = engine_steps(2, 6)
    message = ("turbospark: the router of MoE layer 2 never called capture_fn in this step; "
               "the capture would be silently incomplete")
    for index, (output, order) in enumerate(steps):
        ids = torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 0))
        skip = 1 if index == 4 else None
        direct.forward(ids, skip)
        staged.forward(ids, skip)
        if index == 4:
            with pytest.raises(RuntimeError) as refused:
                direct.after(output, order, index)
            assert str(refused.value) == message
        else:
            direct.after(output, order, index)
        staged.after(output, order, index)
    with pytest.raises(RuntimeError) as refused:
        staged.handover.flush()
    assert str(refused.value) == message
    # The four steps before the silent one were recorded; the ones from it on were dropped.
    cut = Engine(tmp_path / "cut.json", "direct")
    rng = np.random.default_rng(2)
    for index, (output, order) in enumerate(steps[:4]):
        cut.forward(torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 0)))
        cut.after(output, order, index)
    assert staged.recorder.to_json() == cut.recorder.to_json()
    for engine in (direct, staged, cut):
        engine.recorder.discard()


def test_a_flush_inside_a_flush_is_skipped(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    """What a SIGINT handler's write does mid-flush or mid-step (the same thread): no step recorded twice or half."""
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", rows=40, flush_every=1e9)
    to_host = staged.handover._to_host
    inner = []

    def copy_and_reenter(n: int, m: int) -> None:
        to_host(n, m)
        # The steps are copied but not yet recorded: a second flush now would record them twice.
        inner.append(staged.handover.staged_steps)
        staged.handover.flush()

    monkeypatch.setattr(staged.handover, "_to_host", copy_and_reenter)
    run([direct, staged], seed=3, count=40)
    staged.handover.flush()
    assert len(inner) > 3 and min(inner) > 0 and staged.handover.staged_steps == 0
    assert staged.recorder.to_json() == direct.recorder.to_json()
    direct.recorder.discard()
    staged.recorder.discard()


def test_staging_area_holds_at_least_one_step(tmp_path: pathlib.Path) -> None:
    recorder = turbospark.RouterHistogram(str(tmp_path / "x.json"), NUM_LAYERS, EXPERTS, K, trace=True)
    buffer = StaticBuffer(len(LAYERS), STEP_ROWS, K, torch.device("cpu"))
    with pytest.raises(ValueError) as refused:
        DeviceStaging(recorder, buffer, LAYERS, rows=STEP_ROWS - 1)
    assert str(refused.value) == f"the staging area must hold one step ({STEP_ROWS} rows), got rows={STEP_ROWS - 1}"
    # The default: STAGE_BYTES of ids.
    assert DeviceStaging(recorder, buffer, LAYERS).capacity == _handover.STAGE_BYTES // (len(LAYERS) * K * 4)
    # A data-parallel rank's buffer holds every rank's rows; a step stages this rank's only.
    wide = StaticBuffer(len(LAYERS), STEP_ROWS * 4, K, torch.device("cpu"), step_tokens=STEP_ROWS)
    assert DeviceStaging(recorder, wide, LAYERS, rows=STEP_ROWS).capacity == STEP_ROWS
    recorder.discard()


def test_a_failure_a_background_flush_found_stops_the_next_step(tmp_path: pathlib.Path) -> None:
    """A checkpoint thread's flush can only report a bad step; the worker's next step raises it."""
    staged = Engine(tmp_path / "staged.json", "device", flush_every=1e9)
    steps = engine_steps(2, 3)
    rng = np.random.default_rng(2)
    for index, (output, order) in enumerate(steps[:2]):
        staged.forward(torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 0)), skip=0 if index else None)
        staged.after(output, order, index)
    checkpoint = threading.Thread(target=staged.recorder._write_checkpoint)
    checkpoint.start()
    checkpoint.join()
    message = ("turbospark: the router of MoE layer 0 never called capture_fn in this step; "
               "the capture would be silently incomplete")
    output, order = steps[2]
    staged.forward(torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 0)))
    for _ in range(2):  # and every step after it
        with pytest.raises(RuntimeError) as refused:
            staged.after(output, order, 2)
        assert str(refused.value) == message
    staged.recorder.discard()


@pytest.mark.parametrize("kind", ["direct", "device"])
def test_a_signal_mid_hand_over_writes_whole_steps(tmp_path: pathlib.Path, monkeypatch: Any, kind: str) -> None:
    """SIGTERM between two layers' record_batch calls: the handler's write waits for the step (or flush)."""
    engine = Engine(tmp_path / "cap.json", kind, **({"flush_every": 0.0} if kind == "device" else {}))
    fired: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: fired.append(number))
    try:
        _signals.write_before_exit(engine.recorder)
        record = engine.recorder.record_batch
        calls = []

        def record_and_signal(*args: Any, **kwargs: Any) -> None:
            record(*args, **kwargs)
            calls.append(args[0])
            if len(calls) == 5:
                os.kill(os.getpid(), signal.SIGTERM)
                assert fired == []  # not yet: the hand-over holds it

        monkeypatch.setattr(engine.recorder, "record_batch", record_and_signal)
        run([engine], seed=8, count=12)
        assert fired == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    # What the handler wrote: every routed layer has the same passes, each step's with its mark.
    written = turbospark.load(tmp_path / "cap.json")
    assert len({written.trace[layer].shape[0] for layer in LAYERS}) == 1
    assert written.trace[LAYERS[0]].shape[0] > 0
    assert written.step_passes.sum(axis=1).tolist() == [written.trace[layer].shape[0] for layer in range(NUM_LAYERS)]
    engine.recorder.discard()


def run_data_parallel(engines: list[Engine], gathered: list[Optional[bool]], seed: int, count: int) -> None:
    """DP rank 1 of 2: before each forward the runner reports [other rank's, this rank's padded] counts; the
    routers then see this rank's rows (own) or both ranks' rows in rank order (gathered). An engine whose
    ``gathered`` is None is no DP rank: it sees this rank's rows alone, with no counts reported."""
    rng = np.random.default_rng(seed + 100)
    for index, (output, order) in enumerate(engine_steps(seed, count)):
        total = output.total_num_scheduled_tokens
        counts = [int(rng.integers(1, 6)), total + int(rng.integers(0, 3))]
        other = routed(rng, counts[0], 0)
        mine = routed(rng, total, counts[1] - total)
        for engine, gathers in zip(engines, gathered):
            if gathers is not None:
                engine.runner.across = torch.tensor(counts, dtype=torch.int32)
                engine.runner._determine_batch_execution_and_padding(num_tokens=counts[1])
            engine.forward(torch.from_numpy(np.concatenate([other, mine], axis=1) if gathers else mine))
            engine.after(output, order, index)


@pytest.mark.parametrize("gathered", [False, True], ids=["own-rows", "gathered-rows"])
def test_a_data_parallel_rank_records_its_own_rows(tmp_path: pathlib.Path, gathered: bool) -> None:
    direct = Engine(tmp_path / "direct.json", "direct").data_parallel(1)
    staged = Engine(tmp_path / "staged.json", "device", rows=40, gathered=gathered).data_parallel(1)
    # ``alone``: the rows of this rank alone, recorded by an engine without data parallelism.
    alone = Engine(tmp_path / "alone.json", "direct")
    run_data_parallel([direct, staged, alone], [gathered, gathered, None], seed=6, count=30)
    staged.handover.flush()
    assert direct.recorder.to_json() == alone.recorder.to_json()
    assert staged.recorder.to_json() == alone.recorder.to_json()
    # Its own steps: each one this rank's tokens, not the other rank's rows its routers saw too.
    totals = [output.total_num_scheduled_tokens for output, _ in engine_steps(6, 30)]
    steps = turbospark.loads(staged.recorder.to_json()).step_passes
    assert steps.tolist() == [totals if layer in LAYERS else [0] * 30 for layer in range(NUM_LAYERS)]
    for engine in (direct, staged, alone):
        engine.recorder.discard()


def test_a_data_parallel_layout_other_than_the_kernels_is_refused_by_the_flush(tmp_path: pathlib.Path) -> None:
    # Placed as own rows (the layers' kernels said so), but the routers saw both ranks' rows.
    staged = Engine(tmp_path / "staged.json", "device", gathered=False, flush_every=1e9).data_parallel(1)
    output, order = engine_steps(0, 1)[0]
    total = output.total_num_scheduled_tokens
    staged.runner.across = torch.tensor([3, total], dtype=torch.int32)
    staged.runner._determine_batch_execution_and_padding(num_tokens=total)
    staged.forward(torch.from_numpy(routed(np.random.default_rng(0), total, 3)))
    staged.after(output, order, 0)
    with pytest.raises(RuntimeError) as refused:
        staged.handover.flush()
    assert str(refused.value) == (
        f"turbospark: data-parallel rank 1: the MoE layers routed {[total + 3] * 3} rows for a step of {total} tokens, "
        f"with [3, {total}] tokens per DP rank, where their kernels (do_naive_dispatch_combine=False) imply this "
        f"rank's own rows ({total}); this dispatch layout is not supported")
    staged.recorder.discard()


def test_a_data_parallel_step_without_counts_is_refused(tmp_path: pathlib.Path) -> None:
    for kind, message in [
        ("direct", "turbospark: data-parallel rank 1 ran a step of 4 tokens without the per-rank token counts "
                   "(num_tokens_across_dp) vLLM's runner reports before each forward; the rows of the MoE layers "
                   "([4, 4, 4]) cannot be attributed"),
        ("device", "turbospark: data-parallel rank 1 ran a step of 4 tokens without the per-rank token counts "
                   "(num_tokens_across_dp) vLLM's runner reports before each forward; its rows cannot be placed"),
    ]:
        engine = Engine(tmp_path / f"{kind}.json", kind).data_parallel(1)
        output, order = engine_steps(0, 1)[0]
        total = output.total_num_scheduled_tokens
        engine.forward(torch.from_numpy(routed(np.random.default_rng(0), total, 0)))  # no batch decision reported
        with pytest.raises(RuntimeError) as refused:
            engine.after(output, order, 0)
        assert str(refused.value) == message.replace("4 tokens", f"{total} tokens").replace("[4, 4, 4]", str([total] * 3))
        engine.recorder.discard()


def test_a_buffer_built_in_inference_mode_is_staged_outside_it(tmp_path: pathlib.Path) -> None:
    """A worker may load the model under torch.inference_mode; the hand-over resets the counts after it."""
    direct = Engine(tmp_path / "direct.json", "direct")
    with torch.inference_mode():
        staged = Engine(tmp_path / "staged.json", "device", flush_every=0.0)
    run([direct, staged], seed=4, count=10)
    staged.handover.flush()
    assert staged.recorder.to_json() == direct.recorder.to_json()
    direct.recorder.discard()
    staged.recorder.discard()


@pytest.mark.parametrize("device, environ, expected", [
    ("cpu", {}, "direct"), ("cuda", {}, "device"), ("cpu", {"TURBOSPARK_VLLM_STAGING": "device"}, "device"),
    ("cpu", {"TURBOSPARK_VLLM_STAGING": ""}, "direct"), ("cuda", {"TURBOSPARK_VLLM_STAGING": "device"}, "device"),
])
def test_staging_choice(device: str, environ: dict[str, str], expected: str) -> None:
    assert choose(torch.device(device), environ) == expected


@pytest.mark.parametrize("device, raw, message", [
    ("cpu", "gpu", "turbospark: TURBOSPARK_VLLM_STAGING='gpu': expected 'direct' or 'device' (or unset: 'direct' on "
                   "this cpu worker); or unset TURBOSPARK_ROUTER_HIST"),
    ("cuda", "direct", "turbospark: TURBOSPARK_VLLM_STAGING=direct reads the static buffer on the host after every "
                       "step, a host sync per step on this cuda worker; unset TURBOSPARK_VLLM_STAGING (device "
                       "staging), or unset TURBOSPARK_ROUTER_HIST"),
    ("xpu", "", "turbospark: the vLLM plugin records on CPU and CUDA workers; this worker runs on xpu (its streams "
                "are not ordered by the device hand-over); unset TURBOSPARK_ROUTER_HIST"),
])
def test_staging_choice_refused(device: str, raw: str, message: str) -> None:
    with pytest.raises(_checks.Refused) as refused:
        choose(torch.device(device), {"TURBOSPARK_VLLM_STAGING": raw})
    assert str(refused.value) == message


def test_the_device_path_needs_one_data_parallel_layout() -> None:
    from types import SimpleNamespace

    from turbospark.vllm._session import _gathered

    assert _gathered([(0, SimpleNamespace(do_naive_dispatch_combine=True))]) is True
    assert _gathered([(0, SimpleNamespace()), (2, SimpleNamespace(do_naive_dispatch_combine=False))]) is False
    with pytest.raises(_checks.Refused) as refused:
        _gathered([(0, SimpleNamespace(do_naive_dispatch_combine=True)), (2, SimpleNamespace())])
    assert str(refused.value) == (
        "turbospark: with data parallelism the MoE layers [0] gather every rank's tokens before routing and the "
        "others route their own: the device hand-over places a step's rows before it reads their counts, so it "
        "needs one layout for every layer; use one MoE kernel for all layers, or unset TURBOSPARK_ROUTER_HIST to "
        "run without recording")


# ------------------------------------------------------------------ CUDA


@cuda
def test_cuda_steps_never_sync(tmp_path: pathlib.Path) -> None:
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", device="cuda", flush_every=1e9)
    rng = np.random.default_rng(7)
    steps = engine_steps(7, 30)
    inputs = [torch.from_numpy(routed(rng, output.total_num_scheduled_tokens, 1)) for output, _ in steps]
    on_device = [ids.cuda() for ids in inputs]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for index, ((output, order), ids) in enumerate(zip(steps, on_device)):
            staged.forward(ids)
            staged.after(output, order, index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for index, ((output, order), ids) in enumerate(zip(steps, inputs)):
        direct.forward(ids)
        direct.after(output, order, index)
    staged.recorder.close()
    direct.recorder.close()
    assert (tmp_path / "staged.json").read_bytes() == (tmp_path / "direct.json").read_bytes()


@cuda
def test_cuda_graph_replays_write_the_static_buffer(tmp_path: pathlib.Path) -> None:
    """The hook captured in a CUDA graph (as vLLM captures its decode steps), replayed step after step."""
    direct = Engine(tmp_path / "direct.json", "direct")
    staged = Engine(tmp_path / "staged.json", "device", device="cuda", flush_every=1e9, rows=STEP_ROWS * 2)
    padded = 8
    static = torch.zeros((len(LAYERS), padded, K), dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        staged.forward(static)  # warm-up outside the graph, as torch recommends
        with torch.cuda.graph(graph):
            staged.forward(static)
    torch.cuda.current_stream().wait_stream(side)
    staged.buffer.rows.fill_(-1)
    rng = np.random.default_rng(9)
    steps = engine_steps(9, 40, chunk=2)
    assert max(output.total_num_scheduled_tokens for output, _ in steps) <= padded
    for index, (output, order) in enumerate(steps):
        ids = routed(rng, output.total_num_scheduled_tokens, padded - output.total_num_scheduled_tokens)
        static.copy_(torch.from_numpy(ids))
        graph.replay()
        staged.after(output, order, index)
        direct.forward(torch.from_numpy(ids))
        direct.after(output, order, index)
    staged.recorder.close()
    direct.recorder.close()
    assert (tmp_path / "staged.json").read_bytes() == (tmp_path / "direct.json").read_bytes()



class FakeWorker:
    """What a Session reads of a worker: its runner (whose ``_dummy_run`` warm-up runs the routers too)."""

    def __init__(self, engine: "Engine", rows: int) -> None:
        ids = torch.from_numpy(routed(np.random.default_rng(1), rows, 0))

        class Runner:
            input_batch = None

            def _dummy_run(self, num_tokens: int) -> None:
                engine.forward(ids)  # every router writes its rows (and counts) of the dummy batch

        self.model_runner = Runner()


@pytest.mark.parametrize("kind", ["direct", "device"])
def test_session_starts_at_the_first_step_and_warm_up_rows_never_pass(tmp_path: pathlib.Path, kind: str) -> None:
    from types import SimpleNamespace

    from turbospark.vllm._recorder import VllmRecorder
    from turbospark.vllm._session import Session
    from vllm_steps import new, step

    path = tmp_path / "cap.json"
    path.write_text("the earlier capture")
    engine = Engine(tmp_path / "unused.json", kind)
    worker = FakeWorker(engine, STEP_ROWS)
    made: list[Any] = []

    def start() -> Any:
        made.append(VllmRecorder(str(path), NUM_LAYERS, EXPERTS, K, trace=True))
        return made[-1]

    session = Session(start, str(path), engine.buffer, LAYERS, worker, 1, kind)
    worker.model_runner._dummy_run(STEP_ROWS)  # vLLM's profiling / warm-up: rows of every layer
    assert made == [] and path.read_text() == "the earlier capture"
    # The first step: one router silent. Its rows from the warm-up must not pass for this step's.
    engine.forward(torch.from_numpy(routed(np.random.default_rng(2), 3, 0)), skip=1)
    worker.model_runner.input_batch = SimpleNamespace(req_ids=["a"])
    with pytest.raises(RuntimeError, match="the router of MoE layer 2 never called capture_fn in this step"):
        session.after_step(step({"a": 3}, new_reqs=(new("a", 3),)))
        if kind == "device":
            session.handover.flush()  # the device path reads the counts at its flush
    assert len(made) == 1  # the step started recording
    session.close()
    assert made[0].closed


def test_a_session_that_never_stepped_writes_nothing(tmp_path: pathlib.Path, capfd: Any) -> None:
    from turbospark.vllm._session import Session

    path = tmp_path / "cap.json"
    path.write_text("the earlier capture")
    engine = Engine(tmp_path / "unused.json", "direct")
    session = Session(lambda: pytest.fail("no recorder without a step"), str(path), engine.buffer, LAYERS,
                      FakeWorker(engine, STEP_ROWS), 1)
    session.close()
    session.close()
    assert path.read_text() == "the earlier capture"
    assert capfd.readouterr().err.count(f"[router-hist] not writing {path}: the engine ran no step (an existing "
                                        "capture there is left as it was)\n") == 1


@pytest.mark.parametrize("kind", ["direct", "device"])
def test_a_session_marks_the_steps_that_scheduled_tokens_and_no_warm_up(tmp_path: pathlib.Path, kind: str) -> None:
    """Warm-up (``_dummy_run``) and a step that scheduled nothing are no engine steps."""
    from types import SimpleNamespace

    from turbospark.vllm._recorder import VllmRecorder
    from turbospark.vllm._session import Session
    from vllm_steps import new, step

    path = tmp_path / "cap.json"
    engine = Engine(tmp_path / "unused.json", kind)
    worker = FakeWorker(engine, STEP_ROWS)
    session = Session(lambda: VllmRecorder(str(path), NUM_LAYERS, EXPERTS, K, trace=True), str(path), engine.buffer,
                      LAYERS, worker, 1, kind)
    rng = np.random.default_rng(3)
    worker.model_runner._dummy_run(STEP_ROWS)
    worker.model_runner.input_batch = SimpleNamespace(req_ids=["a", "b"])
    session.after_step(step({}))  # nothing scheduled: no step, and no recorder yet
    for output in (step({"a": 5, "b": 2}, new_reqs=(new("a", 5), new("b", 2))),
                   step({"a": 1, "b": 1}, cached=(("a", 5), ("b", 2))), step({}),
                   step({"a": 1}, cached=(("a", 6),), finished=("b",))):
        total = output.total_num_scheduled_tokens
        if total:
            engine.forward(torch.from_numpy(routed(rng, total, 0)))
        session.after_step(output)
    session.close()
    assert turbospark.load(path).step_passes.tolist() == [[7, 2, 1], [0, 0, 0], [7, 2, 1], [7, 2, 1]]
