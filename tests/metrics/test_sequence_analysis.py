"""Analysis of batched captures: metrics per sequence, never across, pooled and per phase."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import naive_analysis

import turbospark
from turbospark.metrics import sequences
from turbospark.metrics import analyze
from turbospark.metrics.report import format_report

LAYERS, EXPERTS, K, B = 3, 24, 3, 4
WINDOWS, CACHES = [1, 2, 3, 5], [2, 6]


def _stream(seed: int) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Steps of (phase, ids (B, L, K), predictions (B, L, K), alive (B,)): ragged prompts, early finishers."""
    rng = np.random.default_rng(seed)
    steps = []
    prompt_len = rng.integers(1, 4, size=B)
    decode_len = rng.integers(2, 9, size=B)
    for step in range(int((prompt_len + decode_len).max())):
        for phase in ("prompt", "decode"):
            alive = (step < prompt_len) if phase == "prompt" else (step >= prompt_len) & (step < prompt_len + decode_len)
            if not alive.any():
                continue
            ids = np.stack([[rng.choice(EXPERTS, K, replace=False) for _ in range(LAYERS)] for _ in range(B)])
            pred = np.where(rng.random((B, LAYERS, 1)) < 0.5, ids, rng.integers(0, EXPERTS, (B, LAYERS, K)))
            steps.append((phase, ids, pred, alive))
    return steps


def _record(hist: Any, steps: Any, only: int | None) -> None:
    for phase, ids, pred, alive in steps:
        rows = np.arange(B) if only is None else np.array([only])
        keep = alive[rows]
        if not keep.any():
            continue
        for layer in range(LAYERS):
            block = np.where(keep[:, None], ids[rows, layer], -1)
            hist.record_batch(layer, block, seq=rows, phase=phase, mask=keep)
            if layer + 1 < LAYERS:
                for row in rows[keep]:
                    hist.record_prediction(layer + 1, pred[row, layer + 1])


@pytest.fixture(params=[0, 1, 2])
def captures(request: Any, make: Any) -> tuple[Any, dict[int, Any]]:
    steps = _stream(request.param)
    batched = make(LAYERS, EXPERTS, K, trace=True, pilot="next", name="batched.json")
    _record(batched, steps, None)
    alone = {}
    for s in range(B):
        hist = make(LAYERS, EXPERTS, K, trace=True, pilot="next", name=f"seq{s}.json")
        _record(hist, steps, s)
        alone[s] = turbospark.loads(hist.to_json())
    return turbospark.loads(batched.to_json()), alone


def test_each_sequence_is_exactly_its_own_capture(captures: Any) -> None:
    batched, alone = captures
    parts = sequences.split(batched)
    assert sorted(parts) == list(range(B))
    for s in range(B):
        assert analyze(parts[s], WINDOWS, CACHES) == analyze(alone[s], WINDOWS, CACHES)


def _windows(runs: list[list[set[int]]], m: int) -> float | None:
    sizes = [len(set().union(*run[p : p + m])) for run in runs for p in range(len(run) - m + 1)]
    return sum(sizes) / len(sizes) if sizes else None


def _reuse(runs: list[list[set[int]]]) -> float | None:
    ratios = [len(run[p] & run[p - 1]) / len(run[p]) for run in runs for p in range(1, len(run))]
    return math.fsum(ratios) / len(ratios) if ratios else None


def _lru(runs: list[list[list[int]]], size: int) -> float | None:
    # A cold cache for each sequence: counts summed over the runs.
    counted = [naive_analysis.lru_counts(run, size) for run in runs]
    hits, lookups = sum(c[0] for c in counted), sum(c[1] for c in counted)
    return hits / lookups if lookups else None


def _pilot(pairs: list[tuple[set[int], set[int]]]) -> tuple[float | None, float | None]:
    if not pairs:
        return None, None
    recall = math.fsum(len(g & a) / len(a) for g, a in pairs) / len(pairs)
    return recall, sum(g == a for g, a in pairs) / len(pairs)


def _expected(alone: dict[int, Any], layer: int, phase: int | None) -> dict[str, Any]:
    """Pooled metrics over the separate captures, by brute force on Python sets."""
    runs, pairs = [], []
    for capture in alone.values():
        keep = np.ones(capture.trace[layer].shape[0], bool) if phase is None else capture.phase[layer] == phase
        passes = capture.trace[layer][keep].tolist()
        runs.append(passes)
        guesses = capture.pred[layer][keep[: capture.pred[layer].shape[0]]].tolist()
        pairs += [(set(g), set(a)) for g, a in zip(guesses, passes)]
    sets = [[set(p) for p in run] for run in runs]
    recall, exact = _pilot(pairs) if layer else (None, None)
    return {
        "window_distinct": {str(m): _windows(sets, m) for m in WINDOWS},
        "reuse": _reuse(sets),
        "pilot_recall": recall,
        "pilot_exact": exact,
        "lru_hit_rate": {str(c): _lru(runs, c) for c in CACHES},
    }


def test_pooled_and_per_phase_metrics_never_cross_sequences(captures: Any) -> None:
    batched, alone = captures
    doc = analyze(batched, WINDOWS, CACHES)
    assert doc["sequences"] == B
    for layer in range(LAYERS):
        entry = doc["layers"][layer]
        for key, value in _expected(alone, layer, None).items():
            assert entry[key] == value, key
        for code, name in enumerate(("prompt", "decode")):
            phase = entry["phases"][name]
            assert phase["passes"] == sum(int((c.phase[layer] == code).sum()) for c in alone.values())
            for key, value in _expected(alone, layer, code).items():
                assert phase[key] == value, (name, key)


def test_interleaving_changes_the_naive_metrics(captures: Any) -> None:
    # The point of the feature: the interleaved trace read as one sequence is wrong.
    batched, _ = captures
    naive = analyze(turbospark.Capture(batched.num_layers, batched.num_experts, batched.top_k,
                                       batched.counts, batched.trace, batched.pred), WINDOWS)
    per_sequence = analyze(batched, WINDOWS)
    assert [r["reuse"] for r in naive["layers"]] != [r["reuse"] for r in per_sequence["layers"]]


def test_report_shows_the_phases_exactly(make: Any) -> None:
    hist = make(1, 4, 2, trace=True)
    hist.record_batch(0, [[0, 1], [2, 3]], seq=[0, 1], phase="prompt")
    hist.record_batch(0, [[0, 2], [2, 3]], seq=[0, 1], phase="decode")
    hist.record_batch(0, [[0, 2], [-1, -1]], seq=[0, 1], phase="decode", mask=[True, False])
    capture = turbospark.loads(hist.to_json())
    text = format_report(capture, analyze(capture, [1, 2], [2]))
    lines = text.splitlines()
    assert lines[0] == "capture: 1 layers x 4 experts, top-2; trace: yes; predictions: no; sequences: 2 (trace metrics per sequence, never across)"
    # Sequence 0 reads {0,1} {0,2} {0,2}; sequence 1 reads {2,3} {2,3}.
    assert lines[1:3] == [
        "layer  passes  entropy  cov50  cov90  cov95  cov99   d@1   d@2  reuse  recall  exact  lru@2",
        "    0       5     1.85      2      3      4      4  2.00  2.33  83.3%       -      -  50.0%",
    ]
    start = lines.index("by phase (means over routed layers; each sequence's passes of that phase alone):")
    assert lines[start + 1 : start + 3] == [
        "  prompt: 2.0 passes per layer, d@1 2.00, d@2 -, reuse -, recall -, lru@2 0.0%",
        "  decode: 3.0 passes per layer, d@1 2.00, d@2 2.00, reuse 100.0%, recall -, lru@2 33.3%",
    ]


def test_split_needs_trace_and_sequences() -> None:
    with pytest.raises(ValueError, match="no sequence information"):
        sequences.split(turbospark.loads('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[1,0]],"trace":[[0]]}'))
    with pytest.raises(ValueError, match="needs the trace"):
        sequences.split(turbospark.loads('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[1,0]],"seq":[[0]],"phase":[[1]]}'))
