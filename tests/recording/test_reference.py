"""The reference's own tests (router_hist.rs), ported with their exact JSON."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from turbospark import RouterHistogram
from capture_helpers import RUST_COUNTS, RUST_PILOT, RUST_TRACE


def _reference_passes(hist: Any) -> Any:
    """The passes of the reference's counts and trace tests (RUST_COUNTS, RUST_TRACE)."""
    hist.record(0, [2, 0])
    hist.record(0, [2, 1])
    hist.record(1, [1, 1])
    return hist


def test_records_and_serializes_layer_expert_counts(make: Callable[..., Any]) -> None:
    assert _reference_passes(make(2, 3)).to_json() == RUST_COUNTS


def test_trace_keeps_pass_order_that_the_counts_discard(make: Callable[..., Any]) -> None:
    assert _reference_passes(make(2, 3, trace=True)).to_json() == RUST_TRACE


def test_a_prediction_is_recorded_against_the_layer_it_is_about(make: Callable[..., Any]) -> None:
    hist = make(2, 3, trace=True, pilot="next")
    hist.record(0, [2, 0])
    hist.record_prediction(1, [1, 2])
    hist.record(1, [1, 0])
    # Row 0 of pred stays empty: nothing precedes layer 0.
    assert hist.to_json() == RUST_PILOT


def test_predictions_are_dropped_when_the_probe_is_off(make: Callable[..., Any]) -> None:
    hist = make(2, 3, trace=True)
    assert not hist.pilot_enabled()
    hist.record_prediction(1, [1, 2])
    hist.record(0, [2, 0])
    assert "pred" not in hist.to_json()
    assert hist.predictions(1) is None


def test_the_probe_reports_enabled_only_when_storage_exists(make: Callable[..., Any]) -> None:
    assert make(2, 3, trace=True, pilot="next").pilot_enabled()
    assert not make(2, 3, trace=True).pilot_enabled()


def test_router_logits_capture_targets_one_layer_and_pass(make: Callable[..., Any]) -> None:
    hist = make(2, 3, router_logits=(1, 1))
    hist.record_router_logits(0, [9.0, 8.0, 7.0])
    hist.record(0, [0, 1])
    hist.record_router_logits(1, [6.0, 5.0, 4.0])
    hist.record(1, [0, 1])
    hist.record_router_logits(1, [3.5, 2.5, 1.5])
    assert '"router_logits":{"layer":1,"pass":1,"values":[3.5,2.5,1.5]}' in hist.to_json()


def test_router_logits_whole_document(make: Callable[..., Any]) -> None:
    hist = make(2, 3, router_logits=(1, 1))
    hist.record(1, [0, 1])
    hist.record_router_logits(1, [3.5, -2.5, 0.1])
    hist.record(1, [2, 1])
    # Only the first row at the requested pass is kept.
    hist.record_router_logits(1, [9.0, 9.0, 9.0])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[0,0,0],[1,2,1]],'
        '"router_logits":{"layer":1,"pass":1,"values":[3.5,-2.5,0.1]}}'
    )


def test_a_requested_row_never_seen_is_null(make: Callable[..., Any]) -> None:
    hist = make(2, 3, router_logits=(0, 5))
    hist.record(0, [0, 1])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,1,0],[0,0,0]],'
        '"router_logits":{"layer":0,"pass":5,"values":null}}'
    )


def test_non_finite_logits_are_written_as_null(make: Callable[..., Any]) -> None:
    hist = make(1, 4, router_logits=(0, 0))
    hist.record_router_logits(0, [float("nan"), float("inf"), -float("inf"), 1e-7])
    assert hist.to_json().endswith('"router_logits":{"layer":0,"pass":0,"values":[null,null,null,0.0000001]}}')


def test_logits_are_printed_as_rust_prints_f32(make: Callable[..., Any]) -> None:
    hist = make(1, 6, router_logits=(0, 0))
    # float64 inputs round to f32 first: 0.1 prints as 0.1, 1e20 positionally,
    # 3.0 without a fraction, -0.0 keeps its sign, 1e40 overflows to inf (null).
    hist.record_router_logits(0, [0.1, 1e20, 3.0, -0.0, 1e40, 16777217.0])
    assert hist.to_json().endswith('"values":[0.1,100000000000000000000,3,-0,null,16777216]}}')


def test_top_k_is_learned_from_the_first_record(make: Callable[..., Any]) -> None:
    hist = make(1, 4)
    assert hist.top_k == 0
    assert hist.to_json() == '{"num_layers":1,"num_experts":4,"top_k":0,"counts":[[0,0,0,0]]}'
    hist.record(0, [3])
    assert hist.top_k == 1


def test_no_layers_reports_zero_experts_like_the_reference(tmp_path: Any, monkeypatch: Any) -> None:
    # The reference reads num_experts off the first counts row. Only from_env
    # accepts zero layers (with a warning); the constructor rejects them.
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "c.json"))
    with pytest.warns(RuntimeWarning, match="num_layers is 0"):
        hist = RouterHistogram.from_env(0, 8)
    assert hist.to_json() == '{"num_layers":0,"num_experts":0,"top_k":0,"counts":[]}'
    hist.discard()


def test_an_untouched_layer_stays_an_all_zero_row(make: Callable[..., Any]) -> None:
    hist = make(3, 2, 1, trace=True, pilot="next")
    hist.record(2, [1])
    assert hist.to_json() == (
        '{"num_layers":3,"num_experts":2,"top_k":1,"counts":[[0,0],[0,0],[0,1]],'
        '"trace":[[],[],[1]],"pred":[[],[],[]]}'
    )


def test_pilot_offset(make: Callable[..., Any]) -> None:
    assert make(2, 3, trace=True, pilot="next").pilot_offset() == 1
    assert make(2, 3, trace=True, pilot="self").pilot_offset() == 0
    assert make(2, 3).pilot_offset() == 1
