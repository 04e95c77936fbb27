"""``turbospark.capture.reader.load``: arrays, shapes, both parse paths, and a ValueError naming each malformation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark.capture import reader as capture_module
from turbospark.capture.reader import Capture, load, loads
from capture_helpers import RUST_COUNTS, RUST_PILOT, RUST_TRACE


def compact(doc: dict[str, Any]) -> str:
    """The recorder's layout: keys in insertion order, no spaces."""
    return json.dumps(doc, separators=(",", ":"))


def rows(arrays: Any) -> list[list[list[int]]]:
    return [a.tolist() for a in arrays]


def test_counts_only_capture() -> None:
    cap = loads(RUST_COUNTS)
    assert cap.header == {"num_layers": 2, "num_experts": 3, "top_k": 2}
    assert cap.counts.dtype == np.int64
    assert cap.counts.tolist() == [[1, 1, 2], [0, 2, 0]]
    assert cap.totals.tolist() == [4, 2]
    assert cap.trace is None and cap.pred is None and cap.router_logits is None


def test_trace_rows_become_passes_by_top_k() -> None:
    cap = loads(RUST_TRACE)
    assert [a.shape for a in cap.trace] == [(2, 2), (1, 2)]
    assert rows(cap.trace) == [[[2, 0], [2, 1]], [[1, 1]]]
    assert cap.trace[0].dtype == np.int64


def test_prediction_row_zero_is_empty_with_shape_zero_by_k() -> None:
    cap = loads(RUST_PILOT)
    assert cap.pred[0].shape == (0, 2)
    assert rows(cap.pred) == [[], [[1, 2]]]


def test_dense_layer_and_top_k_zero_shapes() -> None:
    cap = loads('{"num_layers":2,"num_experts":4,"top_k":0,"counts":[[0,0,0,0],[0,0,0,0]],"trace":[[],[]]}')
    assert [a.shape for a in cap.trace] == [(0, 0), (0, 0)]
    dense = loads('{"num_layers":2,"num_experts":2,"top_k":1,"counts":[[0,0],[1,0]],"trace":[[],[0]]}')
    assert [a.shape for a in dense.trace] == [(0, 1), (1, 1)]


def test_zero_layers() -> None:
    cap = loads('{"num_layers":0,"num_experts":8,"top_k":2,"counts":[],"trace":[]}')
    assert cap.counts.shape == (0, 8)
    assert cap.trace == ()


def test_router_logits_values_and_null() -> None:
    doc = RUST_COUNTS[:-1] + ',"router_logits":{"layer":1,"pass":1,"values":[3.5,2.5,1.5]}}'
    logits = loads(doc).router_logits
    assert (logits.layer, logits.pass_index, logits.values.tolist()) == (1, 1, [3.5, 2.5, 1.5])
    empty = loads(RUST_COUNTS[:-1] + ',"router_logits":{"layer":0,"pass":7,"values":null}}')
    assert empty.router_logits.values is None and empty.router_logits.pass_index == 7


def test_router_logits_non_finite_spellings() -> None:
    # The Python recorder writes a non-finite logit as null; the Rust runtime as NaN / inf.
    py = loads(RUST_COUNTS[:-1] + ',"router_logits":{"layer":0,"pass":0,"values":[1.5,null]}}')
    assert py.router_logits.values[0] == 1.5 and math.isnan(py.router_logits.values[1])
    rust = loads(RUST_COUNTS[:-1] + ',"router_logits":{"layer":0,"pass":0,"values":[inf,-inf,NaN,2]}}')
    values = rust.router_logits.values
    assert values[0] == math.inf and values[1] == -math.inf and math.isnan(values[2]) and values[3] == 2.0


def test_pretty_printed_file_matches_compact(tmp_path: Path) -> None:
    doc = json.loads(RUST_PILOT)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(doc, indent=2))
    a, b = load(pretty), loads(RUST_PILOT)
    assert a.counts.tolist() == b.counts.tolist()
    assert rows(a.trace) == rows(b.trace) and rows(a.pred) == rows(b.pred)


def test_key_order_and_unknown_keys_do_not_matter() -> None:
    doc = '{"trace":[[1]],"future_field":{"x":[1,2]},"counts":[[0,1]],"top_k":1,"num_experts":2,"num_layers":1}'
    cap = loads(doc)
    assert cap.counts.tolist() == [[0, 1]] and rows(cap.trace) == [[[1]]]


def test_fast_path_handles_the_recorder_layout_and_agrees_with_json() -> None:
    rng = np.random.default_rng(3)
    trace = [rng.integers(0, 50, size=4 * 30).tolist() for _ in range(3)]
    doc = {
        "num_layers": 3, "num_experts": 50, "top_k": 4,
        "counts": [np.bincount(t, minlength=50).tolist() for t in trace],
        "trace": trace, "pred": [[], trace[1][:40], []],
    }
    raw = compact(doc).encode()
    fast = capture_module._fast_fields(raw)
    assert fast is not None and isinstance(fast["trace"][0], np.ndarray)
    slow = capture_module._build(capture_module._json_fields(raw))
    built = capture_module._build(fast)
    assert built.counts.tolist() == slow.counts.tolist()
    assert rows(built.trace) == rows(slow.trace) and rows(built.pred) == rows(slow.pred)


def test_load_accepts_bytes_str_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(RUST_TRACE)
    for cap in (load(path), load(str(path)), loads(RUST_TRACE), loads(RUST_TRACE.encode())):
        assert isinstance(cap, Capture) and rows(cap.trace) == [[[2, 0], [2, 1]], [[1, 1]]]


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.json")


BASE = json.loads(RUST_COUNTS)


def variant(**changes: Any) -> str:
    doc = dict(BASE)
    for key, value in changes.items():
        if value is _DROP:
            del doc[key]
        else:
            doc[key] = value
    return compact(doc)


_DROP = object()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        (RUST_TRACE[:-5], "not valid JSON"),
        ("[1,2]", "a capture is a JSON object, got list"),
        (variant(counts=_DROP), "missing key 'counts'"),
        (variant(num_layers=_DROP), "missing key 'num_layers'"),
        (variant(num_layers=-1), "num_layers must be a non-negative integer, got -1"),
        (variant(top_k=True), "top_k must be a non-negative integer, got True"),
        (variant(num_experts=3.0), "num_experts must be a non-negative integer, got 3.0"),
        (variant(counts=[[1, 1, 2]]), "counts has 1 rows, expected num_layers=2"),
        (variant(counts=[[1, 1, 2], [0, 2]]), "counts[1] has 2 entries, expected num_experts=3"),
        (variant(counts=[[1, 1, 2], [0, -2, 0]]), "counts[1] holds a negative value -2"),
        (variant(counts=[[1, 1, 2], [0, 2.5, 0]]), "counts[1] must hold integers only, found 2.5"),
        (variant(counts=[[1, 1, 2], [0, True, 0]]), "counts[1] must hold integers only, found True"),
        (variant(counts={"a": 1}), "counts must be a list of rows, got dict"),
        (variant(counts=[[1, 1, 2], 5]), "counts[1] must be a list of integers, got int"),
        (variant(trace=[[2, 0, 2], [1, 1]]), "trace[0] has 3 ids, not a multiple of top_k=2"),
        (variant(trace=[[2, 0, 2, 3], [1, 1]]), "trace[0] holds expert id 3, outside 0..2"),
        (variant(trace=[[2, 0, 2, -1], [1, 1]]), "trace[0] holds expert id -1, outside 0..2"),
        (variant(trace=[[2, 0, 2, 1]]), "trace has 1 rows, expected num_layers=2"),
        (variant(trace=[[2, 0, 2, 1], [1, 10**30]]), "trace[1] holds an integer too large"),
        (variant(trace=[[2, 0, 2, 1], [1, 99999999999999999999]]), "trace[1] holds an integer too large"),
        (variant(pred=[[], [1, 7]]), "pred[1] holds expert id 7, outside 0..2"),
        (variant(pred=[[], [1]]), "pred[1] has 1 ids, not a multiple of top_k=2"),
        (variant(top_k=0, trace=[[1, 2], []]), "trace[0] holds ids but top_k is 0"),
        (variant(router_logits=[1]), "router_logits must be an object, got list"),
        (variant(router_logits={"layer": 5, "pass": 0, "values": None}), "router_logits.layer 5 is not below"),
        (variant(router_logits={"layer": 0, "values": None}), "router_logits.pass must be a non-negative integer (missing)"),
        (variant(router_logits={"layer": None, "pass": 0, "values": None}),
         "router_logits.layer must be a non-negative integer, got None"),
        (variant(router_logits={"layer": 0, "pass": 0, "values": ["x"]}),
         "router_logits.values[0] must be a number or null, found 'x'"),
        (variant(router_logits={"layer": 0, "pass": 0, "values": {"a": 1}}),
         "router_logits.values must be a list of numbers or null, got {'a': 1}"),
    ],
)
def test_malformed_capture_raises_value_error_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        loads(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "trace_text",
    ["[[2,0,2,1],[1,1,]]", "[[2,0,,2,1],[1,1]]", "[[,2,0,2,1],[1,1]]", "[[2,0,2,1],[1,[1]]]", "[[2,0,2,1]],[1,1]]"],
)
def test_broken_integer_rows_are_rejected_not_misread(trace_text: str) -> None:
    # These reach the fast row parser; it must hand them to json, which rejects them.
    text = RUST_COUNTS[:-1] + ',"trace":' + trace_text + "}"
    with pytest.raises(ValueError, match="not valid JSON|must hold integers|must be a list"):
        loads(text)


def test_recorder_written_capture_loads(tmp_path: Path) -> None:
    from turbospark import RouterHistogram

    path = tmp_path / "rec.json"
    with RouterHistogram(str(path), 3, 5, 2, trace=True, pilot="next") as rec:
        for ids in ([0, 1], [1, 4], [4, 0]):
            rec.record(0, ids)
            rec.record_prediction(1, [ids[1], 3])
            rec.record(1, [ids[1], 2])
    cap = load(path)
    assert cap.counts.tolist() == [[2, 2, 0, 0, 2], [1, 1, 3, 0, 1], [0, 0, 0, 0, 0]]
    assert rows(cap.trace) == [[[0, 1], [1, 4], [4, 0]], [[1, 2], [4, 2], [0, 2]], []]
    assert rows(cap.pred) == [[], [[1, 3], [4, 3], [0, 3]], []]


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(0, len(RUST_PILOT) - 1),
    replacement=st.sampled_from(list(',[]0123456789 -.e"{}:') + ["", "99999999999999999999", ",,", "[]"]),
)
def test_a_corrupted_file_parses_as_json_would_or_raises_value_error(position: int, replacement: str) -> None:
    """Whatever the fast path accepts, json.loads + validation accepts identically."""
    text = RUST_PILOT[:position] + replacement + RUST_PILOT[position + 1 :]
    try:
        expected = capture_module._build(capture_module._json_fields(text.encode()))
    except ValueError:
        with pytest.raises(ValueError):
            loads(text)
        return
    got = loads(text)
    assert got.header == expected.header and got.counts.tolist() == expected.counts.tolist()
    for a, b in ((got.trace, expected.trace), (got.pred, expected.pred)):
        assert (a is None) == (b is None)
        if a is not None:
            assert [x.tolist() for x in a] == [x.tolist() for x in b]
            assert [x.shape for x in a] == [x.shape for x in b]


@pytest.mark.parametrize("ids", ["[2,00,2,1]", "[2,0,02,1]", "[007,0,2,1]"])
def test_leading_zeros_are_rejected_as_json_rejects_them(ids: str) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        loads(RUST_COUNTS[:-1] + ',"trace":[' + ids + ",[1,1]]}")


def test_recorder_written_router_logits_load(tmp_path: Path) -> None:
    from turbospark import RouterHistogram

    path = tmp_path / "logits.json"
    with RouterHistogram(str(path), 2, 3, 2, router_logits=(1, 0)) as rec:
        rec.record(0, [0, 1])
        rec.record_router_logits(1, [0.5, -2.5, math.inf])
        rec.record(1, [2, 1])
    logits = load(path).router_logits
    assert (logits.layer, logits.pass_index) == (1, 0)
    assert logits.values[:2].tolist() == [0.5, -2.5] and math.isnan(logits.values[2])


def test_a_negative_zero_logit_round_trips_byte_for_byte(cores: Any, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    # Rust's Display writes the f32 -0.0 as "-0", which json reads as the int 0: the sign was lost
    # at load, so export --to json and merge wrote "0".
    from turbospark.cli import main

    for index, cls in enumerate(cores):
        path = tmp_path / f"c{index}.json"
        hist = cls(str(path), 1, 4, 2, router_logits=(0, 0))
        hist.record_router_logits(0, [-0.0, 0.0, -1.5, 3.0])
        hist.record(0, [0, 1])
        hist.close()
        written = path.read_bytes()
        assert written == (b'{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[1,1,0,0]],'
                           b'"router_logits":{"layer":0,"pass":0,"values":[-0,0,-1.5,3]}}')
        assert np.signbit(load(path).router_logits.values).tolist() == [True, False, True, False]
        assert main(["export", str(path), "--to", "json", "-o", str(tmp_path / "e.json")]) == 0
        assert (tmp_path / "e.json").read_bytes() == written
        other = tmp_path / "o.json"
        other.write_text('{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[0,0,1,1]],'
                         '"router_logits":{"layer":0,"pass":0,"values":null}}')
        assert main(["merge", str(path), str(other), "-o", str(tmp_path / "m.json")]) == 0
        assert (tmp_path / "m.json").read_bytes() == written.replace(b"[[1,1,0,0]]", b"[[1,1,1,1]]")
    capfd.readouterr()


def test_negative_zero_is_a_plain_zero_outside_the_logit_row_on_both_parse_paths() -> None:
    doc = ('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[-0,1]],"trace":[[1]],'
           '"router_logits":{"layer":-0,"pass":-0,"values":[-0,-0.0,0]}%s}')
    for text in (doc % "", doc % ',"note\u00e9":-0'):  # a non-ASCII byte takes json.loads' path
        cap = loads(text.encode("utf-8"))
        assert cap.counts.tolist() == [[0, 1]] and cap.counts.dtype == np.int64
        logits = cap.router_logits
        assert (logits.layer, logits.pass_index, type(logits.layer), type(logits.pass_index)) == (0, 0, int, int)
        assert np.signbit(logits.values).tolist() == [True, True, False]
