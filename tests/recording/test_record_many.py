"""``record_many(layer, rows)`` is exactly ``record(layer, row)`` for each row, in order.

Checked as whole JSON documents with the trace and the probe on (so counts,
pass order, passes and the learned top_k all have to agree), by hand and by
a hypothesis property over random arrays of every integer dtype and layout.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark import RouterHistogram

# Hypothesis examples never write; the directory must exist for the constructor.
NOWHERE = os.path.join(tempfile.gettempdir(), "turbospark-never-written.json")


def pair(make: Callable[..., Any], *args: Any, **options: Any) -> tuple[Any, Any]:
    """(fed one row at a time, fed the block) with the same configuration."""
    return make(*args, name="rows.json", **options), make(*args, name="block.json", **options)


def test_a_block_is_its_rows_in_order(make: Callable[..., Any]) -> None:
    rows, block = pair(make, 2, 5, trace=True, pilot="next")
    data = [[4, 0], [1, 1], [2, 4], [0, 3]]
    for row in data:
        rows.record(1, row)
    block.record_many(1, np.array(data, dtype=np.int32))
    assert block.to_json() == rows.to_json() == (
        '{"num_layers":2,"num_experts":5,"top_k":2,"counts":[[0,0,0,0,0],[2,2,1,1,2]],'
        '"trace":[[],[4,0,1,1,2,4,0,3]],"pred":[[],[]]}'
    )
    assert block.passes.tolist() == rows.passes.tolist() == [0, 4]
    assert block.trace(1).tolist() == data


def test_a_block_learns_top_k_as_its_first_row_would(make: Callable[..., Any]) -> None:
    rows, block = pair(make, 1, 4, trace=True)
    rows.record(0, [1, 2, 3])
    block.record_many(0, [[1, 2, 3]])
    assert block.top_k == rows.top_k == 3
    assert block.to_json() == rows.to_json()
    for hist in (rows, block):
        with pytest.raises(ValueError, match="selection has 2 expert ids but top_k is 3"):
            hist.record(0, [1, 2])
        with pytest.raises(ValueError, match="selection has 2 expert ids but top_k is 3"):
            hist.record_many(0, [[1, 2]])


def test_blocks_and_single_passes_interleave(make: Callable[..., Any]) -> None:
    rows, block = pair(make, 3, 6, trace=True, pilot="self")
    steps: list[tuple[int, list[list[int]]]] = [
        (0, [[5, 1, 1]]),
        (2, [[0, 1, 2], [3, 4, 5]]),
        (0, [[2, 2, 2], [1, 0, 5], [5, 5, 0]]),
        (1, [[4, 3, 2]]),
    ]
    for number, (layer, data) in enumerate(steps):
        for row in data:
            rows.record(layer, row)
        if number % 2:
            block.record_many(layer, data)
        else:
            for row in data:
                block.record(layer, row)
        rows.record_prediction(layer, data[0])
        block.record_prediction(layer, data[0])
    assert block.to_json() == rows.to_json()
    assert block.passes.tolist() == [4, 1, 2]


@pytest.mark.parametrize("width", [1, 2, 5])
def test_no_rows_record_nothing_and_learn_nothing(make: Callable[..., Any], width: int) -> None:
    hist = make(2, 5, trace=True, pilot="next", router_logits=(0, 0))
    before = hist.to_json()
    for empty in (np.zeros((0, width), dtype=np.int64), np.zeros((0, width), dtype=np.uint8),
                  np.empty((0, width), dtype=object)):
        hist.record_many(0, empty)
    assert hist.to_json() == before
    assert hist.top_k == 0
    assert hist.passes.tolist() == [0, 0]
    # Still free to learn any width.
    hist.record(0, [1] * (width + 1))
    assert hist.top_k == width + 1


def test_no_rows_of_the_known_width_record_nothing(make: Callable[..., Any]) -> None:
    hist = make(1, 5, 2, trace=True)
    hist.record_many(0, np.zeros((0, 2), dtype=np.int64))
    assert hist.to_json() == '{"num_layers":1,"num_experts":5,"top_k":2,"counts":[[0,0,0,0,0]],"trace":[[]]}'


def test_one_row_is_one_record(make: Callable[..., Any]) -> None:
    rows, block = pair(make, 1, 3, trace=True)
    rows.record(0, [2, 0])
    block.record_many(0, [[2, 0]])
    assert block.to_json() == rows.to_json()


def test_the_logit_row_lines_up_with_passes_recorded_in_a_block(make: Callable[..., Any]) -> None:
    # Pass numbering counts every row, so after a two-row block the next row is pass 2.
    rows, block = pair(make, 1, 3, router_logits=(0, 2))
    for hist in (rows, block):
        hist.record_router_logits(0, [9.0, 9.0, 9.0])  # pass 0: not the one asked for
    rows.record(0, [0, 1])
    rows.record(0, [1, 2])
    block.record_many(0, [[0, 1], [1, 2]])
    for hist in (rows, block):
        hist.record_router_logits(0, [0.25, 0.5, 1.0])
        hist.record(0, [2, 2])
    assert block.to_json() == rows.to_json() == (
        '{"num_layers":1,"num_experts":3,"top_k":2,"counts":[[1,2,3]],'
        '"router_logits":{"layer":0,"pass":2,"values":[0.25,0.5,1]}}'
    )


def test_a_large_block(make: Callable[..., Any]) -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 64, size=(5000, 8), dtype=np.int64)
    rows, block = pair(make, 1, 64, trace=True)
    for row in data.tolist():
        rows.record(0, row)
    block.record_many(0, data)
    assert block.to_json() == rows.to_json()
    assert block.counts[0].tolist() == np.bincount(data.ravel(), minlength=64).tolist()
    assert block.passes.tolist() == [5000]


# --- the property ------------------------------------------------------------

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", ">i4", ">u8", ">i2"]
LAYOUTS = ["C", "F", "strided", "reversed", "object", "list", "tuple"]


def arrange(data: np.ndarray, layout: str) -> Any:
    """The same (n, k) ids in another memory layout or container."""
    if layout == "C":
        return np.ascontiguousarray(data)
    if layout == "F":
        return np.asfortranarray(data)
    if layout == "strided":
        wide = np.zeros((data.shape[0] * 2, data.shape[1] * 3), dtype=data.dtype)
        wide[::2, ::3] = data
        return wide[::2, ::3]
    if layout == "reversed":
        return np.ascontiguousarray(data[::-1, ::-1])[::-1, ::-1]
    if layout == "object":
        return data.astype(object)
    if data.shape[0] == 0:
        return data  # an empty list has no width to tell: (0, k) needs an array
    if layout == "list":
        return data.tolist()
    return tuple(tuple(row) for row in data.tolist())


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    num_layers = draw(st.integers(1, 3))
    num_experts = draw(st.integers(1, 100))
    width = draw(st.integers(1, 9))
    count = draw(st.integers(0, 12))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    values = draw(st.lists(st.integers(0, num_experts - 1), min_size=count * width, max_size=count * width))
    return {
        "num_layers": num_layers,
        "num_experts": num_experts,
        "layer": draw(st.integers(0, num_layers - 1)),
        "data": np.array(values, dtype=dtype).reshape(count, width),
        "layout": draw(st.sampled_from(LAYOUTS)),
        # How top_k is known beforehand: not at all, from the constructor, or from an earlier pass.
        "prior": draw(st.sampled_from(["none", "constructor", "record", "prediction"])),
        "prior_layer": draw(st.integers(0, num_layers - 1)),
        "options": draw(st.sampled_from([{"trace": True, "pilot": "next"}, {"trace": True}, {}])),
    }


def build(case: dict[str, Any]) -> Any:
    width = case["data"].shape[1]
    # The constructor rejects top_k > num_experts; learning it from a pass does not.
    top_k = width if case["prior"] == "constructor" and width <= case["num_experts"] else 0
    hist = RouterHistogram(NOWHERE, case["num_layers"], case["num_experts"], top_k, **case["options"])
    if case["prior"] == "record":
        hist.record(case["prior_layer"], [0] * width)
    elif case["prior"] == "prediction":
        hist.record_prediction(case["prior_layer"], [case["num_experts"] - 1] * width)
    return hist


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_record_many_equals_consecutive_records(case: dict[str, Any]) -> None:
    rows, block = build(case), build(case)
    try:
        layer, data = case["layer"], case["data"]
        for row in data.tolist():
            rows.record(layer, row)
        block.record_many(layer, arrange(data, case["layout"]))
        assert block.to_json() == rows.to_json()
        assert block.top_k == rows.top_k
        assert block.passes.tolist() == rows.passes.tolist()
        if "trace" in case["options"]:
            assert block.trace(layer).tolist() == rows.trace(layer).tolist()
    finally:
        rows.discard()
        block.discard()


@settings(max_examples=100, deadline=None)
@given(case=cases(), spot=st.integers(0, 10**6), offset=st.integers(0, 2**16))
def test_a_block_with_a_bad_id_records_nothing(case: dict[str, Any], spot: int, offset: int) -> None:
    data = case["data"]
    if data.size == 0:
        return
    wide = data.astype(np.int64)
    position = divmod(spot % data.size, data.shape[1])
    bad = case["num_experts"] + offset
    wide[position] = bad
    hist = build(case)
    try:
        before = hist.to_json()
        with pytest.raises(ValueError) as info:
            hist.record_many(case["layer"], arrange(wide, case["layout"]))
        # The first bad id in row-major order is the one we planted.
        assert str(info.value) == (
            f"expert id {bad} at position {position} is out of range for {case['num_experts']} experts"
        )
        assert hist.to_json() == before
    finally:
        hist.discard()


@pytest.mark.parametrize("trace", [True, False])
def test_record_many_with_very_many_experts_equals_records(make: Any, trace: bool) -> None:
    # Past 65,536 experts the compiled core counts in place instead of in
    # scratch tables; the result must not change.
    experts = 70_000
    ids = np.array([[69_999, 0, 5], [12, 69_999, 69_999]], dtype=np.int64)
    bulk = make(2, experts, trace=trace, name="bulk.json")
    single = make(2, experts, trace=trace, name="single.json")
    bulk.record_many(1, ids)
    for row in ids.tolist():
        single.record(1, row)
    assert bulk.to_json() == single.to_json()
    with pytest.raises(ValueError, match="expert id 70000 at position \\(1, 2\\)"):
        bulk.record_many(1, np.array([[1, 2, 3], [4, 5, 70_000]]))
    assert bulk.to_json() == single.to_json()
