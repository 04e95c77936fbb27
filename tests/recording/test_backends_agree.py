"""The compiled core and its pure-Python twin agree byte for byte on random captures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

f32s = st.floats(width=32, allow_nan=True, allow_infinity=True)


@st.composite
def captures(draw: Any) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    layers = draw(st.integers(1, 4))
    experts = draw(st.integers(1, 9))
    k = draw(st.integers(1, 4))
    config = {
        "num_layers": layers,
        "num_experts": experts,
        "top_k": draw(st.sampled_from([0, k] if k <= experts else [0])),  # the constructor rejects top_k > E
        "trace": draw(st.booleans()),
        "pilot": draw(st.sampled_from([None, "next", "self"])),
        "router_logits": draw(st.none() | st.tuples(st.integers(0, layers - 1), st.integers(0, 3))),
    }
    # Mostly valid ids, sometimes out of range or of the wrong length, so the
    # two cores must also agree on what they reject and on its message.
    layer = st.integers(-1, layers)
    ids = st.lists(st.integers(-1, experts), min_size=0, max_size=k + 1) | st.lists(
        st.integers(0, experts - 1), min_size=k, max_size=k
    )
    op = st.one_of(
        st.tuples(st.just("record"), layer, ids),
        st.tuples(st.just("record_prediction"), layer, ids),
        st.tuples(st.just("record_array"), layer, ids),
        st.tuples(st.just("record_many"), layer, st.lists(st.lists(st.integers(0, experts - 1), min_size=k, max_size=k), max_size=4)),
        st.tuples(st.just("record_router_logits"), layer, st.lists(f32s, min_size=experts, max_size=experts)),
    )
    return config, draw(st.lists(op, max_size=30))


def _pair(cores: Any, tmp_path: Any, config: dict[str, Any], **kwargs: Any) -> tuple[Any, Any]:
    """A recorder on each core for the drawn configuration (``kwargs`` add to or replace its settings)."""
    settings_ = {"pilot": config["pilot"], "router_logits": config["router_logits"], **kwargs}
    args = (config["num_layers"], config["num_experts"], config["top_k"])
    return (cores[0](str(tmp_path / "c.json"), *args, **settings_),
            cores[1](str(tmp_path / "p.json"), *args, **settings_))


def _apply(recorder: Any, op: tuple[Any, ...]) -> Any:
    name, layer, payload = op
    try:
        if name == "record_array":
            recorder.record(layer, np.array(payload, dtype=np.int64))
        elif name == "record_many":
            recorder.record_many(layer, np.array(payload, dtype=np.int32).reshape(len(payload), -1))
        else:
            getattr(recorder, name)(layer, payload)
    except (TypeError, ValueError, IndexError) as exc:
        return (type(exc).__name__, str(exc))
    return None


@pytest.mark.filterwarnings("ignore:pilot=.* with trace=False:RuntimeWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capture=captures())
def test_random_captures_serialize_identically(cores: Any, tmp_path: Any, capture: Any) -> None:
    config, ops = capture
    compiled, python = _pair(cores, tmp_path, config, trace=config["trace"])
    try:
        for op in ops:
            assert _apply(compiled, op) == _apply(python, op), op
            assert compiled.top_k == python.top_k
        assert compiled.to_json() == python.to_json()
        assert np.array_equal(compiled.counts, python.counts)
        assert np.array_equal(compiled.passes, python.passes)
        for layer in range(config["num_layers"]):
            for read in ("trace", "predictions"):
                ours, theirs = getattr(compiled, read)(layer), getattr(python, read)(layer)
                assert (ours is None and theirs is None) or (
                    ours.dtype == theirs.dtype and np.array_equal(ours, theirs) and ours.shape == theirs.shape
                )
    finally:
        compiled.discard()
        python.discard()


def test_counts_read_after_added_counts_are_current(make: Any, cls: Any) -> None:
    # Issue 16 item 9: the compiled core's counts snapshot was not invalidated
    # by a counts-only device flush (_add_counts), so a read before it went stale.
    hist = make(2, 3, cls=cls)
    assert hist.counts.tolist() == [[0, 0, 0], [0, 0, 0]]
    hist._add_counts(np.array([[1, 1, 0], [0, 0, 0]], dtype=np.int64), np.array([1, 0], dtype=np.int64), 2)
    assert hist.counts.tolist() == [[1, 1, 0], [0, 0, 0]]
    hist.record(1, [2, 0])
    hist._add_counts(np.array([[0, 0, 0], [0, 1, 1]], dtype=np.int64), np.array([0, 1], dtype=np.int64), 2)
    assert hist.counts.tolist() == [[1, 1, 0], [1, 1, 2]]
    assert hist.passes.tolist() == [1, 2]


@pytest.mark.filterwarnings("ignore:pilot=.* with trace=False:RuntimeWarning")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capture=captures(), cap=st.integers(1, 5))
def test_random_capped_captures_serialize_identically(cores: Any, tmp_path: Any, capture: Any, cap: int) -> None:
    # The same random calls (good and bad) with trace_cap: the cores agree on every kept row and on trace_dropped.
    config, ops = capture
    compiled, python = _pair(cores, tmp_path, config, trace=True, trace_cap=cap)
    try:
        for op in ops:
            assert _apply(compiled, op) == _apply(python, op), op
        assert compiled.to_json() == python.to_json()
        assert np.array_equal(compiled.trace_dropped, python.trace_dropped)
        for layer in range(config["num_layers"]):
            for read in ("trace", "predictions"):
                ours, theirs = getattr(compiled, read)(layer), getattr(python, read)(layer)
                assert (ours is None and theirs is None) or (ours.shape == theirs.shape and np.array_equal(ours, theirs))
                assert ours is None or ours.shape[0] <= cap
    finally:
        compiled.discard()
        python.discard()
