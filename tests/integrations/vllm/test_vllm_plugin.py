"""The vLLM plugin's parts that need no vLLM: the entry point, the no-op, the request table, the refusals,
the ``requests`` key and its loader. Run in every environment (the end-to-end tests are test_vllm.py)."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from childproc import run_python
from vllm_steps import new, step

import turbospark
from turbospark.vllm import _checks
from turbospark.vllm._data_parallel import RankRows, own_offset
from turbospark.vllm._recorder import requests_key
from turbospark.vllm._requests import RequestTable


def test_entry_point_is_registered() -> None:
    if sys.version_info >= (3, 10):
        points = importlib.metadata.entry_points(group="vllm.general_plugins")
    else:  # 3.9: a dict of groups, without group=
        points = importlib.metadata.entry_points().get("vllm.general_plugins", [])
    # A set: 3.9 lists a distribution once per place it is found (a checkout's egg-info and site-packages).
    assert {p.value for p in points if p.name == "turbospark"} == {"turbospark.vllm:register"}


def test_register_is_a_no_op_without_the_variable() -> None:
    code = ("import sys, turbospark.vllm as v; v.register(); "
            "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))")
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[]\n"


def test_table_chunked_prefill_and_decode_share_a_step() -> None:
    table = RequestTable()
    first = table.step(step({"a": 4}, new_reqs=(new("a", 6),)), ["a"])
    assert first.seq.tolist() == [0, 0, 0, 0] and first.runs == ((0, 4, "prompt"),)
    # a: last 2 prompt tokens + nothing else; b arrives.
    mixed = table.step(step({"a": 2, "b": 3}, new_reqs=(new("b", 5),), cached=(("a", 4),)), ["a", "b"])
    assert mixed.seq.tolist() == [0, 0, 1, 1, 1] and mixed.runs == ((0, 5, "prompt"),)
    # a decodes (position 6) while b's prompt continues: decode rows then prompt rows in runner order.
    both = table.step(step({"a": 1, "b": 2}, cached=(("a", 6), ("b", 3))), ["a", "b"])
    assert both.seq.tolist() == [0, 1, 1] and both.runs == ((0, 1, "decode"), (1, 3, "prompt"))
    assert [(e.seq, e.request, e.attempt, e.start, e.prompt) for e in table.entries] == [(0, "a", 0, 0, 6), (1, "b", 0, 0, 5)]


def test_table_prefix_cache_start_and_preemption_rerun() -> None:
    table = RequestTable()
    # 32 of 40 prompt tokens came from the prefix cache: routing starts at 32.
    table.step(step({"r": 8}, new_reqs=(new("r", 40, computed=32),)), ["r"])
    table.step(step({"r": 1}, cached=(("r", 40),)), ["r"])
    table.step(step({"r": 1}, cached=(("r", 41),)), ["r"])
    # Preempted, then resumed from position 0: a new sequence, attempt 1, whose rows cross the prompt end.
    rerun = table.step(step({"r": 42}, cached=(("r", 0),)), ["r"])
    assert set(rerun.seq.tolist()) == {1}
    assert rerun.runs == ((0, 40, "prompt"), (40, 42, "decode"))
    assert [(e.seq, e.attempt, e.start) for e in table.entries] == [(0, 0, 32), (1, 1, 0)]
    # Resumed as a new request (the runner dropped its state): attempt 2.
    table.step(step({"r": 3}, new_reqs=(new("r", 40, computed=40),)), ["r"])
    assert [(e.seq, e.attempt, e.start) for e in table.entries][-1] == (2, 2, 40)


def test_table_repeated_layout_reuses_tags_and_catches_up() -> None:
    table = RequestTable()
    table.step(step({"a": 3, "b": 2}, new_reqs=(new("a", 3), new("b", 2))), ["a", "b"])
    first = table.step(step({"a": 1, "b": 1}, cached=(("a", 3), ("b", 2))), ["a", "b"])
    assert first.seq.tolist() == [0, 1] and first.runs == ((0, 2, "decode"),)
    # The same layout, each request where the last step left it: the same tags, not recomputed.
    assert table.step(step({"a": 1, "b": 1}, cached=(("a", 4), ("b", 3))), ["a", "b"]) is first
    assert table.step(step({"a": 1, "b": 1}, cached=(("a", 5), ("b", 4))), ["a", "b"]) is first
    # Another runner order: the general path, from positions brought up to date (a at 6, b at 5).
    swapped = table.step(step({"a": 1, "b": 1}, cached=(("a", 6), ("b", 5))), ["b", "a"])
    assert swapped is not first and swapped.seq.tolist() == [1, 0]
    assert table.step(step({"a": 1, "b": 1}, cached=(("a", 7), ("b", 6))), ["b", "a"]) is swapped
    # b is preempted and resumed at 2 while the layout repeats: a rerun (seq 2), never the old tags.
    rerun = table.step(step({"a": 1, "b": 1}, cached=(("a", 8), ("b", 2))), ["b", "a"])
    assert rerun.seq.tolist() == [2, 0] and rerun.runs == ((0, 2, "decode"),)
    # a finished after reaching 9, then b's next decode: the general path drops a.
    alone = table.step(step({"b": 1}, cached=(("b", 3),), finished=("a",)), ["b"])
    assert alone.seq.tolist() == [2]
    assert [(e.seq, e.request, e.attempt, e.start) for e in table.entries] == [(0, "a", 0, 0), (1, "b", 0, 0),
                                                                               (2, "b", 1, 2)]
    # A step ahead of where the last one left a request is not the repeated layout either.
    table.step(step({"b": 1}, cached=(("b", 4),)), ["b"])
    ahead = table.step(step({"b": 1}, cached=(("b", 9),)), ["b"])
    assert ahead is not alone and ahead.seq.tolist() == [2] and len(table.entries) == 3


def test_table_an_id_used_again_after_it_finished_is_a_new_request() -> None:
    table = RequestTable()
    table.step(step({"x": 3}, new_reqs=(new("x", 3),)), ["x"])
    table.step(step({"x": 1}, cached=(("x", 3),)), ["x"])
    # x finished; the same id sent again (VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1) is a new request: attempt 0.
    again = table.step(step({"x": 2}, new_reqs=(new("x", 2),), finished=("x",)), ["x"])
    assert again.seq.tolist() == [1, 1] and again.runs == ((0, 2, "prompt"),)
    # It decodes on as seq 1 (the finished request's state was dropped before the new one's was made).
    assert table.step(step({"x": 1}, cached=(("x", 2),)), ["x"]).seq.tolist() == [1]
    assert [(e.seq, e.request, e.attempt, e.start, e.prompt) for e in table.entries] == [(0, "x", 0, 0, 3),
                                                                                         (1, "x", 0, 0, 2)]
    # Preempted and rerun, it is still attempt 1 of the new request.
    table.step(step({"x": 3}, cached=(("x", 0),)), ["x"])
    assert [(e.seq, e.attempt, e.start) for e in table.entries][-1] == (2, 1, 0)
    # Sent again a step after its finish was reported: a new request too, never a rerun (attempt 1).
    later = RequestTable()
    later.step(step({"y": 2}, new_reqs=(new("y", 2),)), ["y"])
    later.step(step({"z": 2}, new_reqs=(new("z", 2),), finished=("y",)), ["z"])
    later.step(step({"y": 4, "z": 1}, new_reqs=(new("y", 4),), cached=(("z", 2),)), ["z", "y"])
    assert [(e.seq, e.request, e.attempt, e.prompt) for e in later.entries] == [(0, "y", 0, 2), (1, "z", 0, 2),
                                                                                (2, "y", 0, 4)]


def test_table_refuses_an_unknown_request() -> None:
    with pytest.raises(RuntimeError, match="request 'x' was scheduled before its first step was seen"):
        RequestTable().step(step({"x": 1}, cached=(("x", 3),)), ["x"])


@pytest.mark.parametrize("raw, seconds", [(None, 10.0), ("2.5", 2.5), ("0", 0.0)])
def test_shutdown_grace_setting(raw: Any, seconds: float) -> None:
    from turbospark.vllm._shutdown import grace_seconds

    assert grace_seconds({} if raw is None else {"TURBOSPARK_VLLM_SHUTDOWN_GRACE": raw}) == seconds


@pytest.mark.parametrize("raw", ["-1", "soon", "inf"])
def test_shutdown_grace_refuses_a_bad_value(raw: str) -> None:
    from turbospark.vllm._shutdown import grace_seconds

    with pytest.warns(RuntimeWarning) as caught:
        assert grace_seconds({"TURBOSPARK_VLLM_SHUTDOWN_GRACE": raw}) == 10.0
    assert [str(w.message) for w in caught] == [
        f"ignoring TURBOSPARK_VLLM_SHUTDOWN_GRACE={raw!r}: not a number of seconds >= 0; using 10"]


def worker(**overrides: Any) -> Any:
    parallel = SimpleNamespace(pipeline_parallel_size=overrides.pop("pp", 1), data_parallel_size=overrides.pop("dp", 1),
                               tensor_parallel_size=overrides.pop("tp", 1), all2all_backend="allgather_reducescatter",
                               use_sequence_parallel_moe=overrides.pop("sp", False), enable_dbo=overrides.pop("dbo", False),
                               ubatch_size=0, prefill_context_parallel_size=overrides.pop("pcp", 1))
    parallel.use_ubatching = parallel.enable_dbo
    config = SimpleNamespace(speculative_config=overrides.pop("spec", None), parallel_config=parallel)
    return SimpleNamespace(vllm_config=config, use_v2_model_runner=overrides.pop("v2", False))


@pytest.mark.parametrize(
    "setup, message",
    [
        (dict(v2=True), "turbospark: vLLM's V2 model runner is in use (VLLM_USE_V2_MODEL_RUNNER, the default on GPUs "
                        "with Triton): the plugin reads each step's token order from the V1 runner, so it cannot tag "
                        "the V2 runner's rows; set VLLM_USE_V2_MODEL_RUNNER=0, or unset TURBOSPARK_ROUTER_HIST to run "
                        "without recording"),
        (dict(spec=object()), "turbospark: speculative decoding is on (speculative_config): the target model routes "
                              "every draft token, accepted or not, so rejected drafts would be recorded as passes; run "
                              "without --speculative-config, or unset TURBOSPARK_ROUTER_HIST to run without recording"),
        (dict(pp=2), "turbospark: pipeline_parallel_size=2: each stage routes only its own layers and the plugin "
                     "writes whole-model captures; use pipeline_parallel_size=1, or unset TURBOSPARK_ROUTER_HIST to "
                     "run without recording"),
        (dict(pcp=2), "turbospark: prefill_context_parallel_size=2: each prefill context-parallel rank routes its "
                      "own share of a prompt's tokens, while the plugin tags a step's rows from the whole step's "
                      "requests; use prefill_context_parallel_size=1 (--prefill-context-parallel-size), or unset "
                      "TURBOSPARK_ROUTER_HIST to run without recording"),
        (dict(dp=2, tp=2, sp=True),
         "turbospark: sequence-parallel MoE is on (enable_expert_parallel with tensor_parallel_size=2, "
         "data_parallel_size=2 and all2all_backend='allgather_reducescatter'): each tensor-parallel rank routes its own "
         "share of the step's tokens and only TP rank 0 records; use tensor_parallel_size=1 or drop "
         "--enable-expert-parallel, or unset TURBOSPARK_ROUTER_HIST to run without recording"),
        (dict(dp=2, dbo=True),
         "turbospark: micro-batching is on (enable_dbo=True, ubatch_size=0) with data_parallel_size=2: each "
         "micro-batch routes its share of a step separately and writes the same rows, which only the last one's would "
         "hold; run without --enable-dbo and --ubatch-size, or unset TURBOSPARK_ROUTER_HIST to run without recording"),
    ],
)
def test_refusals_name_the_setting(setup: dict[str, Any], message: str) -> None:
    with pytest.raises(_checks.Refused) as info:
        _checks.check_engine(worker(**setup))
    assert str(info.value) == message


def test_supported_engine_passes() -> None:
    assert _checks.check_engine(worker()) is None
    # Data parallel alone, and micro-batching or sequence-parallel flags that only act with it, pass.
    assert _checks.check_engine(worker(dp=2)) is None
    assert _checks.check_engine(worker(dbo=True)) is None


@pytest.mark.parametrize(
    "low, high, total, counts, rank, offset",
    [
        # Local rows (a modular kernel routes before its dispatch): this rank's part, padded or not.
        (7, 7, 7, [7, 8], 0, 0),
        (8, 8, 8, [7, 8], 1, 0),
        (16, 16, 13, [16, 16], 1, 0),
        # Gathered rows (the runner's naive dispatch): every rank's part in DP-rank order.
        (15, 15, 7, [7, 8], 0, 0),
        (15, 15, 8, [7, 8], 1, 7),
        (12, 12, 1, [10, 1, 1], 2, 11),
        # Gathered and padded to the largest part (CUDA graphs): this rank's tokens open its part.
        (48, 48, 3, [16, 16, 16], 2, 32),
        (48, 48, 16, [16, 16, 16], 1, 16),
        # The other ranks have no rows: both layouts are the same rows.
        (5, 5, 5, [0, 5], 1, 0),
    ],
)
def test_data_parallel_offset(low: int, high: int, total: int, counts: list[int], rank: int, offset: int) -> None:
    assert own_offset(low, high, total, counts, rank) == offset


@pytest.mark.parametrize(
    "low, high, total, counts, rank",
    [
        (7, 15, 7, [7, 8], 0),  # the layers disagree
        (-1, 15, 8, [7, 8], 1),  # a layer never called capture_fn
        (7, 7, 8, [7, 8], 0),  # fewer rows than the step's tokens
        (15, 15, 8, [7, 7], 1),  # this rank's part is shorter than the step
        (14, 14, 7, [7, 8], 0),  # neither this rank's part nor all of them
        (7, 7, 7, None, 0),  # the step reported no counts
    ],
)
def test_data_parallel_offset_refused(low: int, high: int, total: int, counts: Any, rank: int) -> None:
    assert own_offset(low, high, total, counts, rank) is None


def test_data_parallel_rows_of_each_forward() -> None:
    import numpy as np

    class Runner:
        across: Any = np.array([7, 8], dtype=np.int32)

        def _determine_batch_execution_and_padding(self, **kwargs: Any) -> tuple[Any, ...]:
            return ("mode", "descriptor", False, self.across, kwargs)

    runner = Runner()
    rows = memoryview(np.array([9, 9], dtype=np.int64))
    not_written = memoryview(np.full(2, -1, dtype=np.int64))
    def mark_unwritten() -> None:
        rows[:] = not_written

    ranks = RankRows(runner, 1, mark_unwritten)
    # The runner's answer passes through; the counts are noted and every layer's rows marked unwritten.
    assert runner._determine_batch_execution_and_padding(num_tokens=8) == ("mode", "descriptor", False, runner.across,
                                                                           {"num_tokens": 8})
    assert rows.tolist() == [-1, -1]
    rows[:] = memoryview(np.array([15, 15], dtype=np.int64))
    assert ranks.offset(rows, 8) == 7
    # A step takes the counts of the forward before it, once: a step without a forward places nothing.
    assert ranks.offset(rows, 8) is None
    assert ranks.refusal([15, 15], 8) == (
        "turbospark: data-parallel rank 1 ran a step of 8 tokens without the per-rank token counts "
        "(num_tokens_across_dp) vLLM's runner reports before each forward; the rows of the MoE layers ([15, 15]) "
        "cannot be attributed")
    runner._determine_batch_execution_and_padding(num_tokens=8)
    rows[:] = memoryview(np.array([14, 14], dtype=np.int64))
    assert ranks.offset(rows, 8) is None
    assert ranks.refusal(rows.tolist(), 8) == (
        "turbospark: data-parallel rank 1: the MoE layers routed [14, 14] rows for a step of 8 tokens, with [7, 8] "
        "tokens per DP rank: neither this rank's own rows (8) nor every rank's gathered rows (15); this dispatch "
        "layout is not supported")
    # A dummy batch (an idle rank keeping the collectives in lockstep) runs a forward too: its rows are
    # unwritten for the next step until that step's forward writes them.
    Runner.across = np.array([1, 1], dtype=np.int32)
    runner._determine_batch_execution_and_padding(num_tokens=1)
    assert rows.tolist() == [-1, -1]


CAPTURE = ('{"num_layers":1,"num_experts":4,"top_k":1,"counts":[[1,1,1,0]],"trace":[[0,1,2]],'
           '"seq":[[0,1,1]],"phase":[[0,0,1]]')


def test_requests_key_round_trips() -> None:
    table = RequestTable()
    table.step(step({"a-1234abcd": 1, "b\"q-00000000": 2}, new_reqs=(new("a-1234abcd", 1), new("b\"q-00000000", 1))),
               ["a-1234abcd", "b\"q-00000000"])
    key = requests_key(table.entries)
    assert key == (b',"requests":[{"seq":0,"request":"a-1234abcd","attempt":0,"start":0,"prompt":1},'
                   b'{"seq":1,"request":"b\\"q-00000000","attempt":0,"start":0,"prompt":1}]')
    cap = turbospark.loads(CAPTURE.encode() + key + b"}")
    assert cap.requests == tuple(table.entries)
    assert cap.requests[1].request == 'b"q-00000000'


@pytest.mark.parametrize(
    "value, message",
    [
        ("{}", "requests must be a list of objects, got {}"),
        ('[{"seq":0}]', "requests[0] must be an object with keys seq, request, attempt, start, prompt, got {'seq': 0}"),
        ('[{"seq":0,"request":5,"attempt":0,"start":0,"prompt":1}]', "requests[0].request must be a string, got 5"),
        ('[{"seq":0,"request":"a","attempt":-1,"start":0,"prompt":1}]',
         "requests[0].attempt must be a non-negative integer, got -1"),
        ('[{"seq":1,"request":"a","attempt":0,"start":0,"prompt":1}]',
         "requests[0].seq must be 0 (entries are listed by sequence id), got 1"),
        ('[{"seq":0,"request":"a","attempt":0,"start":0,"prompt":1}]',
         "seq holds sequence id 1, but requests describes only 1 sequences"),
    ],
)
def test_requests_key_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        turbospark.loads(CAPTURE + ',"requests":' + value + "}")
    assert str(info.value) == message


def test_capture_without_requests_key() -> None:
    assert turbospark.loads(CAPTURE + "}").requests is None
    json.loads(CAPTURE + "}")


def test_a_streamed_capture_keeps_the_requests_map_through_export(tmp_path: Any) -> None:
    import io

    from turbospark.outputs.export_json import write_json
    from turbospark.capture.reader import Request
    from turbospark.vllm._recorder import VllmRecorder

    entries = [Request(0, "a-1234abcd", 0, 0, 1), Request(1, 'b"q-00000000', 1, 3, 4)]
    for name, trace in (("m.json", True), ("s.json", "stream")):
        hist = VllmRecorder(str(tmp_path / name), 1, 4, 1, trace=trace)
        hist.request_entries = list(entries)
        hist.record_batch(0, [[0], [1]], seq=[0, 1], phase="prompt")
        hist.close()
    streamed = turbospark.load(tmp_path / "s.json")
    assert streamed.requests == tuple(entries)
    out = io.BytesIO()
    write_json(streamed, out)
    assert out.getvalue() == (tmp_path / "m.json").read_bytes()


def test_a_signal_writes_the_live_recorders_only(tmp_path: Any) -> None:
    """Two engines in one process, one after the other, both recording to one path: the first one deleted is
    written by its own end (the handler holds it weakly), and a SIGTERM then writes the live one's capture,
    once, never the deleted one's over it."""
    import gc
    import os
    import signal
    import weakref

    from turbospark.vllm import _signals

    path = tmp_path / "cap.json"
    fired: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, lambda number, frame: fired.append(number))
    try:
        first = turbospark.RouterHistogram(str(path), 1, 4, 1)
        first.record(0, [0])
        _signals.write_before_exit(first)
        gone = weakref.ref(first)
        del first
        gc.collect()
        assert gone() is None
        # Dropped, it wrote its capture (one pass).
        assert turbospark.load(path).counts.tolist() == [[1, 0, 0, 0]]
        second = turbospark.RouterHistogram(str(path), 1, 4, 1)
        second.record(0, [3])
        second.record(0, [3])
        _signals.write_before_exit(second)
        handler = signal.getsignal(signal.SIGTERM)
        _signals.write_before_exit(second)
        assert signal.getsignal(signal.SIGTERM) is handler  # one handler of ours, not one per engine
        assert _signals.watched() == [second]
        os.kill(os.getpid(), signal.SIGTERM)
        assert fired == [signal.SIGTERM]
        assert turbospark.load(path).counts.tolist() == [[0, 0, 0, 2]]
        # A recorder forgotten (its worker shut down) is no longer written by a signal.
        _signals.forget(second)
        assert _signals.watched() == []
        second.discard()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
