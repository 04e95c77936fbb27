"""record_batch: per-pass sequence ids and phases in the recorder, the JSON, the loader and the CLI."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from childproc import run_with_files
from conftest import require_module
from readme_blocks import block

import turbospark
from turbospark import cli

BLOCK = np.array([[0, 1], [2, 3], [-1, -1]])
KEEP = np.array([True, True, False])


def test_record_batch_json_exact(make: Any) -> None:
    hist = make(2, 4, 2, trace=True)
    hist.record(0, [1, 2])
    hist.record_batch(0, BLOCK, seq=[5, 6, 7], phase="prompt", mask=KEEP)
    hist.record(1, [0, 3])
    hist.record_batch(1, [[3, 2]], seq=np.array([6], dtype=np.uint8), phase="decode")
    hist.record(0, [3, 0])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":4,"top_k":2,"counts":[[2,2,2,2],[1,0,1,2]],'
        '"trace":[[1,2,0,1,2,3,3,0],[0,3,3,2]],'
        '"seq":[[0,5,6,0],[0,6]],"phase":[[1,0,0,1],[1,1]]}'
    )


def test_seq_and_phase_come_after_router_logits(make: Any) -> None:
    hist = make(1, 3, 1, router_logits=(0, 0))
    hist.record_router_logits(0, [0.5, 1.0, 2.0])
    hist.record_batch(0, [[2]], seq=[9], phase="prompt")
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":3,"top_k":1,"counts":[[0,0,1]],'
        '"router_logits":{"layer":0,"pass":0,"values":[0.5,1,2]},"seq":[[9]],"phase":[[0]]}'
    )


def test_counts_and_trace_equal_record_many_of_the_kept_rows(make: Any) -> None:
    rng = np.random.default_rng(1)
    batched = make(3, 8, 2, trace=True, name="a.json")
    plain = make(3, 8, 2, trace=True, name="b.json")
    for _ in range(30):
        layer = int(rng.integers(3))
        ids = rng.integers(0, 8, size=(int(rng.integers(1, 5)), 2))
        keep = rng.random(ids.shape[0]) < 0.7
        ids[~keep] = -1
        batched.record_batch(layer, ids, seq=np.arange(ids.shape[0]), phase="decode", mask=keep)
        plain.record_many(layer, ids[keep])
    assert np.array_equal(batched.counts, plain.counts)
    head = plain.to_json()[:-1]
    assert batched.to_json().startswith(head + ',"seq":[')


def test_unused_keeps_reference_json(make: Any) -> None:
    hist = make(1, 3, 2, trace=True)
    hist.record_many(0, [[0, 1]])
    # A call that records no row (everything masked) leaves no sequence information.
    hist.record_batch(0, [[-1, -1]], seq=[0], phase="decode", mask=[False])
    assert hist.to_json() == '{"num_layers":1,"num_experts":3,"top_k":2,"counts":[[1,1,0]],"trace":[[0,1]]}'


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"seq": [0, 1, 2], "phase": "prefill"}, ValueError, "phase must be 'prompt' or 'decode', got 'prefill'"),
        ({"seq": [0, 1, 2], "phase": 1}, ValueError, "phase must be 'prompt' or 'decode', got 1"),
        ({"seq": [0, -4, 2], "phase": "decode"}, ValueError, "seq holds a negative sequence id -4"),
        ({"seq": [0, 1], "phase": "decode"}, ValueError, "seq has 2 entries, expected one per row (3)"),
        ({"seq": [[0, 1, 2]], "phase": "decode"}, ValueError, "seq must be 1-D with one id per row, got shape (1, 3)"),
        ({"seq": [0, 1.5, 2], "phase": "decode"}, TypeError, "seq must hold integers, found float 1.5 at row 1"),
        ({"seq": np.array([0, 1.5, 2]), "phase": "decode"}, TypeError, "seq must hold integers, got dtype float64"),
        ({"seq": [0, True, 2], "phase": "decode"}, TypeError, "seq must hold integers, found bool True at row 1"),
        ({"seq": "abc", "phase": "decode"}, TypeError, "seq must be a sequence of non-negative integers, got str 'abc'"),
        ({"seq": [0, 1, 2], "phase": "decode", "mask": [1, 1, 0]}, TypeError, "mask must be boolean, got dtype int64"),
        ({"seq": [0, 1, 2], "phase": "decode", "mask": [True]}, ValueError, "mask must be 1-D with one entry per row (3), got shape (1,)"),
        ({"seq": [0, 1, 2], "phase": "decode"}, ValueError, "expert id -1 at position (2, 0) is out of range for 4 experts"),
    ],
)
def test_rejected_call_records_nothing(make: Any, kwargs: dict[str, Any], error: type, message: str) -> None:
    hist = make(2, 4, 2, trace=True)
    hist.record_batch(0, [[1, 2]], seq=[3], phase="prompt")
    before = hist.to_json()
    with pytest.raises(error) as info:
        hist.record_batch(0, BLOCK, **kwargs)
    assert message in str(info.value)
    assert hist.to_json() == before


def test_bad_layer_and_closed(make: Any) -> None:
    hist = make(2, 4, 2)
    with pytest.raises(IndexError, match="layer 2 is out of range"):
        hist.record_batch(2, [[0, 1]], seq=[0], phase="decode")
    hist.discard()
    with pytest.raises(ValueError, match="closed"):
        hist.record_batch(0, [[0, 1]], seq=[0], phase="decode")


def test_caller_buffers_are_copied(make: Any) -> None:
    hist = make(1, 4, 2, trace=True)
    ids = np.array([[0, 1], [2, 3]])
    seq = np.array([4, 5])
    hist.record_batch(0, ids, seq=seq, phase="decode")
    ids[:] = 3
    seq[:] = 0
    assert hist.to_json().endswith('"trace":[[0,1,2,3]],"seq":[[4,5]],"phase":[[1,1]]}')


class _FakeDeviceTensor:
    """Looks like a CUDA tensor to the device check (no torch needed)."""

    class device:  # noqa: N801 -- mirrors torch.device's attribute
        type = "cuda"

        def __str__(self) -> str:
            return "cuda:0"

    device = device()  # type: ignore[assignment, misc]

    def data_ptr(self) -> int:
        return 0


@pytest.mark.parametrize("argument", ["ids_2d", "seq", "mask"])
def test_device_tensors_point_to_the_device_path(make: Any, argument: str) -> None:
    hist = make(1, 4, 2)
    kwargs: dict[str, Any] = {"ids_2d": [[0, 1]], "seq": [0], "phase": "decode", "mask": None}
    kwargs[argument] = _FakeDeviceTensor()
    with pytest.raises(TypeError, match="device 'cuda:0'.*turbospark.torch.DeviceRecorder"):
        hist.record_batch(0, **kwargs)


def test_cpu_tensors(make: Any) -> None:
    torch = require_module("torch")
    hist = make(1, 4, 2, trace=True)
    ids = torch.tensor([[0, 1], [-1, -1], [3, 2], [1, 1]], dtype=torch.int16)[::1]
    hist.record_batch(0, ids, seq=torch.tensor([7, 8, 9, 7]), phase="prompt",
                      mask=torch.tensor([True, False, True, True]))
    assert hist.to_json().endswith('"trace":[[0,1,3,2,1,1]],"seq":[[7,9,7]],"phase":[[0,0,0]]}')


# ------------------------------------------------------------------ loading


DOC = (
    '{"num_layers":2,"num_experts":4,"top_k":2,"counts":[[2,2,2,2],[1,0,1,2]],'
    '"trace":[[1,2,0,1,2,3,3,0],[0,3,3,2]],"seq":[[0,5,6,0],[0,6]],"phase":[[1,0,0,1],[1,1]]}'
)


def test_load_reads_seq_and_phase() -> None:
    capture = turbospark.loads(DOC)
    assert [row.tolist() for row in capture.seq] == [[0, 5, 6, 0], [0, 6]]
    assert [row.tolist() for row in capture.phase] == [[1, 0, 0, 1], [1, 1]]
    assert all(row.dtype == np.int64 for row in capture.seq + capture.phase)
    assert turbospark.loads(DOC.replace(',"seq":[[0,5,6,0],[0,6]],"phase":[[1,0,0,1],[1,1]]', "")).seq is None


def test_load_without_trace_counts_passes_from_counts() -> None:
    doc = '{"num_layers":1,"num_experts":3,"top_k":1,"counts":[[1,0,1]],"seq":[[4,4]],"phase":[[0,1]]}'
    assert turbospark.loads(doc).phase[0].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("\"phase\":[[1,0,0,1],[1,1]]", '"phase2":[]'), "'seq' is present without 'phase'"),
        (("\"seq\":[[0,5,6,0],[0,6]]", '"seq2":[]'), "'phase' is present without 'seq'"),
        (("[0,5,6,0],[0,6]", "[0,5,6,0]"), "seq has 1 rows, expected num_layers=2"),
        (("[0,5,6,0],[0,6]", "[0,5,6],[0,6]"), "seq[0] has 3 entries, expected one per pass of the layer (4)"),
        (("[1,0,0,1],[1,1]", "[1,0,0,1],[1,1,1]"), "phase[1] has 3 entries, expected one per pass of the layer (2)"),
        (("[1,0,0,1],[1,1]", "[1,0,2,1],[1,1]"), "phase[0] holds 2; a phase is 0 (prompt) or 1 (decode)"),
        (("[0,5,6,0],[0,6]", "[0,5,-6,0],[0,6]"), "seq[0] holds a negative value -6"),
        (("[0,5,6,0],[0,6]", '[0,5,"6",0],[0,6]'), "seq[0] must hold integers only, found '6'"),
    ],
)
def test_malformed_additions(tmp_path: Any, capfd: Any, change: tuple[str, str], message: str) -> None:
    doc = DOC.replace(*change)
    assert doc != DOC
    with pytest.raises(ValueError) as info:
        turbospark.loads(doc)
    assert message in str(info.value)
    path = tmp_path / "bad.json"
    path.write_text(doc)
    assert cli.main(["analyze", str(path)]) == 2
    assert message in capfd.readouterr().err


def test_written_file_round_trips(make: Any) -> None:
    hist = make(1, 4, 2, trace=True)
    hist.record_batch(0, [[0, 1], [2, 3]], seq=[1, 0], phase="prompt")
    hist.close()
    capture = turbospark.load(hist.path)
    assert capture.seq[0].tolist() == [1, 0] and capture.phase[0].tolist() == [0, 0]
    assert json.loads(hist.to_json())["seq"] == [[1, 0]]


def test_readme_format_example(make: Any) -> None:
    example = block('"seq":[[7,9]]').strip()
    hist = make(1, 4, 2, trace=True)
    hist.record_batch(0, [[0, 1], [-1, -1], [2, 3]], seq=[7, 8, 9], phase="prompt", mask=[True, False, True])
    assert hist.to_json() == example
    assert turbospark.loads(example).seq[0].tolist() == [7, 9]


def test_an_error_in_a_masked_batch_names_the_row_as_the_caller_numbered_it(make: Any) -> None:
    hist = make(1, 4, 2, trace=True)
    with pytest.raises(ValueError) as info:
        hist.record_batch(0, [[0, 1], [-1, -1], [2, 9]], seq=[7, 8, 9], phase="decode", mask=[True, False, True])
    assert str(info.value) == "expert id 9 at position (2, 1) is out of range for 4 experts"
    assert hist.to_json() == '{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[0,0,0,0]],"trace":[[]]}'


def test_a_dropped_row_may_carry_any_sequence_id(make: Any) -> None:
    # Padding rows often carry -1 everywhere, their sequence id included.
    hist = make(1, 4, 2, trace=True)
    hist.record_batch(0, [[0, 1], [-1, -1], [2, 3]], seq=[7, -1, 9], phase="decode", mask=[True, False, True])
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[1,1,1,1]],"trace":[[0,1,2,3]],"seq":[[7,9]],"phase":[[1,1]]}'
    )
    with pytest.raises(ValueError, match="seq holds a negative sequence id -1"):
        hist.record_batch(0, [[0, 1]], seq=[-1], phase="decode", mask=[True])


@pytest.mark.parametrize(("dropped", "message"), [
    ("x", "seq must hold integers, found str 'x' at row 1"),
    (True, "seq must hold integers, found bool True at row 1"),
    (np.True_, "seq must hold integers, found bool np.True_ at row 1"),
    (None, "seq must hold integers, found NoneType None at row 1"),
    (1.5, "seq must hold integers, found float 1.5 at row 1"),
])
def test_a_dropped_rows_sequence_id_must_still_be_an_integer_on_both_cores(
        cores: Any, tmp_path: Any, dropped: Any, message: str) -> None:
    # One rule for both cores: the compiled one used to record these (it skipped dropped
    # entries), the pure one raised TypeError for some and recorded others.
    for cls in cores:
        hist = cls(str(tmp_path / "c.json"), 1, 4, 2, trace=True)
        hist.record_batch(0, [[1, 2]], seq=[3], phase="prompt")
        before = hist.to_json()
        for seq in ([7, dropped, 9], np.array([7, dropped, 9], dtype=object)):
            with pytest.raises(TypeError) as info:
                hist.record_batch(0, [[0, 1], [-1, -1], [2, 3]], seq=seq, phase="decode", mask=[True, False, True])
            assert str(info.value) == message
            assert hist.to_json() == before
        hist.discard()


@pytest.mark.parametrize("dropped", [-1, 2**63, 2**64, -2**63 - 1, np.int64(-1), np.uint64(2**63)])
def test_a_dropped_rows_sequence_id_may_be_any_integer_on_both_cores(cores: Any, tmp_path: Any, dropped: Any) -> None:
    for cls in cores:
        for seq in ([7, dropped, 9], np.array([7, dropped, 9], dtype=object)):
            hist = cls(str(tmp_path / "c.json"), 1, 4, 2, trace=True)
            hist.record_batch(0, [[0, 1], [-1, -1], [2, 3]], seq=seq, phase="decode", mask=[True, False, True])
            assert hist.to_json() == ('{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[1,1,1,1]],'
                                      '"trace":[[0,1,2,3]],"seq":[[7,9]],"phase":[[1,1]]}')
            hist.discard()
        hist = cls(str(tmp_path / "c.json"), 1, 4, 2, trace=True)
        with pytest.raises(ValueError) as info:
            hist.record_batch(0, [[0, 1]], seq=[2**63], phase="decode")
        assert str(info.value) == "seq holds a sequence id too large for int64: 9223372036854775808"
        hist.discard()


def test_plain_records_from_another_thread_never_take_a_batchs_sequence_ids(make: Any) -> None:
    # The core says where a batch's passes start as it commits them.
    # (Regression: record_batch read the pass count after the commit, so a
    # plain record_many landing in between shifted the tags by a pass.)
    import sys
    import threading

    hist = make(1, 4, 1, trace=True)
    calls = 5000

    def plain() -> None:
        for _ in range(calls):
            hist.record_many(0, [[2]])

    def batched() -> None:
        for _ in range(calls):
            hist.record_batch(0, [[1]], seq=[1], phase="prompt")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=plain), threading.Thread(target=batched)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    doc = json.loads(hist.to_json())
    trace = doc["trace"][0]
    assert sorted(trace) == [1] * calls + [2] * calls
    # Expert 1 passes are the batch's: sequence 1, prompt; the plain ones read as sequence 0, decode.
    assert doc["seq"][0] == [1 if expert == 1 else 0 for expert in trace]
    assert doc["phase"][0] == [0 if expert == 1 else 1 for expert in trace]


def test_writes_while_another_thread_records_neither_spin_nor_split_tags(tmp_path: Any) -> None:
    # Issue 16 item 1: after a record_batch, to_json() retried until the core's
    # pass counts held still, so it spun for as long as another thread kept
    # recording (and SIGTERM, which writes, hung). Now one read of the core
    # gives counts, trace and tags together: every document is consistent.
    result, (path,) = run_with_files(
        tmp_path,
        """
        import json, threading
        hist = R(path, 1, 8, 2, trace=True)
        hist.record_batch(0, [[0, 1]], seq=[3], phase="prompt")
        stop = threading.Event()

        def spin():
            i = 0
            while not stop.is_set():
                if i % 2:
                    hist.record_many(0, [[2, 3], [4, 5]])
                else:
                    hist.record_batch(0, [[6, 7]], seq=[i], phase="decode")
                i += 1

        sys.setswitchinterval(1e-6)
        worker = threading.Thread(target=spin)
        worker.start()
        signal.alarm(20)  # a spinning write ends the child instead of the suite
        for _ in range(10):
            doc = json.loads(hist.to_json())
            passes = len(doc["trace"][0]) // 2
            assert len(doc["seq"][0]) == len(doc["phase"][0]) == passes, doc
            assert sum(doc["counts"][0]) == 2 * passes, doc
        stop.set()
        worker.join()
        hist.discard()
        print("consistent", doc["seq"][0][0], doc["phase"][0][0])
        """,
        {"path": "c.json"},
    )
    assert (result.returncode, result.stdout) == (0, "consistent 3 0\n"), result.stderr
