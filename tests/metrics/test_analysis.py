"""``turbospark.metrics``: exact values on hand-worked captures, and agreement with a
plain-Python evaluation of the same definitions on random ones."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive_analysis as naive
from capture_helpers import RUST_TRACE

from turbospark.metrics import (
    analyze,
    coverage,
    entropy_bits,
    lru_hit_rates,
    lru_stack_distances,
    pass_bitsets,
    pilot_scores,
    reuse,
    self_test,
    uniform_window_distinct,
    window_distinct,
)
from turbospark.capture.reader import loads


def cap(doc: dict[str, Any]) -> Any:
    return loads(json.dumps(doc, separators=(",", ":")))


def ids(rows: list[list[int]]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1)


# The reference's trace example: layer 0 routes (2,0) then (2,1); layer 1 (1,1).
RUST = json.loads(RUST_TRACE)


def test_reference_example_by_hand() -> None:
    result = analyze(cap(RUST), caches=[1, 2])
    assert result["random_recall_baseline"] == 2 / 3
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    l0, l1 = result["layers"]
    # Layer 0: shares 1/4, 1/4, 1/2 -> 1.5 bits; sorted counts 2,1,1 of N = 4.
    assert l0["passes"] == 2 and l0["entropy_bits"] == 1.5
    assert l0["coverage"] == {"0.5": 1, "0.9": 3, "0.95": 3, "0.99": 3}
    # {0,2} and {1,2}: 2 per pass, a union of 3 (not 4) over the window of 2.
    assert l0["window_distinct"] == {"1": 2.0, "2": 3.0, "4": None, "8": None}
    assert l0["reuse"] == 0.5
    # LRU C=1: every lookup misses. C=2: 2 0 | 2(hit) 1 -> 1 of 4.
    assert l0["lru_hit_rate"] == {"1": 0.0, "2": 0.25}
    # Layer 1: one pass routing (1,1): a duplicate, so S_0 = {1}.
    assert l1["passes"] == 1 and l1["entropy_bits"] == 0.0
    assert l1["coverage"] == {"0.5": 1, "0.9": 1, "0.95": 1, "0.99": 1}
    assert l1["window_distinct"] == {"1": 1.0, "2": None, "4": None, "8": None}
    assert l1["reuse"] is None
    assert l1["lru_hit_rate"] == {"1": 0.0, "2": 0.0}
    assert l0["pilot_recall"] is None and l1["pilot_recall"] is None  # no predictions


def test_reference_pilot_example_half_right() -> None:
    doc = {
        "num_layers": 2, "num_experts": 3, "top_k": 2, "counts": [[1, 0, 1], [1, 1, 0]],
        "trace": [[2, 0], [1, 0]], "pred": [[], [1, 2]],
    }
    l0, l1 = analyze(cap(doc))["layers"]
    assert (l0["pilot_recall"], l0["pilot_exact"]) == (None, None)  # nothing predicts layer 0
    assert (l1["pilot_recall"], l1["pilot_exact"]) == (0.5, 0.0)


def test_dense_layer_that_never_routes() -> None:
    doc = {
        "num_layers": 3, "num_experts": 4, "top_k": 2,
        "counts": [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
        "trace": [[], [0, 1], []], "pred": [[], [0, 1], []],
    }
    result = analyze(cap(doc), windows=[1, 2], caches=[3])
    dense = result["layers"][0]
    assert dense == {
        "layer": 0, "passes": 0, "entropy_bits": None, "coverage": None,
        "window_distinct": {"1": None, "2": None}, "reuse": None,
        "pilot_recall": None, "pilot_exact": None, "lru_hit_rate": {"3": None},
    }
    assert result["layers"][2]["pilot_recall"] is None
    assert result["layers"][1]["pilot_recall"] == 1.0 and result["layers"][1]["pilot_exact"] == 1.0
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}


def test_duplicate_ids_within_a_pass_count_once() -> None:
    trace = ids([[1, 1], [1, 2]])
    assert window_distinct(trace, 3, [1, 2]) == {1: 1.5, 2: 2.0}
    assert reuse(trace, 3) == 0.5  # |{1,2} & {1}| / |{1,2}|
    # pred {1} vs {1}: exact; pred {2,1} vs {1,2}: exact.
    assert pilot_scores(ids([[1, 1], [2, 1]]), trace, 3) == (1.0, 1.0)
    # pred {1,2} vs S = {1}: full recall, but the sets differ.
    assert pilot_scores(ids([[1, 2]]), ids([[1, 1]]), 3) == (1.0, 0.0)
    # Lookups are the distinct ids: 1 | 1(hit) 2 -> 1 hit of 3.
    assert lru_hit_rates(trace, 3, [1, 2]) == {1: 1 / 3, 2: 1 / 3}


def test_top1_routing_by_hand() -> None:
    doc = {"num_layers": 1, "num_experts": 4, "top_k": 1, "counts": [[3, 1, 1, 0]], "trace": [[0, 1, 0, 2, 0]]}
    (layer,) = analyze(cap(doc), caches=[1, 2, 3])["layers"]
    assert layer["passes"] == 5
    assert layer["entropy_bits"] == pytest.approx(0.6 * math.log2(5 / 3) + 0.4 * math.log2(5), rel=1e-15)
    assert layer["coverage"] == {"0.5": 1, "0.9": 3, "0.95": 3, "0.99": 3}
    # Windows of 2: {0,1} {1,0} {0,2} {2,0}; of 4: {0,1,2} twice.
    assert layer["window_distinct"] == {"1": 1.0, "2": 2.0, "4": 3.0, "8": None}
    assert layer["reuse"] == 0.0
    # C=2 and C=3: 0 1 0(hit) 2 0(hit) -> 2 of 5; C=1 never hits.
    assert layer["lru_hit_rate"] == {"1": 0.0, "2": 0.4, "3": 0.4}


def test_fewer_passes_than_window() -> None:
    trace = ids([[0, 1], [2, 3], [0, 2]])
    assert window_distinct(trace, 4, [1, 3, 4, 8]) == {1: 2.0, 3: 4.0, 4: None, 8: None}
    assert reuse(ids([[0, 1]]), 4) is None
    assert window_distinct(np.zeros((0, 2), dtype=np.int64), 4, [1]) == {1: None}


def test_no_trace_leaves_trace_metrics_null_and_omits_lru() -> None:
    doc = {"num_layers": 2, "num_experts": 3, "top_k": 1, "counts": [[1, 0, 0], [0, 1, 1]], "pred": [[], [1, 2]]}
    result = analyze(cap(doc), caches=[2])
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": None}
    for layer in result["layers"]:
        assert layer["window_distinct"] is None and layer["reuse"] is None
        assert layer["pilot_recall"] is None and layer["pilot_exact"] is None
        assert "lru_hit_rate" not in layer
    assert result["layers"][1]["passes"] == 2


def test_lru_key_absent_without_caches() -> None:
    assert "lru_hit_rate" not in analyze(cap(RUST))["layers"][0]


def test_predictions_align_on_the_common_prefix_only() -> None:
    trace = ids([[0, 1], [2, 3], [0, 2]])
    # Two predictions for three passes: the third pass is not scored.
    assert pilot_scores(ids([[0, 1], [2, 0]]), trace, 4) == (0.75, 0.5)
    # More predictions than passes: the extra one is ignored.
    assert pilot_scores(ids([[0, 1], [2, 3], [0, 2], [3, 3]]), trace, 4) == (1.0, 1.0)
    assert pilot_scores(np.zeros((0, 2), dtype=np.int64), trace, 4) == (None, None)


def test_counts_not_a_multiple_of_top_k_fails_the_check() -> None:
    doc = {"num_layers": 2, "num_experts": 2, "top_k": 2, "counts": [[2, 1], [1, 1]]}
    result = analyze(cap(doc))
    assert result["checks"]["counts_sum_ok"] is False
    assert [layer["passes"] for layer in result["layers"]] == [1.5, 1]


def test_trace_that_disagrees_with_counts_fails_the_check() -> None:
    doc = dict(RUST, counts=[[1, 1, 2], [0, 1, 1]])
    assert analyze(cap(doc))["checks"] == {"counts_sum_ok": True, "trace_matches_counts": False}


def test_top_k_zero_capture_that_never_recorded() -> None:
    doc = {"num_layers": 1, "num_experts": 4, "top_k": 0, "counts": [[0, 0, 0, 0]], "trace": [[]], "pred": [[]]}
    result = analyze(cap(doc), caches=[2])
    assert result["random_recall_baseline"] == 0.0
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    layer = result["layers"][0]
    assert layer["passes"] == 0 and layer["window_distinct"] == {"1": None, "2": None, "4": None, "8": None}
    assert layer["lru_hit_rate"] == {"2": None}


def test_windows_and_caches_are_sorted_and_deduplicated_and_must_be_positive() -> None:
    layer = analyze(cap(RUST), windows=[2, 1, 2], caches=[2, 1])["layers"][0]
    assert list(layer["window_distinct"]) == ["1", "2"]
    assert list(layer["lru_hit_rate"]) == ["1", "2"]
    with pytest.raises(ValueError, match="window size must be at least 1"):
        analyze(cap(RUST), windows=[0])
    with pytest.raises(ValueError, match="cache size must be at least 1"):
        analyze(cap(RUST), caches=[0])


def test_coverage_compares_exactly_not_in_floating_point() -> None:
    # 0.55 * 100 is 55.00000000000001 in floats; 55 of 100 does reach 55%.
    assert coverage(np.array([55, 45]), ("0.55",)) == {"0.55": 1}
    assert coverage(np.array([0, 0])) is None
    assert entropy_bits(np.array([0, 0])) is None
    assert entropy_bits(np.array([5, 5, 5, 5])) == 2.0


def test_uniform_window_estimate() -> None:
    assert uniform_window_distinct(128, 8, 1) == 8.0
    assert uniform_window_distinct(128, 8, 2) == pytest.approx(15.5)
    assert uniform_window_distinct(0, 0, 3) == 0.0


def test_bitsets_span_several_words() -> None:
    bits = pass_bitsets(ids([[0, 63], [64, 129], [129, 129]]), 130)
    assert bits.shape == (3, 3)
    assert bits[0].tolist() == [1 | (1 << 63), 0, 0]
    assert bits[1].tolist() == [0, 1, 2] and bits[2].tolist() == [0, 0, 2]


def test_popcount_fallback_for_numpy_before_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from turbospark.metrics import _primitives

    bits = pass_bitsets(ids([[0, 63], [64, 129], [5, 5]]), 130)
    expected = _primitives._popcount(bits).tolist()
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert _primitives._popcount(bits).tolist() == expected == [2, 2, 1]


def test_lru_stack_distances_by_hand() -> None:
    # Lookups: 0 1 | 1 2 | 0 -> distances -1 -1 | 0 -1 | 2 (1 and 2 since 0).
    assert lru_stack_distances(ids([[0, 1], [1, 2], [0, 0]]), 3).tolist() == [-1, -1, 0, -1, 2]


def test_self_test_verdict() -> None:
    good = cap({
        "num_layers": 3, "num_experts": 4, "top_k": 1, "counts": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],
        "trace": [[0], [1], [2]], "pred": [[], [1], [2]],
    })
    assert self_test(good, analyze(good)) == ([1, 2], [])
    off = cap({
        "num_layers": 3, "num_experts": 4, "top_k": 1, "counts": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],
        "trace": [[0], [1], [2]], "pred": [[], [3], [2]],
    })
    assert self_test(off, analyze(off)) == ([1, 2], [1])
    none = cap({"num_layers": 1, "num_experts": 2, "top_k": 1, "counts": [[1, 0]], "trace": [[0]]})
    assert self_test(none, analyze(none)) == ([], [])


# ------------------------------------------------- agreement with the oracle


def _close(fast: Any, slow: Any, where: str = "") -> None:
    if isinstance(fast, dict):
        assert isinstance(slow, dict) and list(fast) == list(slow), where
        for key in fast:
            _close(fast[key], slow[key], f"{where}/{key}")
    elif isinstance(fast, list):
        assert isinstance(slow, list) and len(fast) == len(slow), where
        for i, (a, b) in enumerate(zip(fast, slow)):
            _close(a, b, f"{where}[{i}]")
    elif isinstance(fast, float) and isinstance(slow, float):
        assert math.isclose(fast, slow, rel_tol=1e-12, abs_tol=1e-15), (where, fast, slow)
    else:
        assert fast == slow and type(fast) is type(slow), (where, fast, slow)


@st.composite
def captures(draw: Any) -> dict[str, Any]:
    experts = draw(st.integers(1, 70))  # > 64 exercises two-word bitsets
    k = draw(st.integers(1, 4))
    layers = draw(st.integers(0, 3))
    expert_id = st.integers(0, experts - 1)
    trace = [draw(st.lists(expert_id, max_size=12 * k)) for _ in range(layers)]
    trace = [row[: len(row) - len(row) % k] for row in trace]
    pred = [draw(st.lists(expert_id, max_size=12 * k)) for _ in range(layers)]
    pred = [row[: len(row) - len(row) % k] for row in pred]
    counts = [[row.count(e) for e in range(experts)] for row in trace]
    doc: dict[str, Any] = {"num_layers": layers, "num_experts": experts, "top_k": k, "counts": counts}
    if draw(st.booleans()):
        doc["trace"] = trace
        if draw(st.booleans()):
            doc["pred"] = pred
    return doc


@settings(max_examples=250, deadline=None)
@given(
    doc=captures(),
    windows=st.lists(st.integers(1, 14), min_size=1, max_size=4),
    caches=st.lists(st.integers(1, 8), max_size=3),
)
def test_matches_plain_python_definitions(doc: dict[str, Any], windows: list[int], caches: list[int]) -> None:
    _close(analyze(cap(doc), windows, caches), naive.naive_analyze(doc, windows, caches))


@settings(max_examples=150, deadline=None)
@given(
    trace=st.lists(st.lists(st.integers(0, 9), min_size=3, max_size=3), max_size=40),
    slots=st.integers(1, 10),
)
def test_lru_matches_an_ordered_dict_cache(trace: list[list[int]], slots: int) -> None:
    hits, lookups = naive.lru_counts(trace, slots)
    expected = hits / lookups if lookups else None
    array = np.array(trace, dtype=np.int64).reshape(len(trace), 3)
    assert lru_hit_rates(array, 10, [slots]) == {slots: expected}


def test_simulated_capture_matches_oracle(tmp_path: Path) -> None:
    from turbospark.cli.simulate import RouterSimulator

    selected, predicted = RouterSimulator(4, 96, 6, seed=11).run(300)
    doc = {
        "num_layers": 4, "num_experts": 96, "top_k": 6,
        "counts": [np.bincount(s.ravel(), minlength=96).tolist() for s in selected],
        "trace": [s.ravel().tolist() for s in selected],
        "pred": [[]] + [p.ravel().tolist() for p in predicted[1:]],
    }
    windows, caches = [1, 2, 3, 4, 8, 16, 33], [4, 16, 48]
    _close(analyze(cap(doc), windows, caches), naive.naive_analyze(doc, windows, caches))
