"""A failed append in the middle of a streamed capture: the frames after it are kept, the JSON and the
loader name exactly the rows it lost, and the analysis treats the gap as a break (issue 25, section 2)."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.cli import main

from naive_analysis import _coverage, _entropy, lru_counts
from stream_gap_helpers import EXPERTS, K, LAYERS, PASSES, kept, record_with_one_failed_append



def _record_with_one_failed_append(path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, tagged: bool) -> list:
    recorded = record_with_one_failed_append(path, cls, monkeypatch, tagged)
    return [recorded["rows"], recorded["seq"]]


def _sets(rows: np.ndarray) -> list[set[int]]:
    return [set(r) for r in rows.tolist()]


def _expected_layer(pieces: list[np.ndarray], layer: int) -> dict[str, Any]:
    """The layer's figures, computed naively: each piece its own run (windows, reuse, an LRU from empty)."""
    kept = np.concatenate(pieces)
    row = np.bincount(kept.ravel(), minlength=EXPERTS).tolist()
    windows = {}
    for m in (1, 2, 4, 8):
        sizes = [len(set().union(*s[i:i + m])) for s in map(_sets, pieces) for i in range(len(s) - m + 1)]
        windows[str(m)] = sum(sizes) / len(sizes)
    ratios = [len(s[p] & s[p - 1]) / len(s[p]) for s in map(_sets, pieces) for p in range(1, len(s))]
    hits = lookups = 0
    for piece in pieces:
        h, n = lru_counts(piece.tolist(), 4)
        hits, lookups = hits + h, lookups + n
    return {"layer": layer, "passes": kept.shape[0], "entropy_bits": _entropy(row, sum(row)),
            "coverage": _coverage(row, sum(row)), "window_distinct": windows,
            "reuse": math.fsum(ratios) / len(ratios), "pilot_recall": None, "pilot_exact": None,
            "lru_hit_rate": {"4": hits / lookups}}


def test_a_failed_append_in_the_middle_keeps_the_frames_after_it(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    rows, _ = _record_with_one_failed_append(path, cls, monkeypatch, tagged=False)
    stream = json.loads(path.read_text())["stream"]
    # The writer says exactly which rows the failed append lost: one range per layer (one chunk).
    lost = stream["lost_rows"]
    assert len(lost) == LAYERS and all(len(r) == 1 for r in lost)
    gaps = [tuple(r[0]) for r in lost]
    assert all(0 < a < b < PASSES for a, b in gaps)
    assert stream["lost_passes"] == [b - a for a, b in gaps] and stream["passes"] == [PASSES] * LAYERS
    assert "FAILED streaming the trace to" in capfd.readouterr().err
    shown = ", ".join(f"{layer}: [{a}, {b})" for layer, (a, b) in enumerate(gaps))
    with pytest.warns(RuntimeWarning, match=rf"{sum(b - a for a, b in gaps)} passes are missing \(rows \[first, "
                      rf"stop\) per layer: {re.escape(shown)}\); the rows after a gap are kept"):
        capture = turbospark.load(path)
    # What the JSON says lost is exactly what the loader finds missing; every other row is kept, in order.
    assert capture.stream.missing == tuple(((a, b),) for a, b in gaps)
    assert capture.stream.missing_passes.tolist() == [b - a for a, b in gaps]
    assert capture.stream.stranded_frames == 0
    assert [capture.stream.breaks(layer) for layer in range(LAYERS)] == [[a] for a, _ in gaps]
    for layer, (a, b) in enumerate(gaps):
        kept = np.concatenate([rows[layer][:a], rows[layer][b:]])
        assert capture.trace[layer].shape[0] == PASSES - (b - a)
        assert capture.trace[layer].tolist() == kept.tolist()
        assert capture.counts[layer].tolist() == np.bincount(kept.ravel(), minlength=EXPERTS).tolist()
    # analyze: each side of the gap is a run of its own (no window, transition or cache spans it).
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert main(["analyze", str(path), "--cache", "4", "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    assert doc["layers"] == [_expected_layer([rows[layer][:a], rows[layer][b:]], layer)
                              for layer, (a, b) in enumerate(gaps)]


def test_a_tagged_capture_breaks_every_sequence_at_the_gap(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    rows, seq = _record_with_one_failed_append(path, cls, monkeypatch, tagged=True)
    gaps = [tuple(r[0]) for r in json.loads(path.read_text())["stream"]["lost_rows"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        capture = turbospark.load(path)
        assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    for layer, (a, b) in enumerate(gaps):
        assert capture.seq[layer].tolist() == np.concatenate([seq[:a], seq[b:]]).tolist()
        # Per sequence, its passes before the gap and after it are two runs.
        runs = [piece[s[:piece.shape[0]] == sid] for piece, s in ((rows[layer][:a], seq[:a]), (rows[layer][b:], seq[b:]))
                for sid in range(5)]
        runs = [r for r in runs if r.shape[0]]
        sizes = [len(set().union(*_sets(r)[i:i + 4])) for r in runs for i in range(r.shape[0] - 3)]
        ratios = [len(x[p] & x[p - 1]) / len(x[p]) for x in map(_sets, runs) for p in range(1, len(x))]
        entry = doc["layers"][layer]
        assert entry["window_distinct"]["4"] == sum(sizes) / len(sizes)
        assert entry["reuse"] == math.fsum(ratios) / len(ratios)
        assert entry["passes"] == PASSES - (b - a)


@pytest.fixture(params=["compiled", "numpy"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The analysis kernels (metrics sums, cache simulation) in turn: compiled, then their numpy twins
    (``TURBOSPARK_PUREPYTHON``, read at each call; this pass runs on both recorder cores already)."""
    if request.param == "numpy":
        monkeypatch.setenv("TURBOSPARK_PUREPYTHON", "1")
    else:
        monkeypatch.delenv("TURBOSPARK_PUREPYTHON", raising=False)
    return str(request.param)


def _naive_pilot(rows: np.ndarray, preds: np.ndarray, lost: list[list[int]],
                 lost_preds: list[list[int]]) -> tuple[list[int], float, float]:
    """The recorded pass indices whose predictions a capture keeps, and (recall, exact) over them, naively:
    the missing passes skipped, and the pairs stopped at a kept pass whose prediction is missing."""
    def missing(p: int, ranges: list[list[int]]) -> bool:
        return any(a <= p < b for a, b in ranges)

    pairs = []
    for p in range(rows.shape[0]):
        if missing(p, lost):
            continue
        if missing(p, lost_preds):
            break
        pairs.append(p)
    sets = [(set(rows[p].tolist()), set(preds[p].tolist())) for p in pairs]
    recall = math.fsum(len(s & g) / len(s) for s, g in sets) / len(sets)
    return pairs, recall, sum(1 for s, g in sets if s == g) / len(sets)


@pytest.mark.parametrize("fail, ahead, aligned", [(7, False, 980), (12, False, 980), (12, True, 160)])
def test_prediction_metrics_skip_the_missing_passes(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        fail: int, ahead: bool, aligned: int, kernels: str) -> None:
    """A gap in the pilot's predictions, end to end: analyze pairs each kept pass with its own prediction."""
    path = tmp_path / "c.json"
    recorded = record_with_one_failed_append(path, cls, monkeypatch, False, pilot=True, fail=fail,
                                             predict_ahead=ahead)
    rows, preds = recorded["rows"], recorded["preds"]
    stream = json.loads(path.read_text())["stream"]
    lost, lost_preds = stream["lost_rows"][1], stream["lost_prediction_rows"][1]
    assert lost and lost_preds and stream["lost_prediction_rows"][0] == []
    pairs, recall, exact = _naive_pilot(rows[1], preds, lost, lost_preds)
    assert len(pairs) == aligned  # 160: a prediction of a kept pass is missing, so the rest cannot line up
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        capture = turbospark.load(path)
        assert capture.stream.missing_predictions[1] == tuple(map(tuple, lost_preds))
        assert capture.pred[1].tolist() == preds[pairs].tolist()
        assert capture.trace[1].tolist() == kept(rows[1], lost).tolist()
        capfd.readouterr()
        assert main(["analyze", str(path), "--json"]) == 0
    entry = json.loads(capfd.readouterr().out)["layers"][1]
    assert (entry["pilot_recall"], entry["pilot_exact"]) == (recall, exact)
    assert 0 < exact < 1  # the predictions differ from the passes now and then: the pairing matters


def _pass_lru(passes: list[list[int]], slots: int) -> tuple[int, int]:
    """(hits, needed) of the cache command's LRU, naively: a pass's distinct experts are hits when resident as it
    starts; a load into a full cache evicts the least recently used expert the pass does not need (a pass's
    experts share its time: the lower id goes first)."""
    last: dict[int, int] = {}
    hits = needed = 0
    for time, ids in enumerate(passes):
        want = list(dict.fromkeys(ids))
        needed += len(want)
        hits += sum(1 for e in want if e in last)
        for e in want:
            if e not in last and len(last) >= slots:
                del last[min((x for x in last if x not in want), key=lambda x: (last[x], x))]
            last[e] = time
    return hits, needed


def _as_sequences(rows: np.ndarray, seq: Any, lost: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The kept rows of a layer, and sequence ids that make each side of the gap its own runs: a pass
    after the gap gets its sequence id + 5 (an untagged layer: sequence 0 before, 1 after)."""
    (a, b), = lost
    side = (np.arange(rows.shape[0]) >= b).astype(np.int64)
    ids = (np.zeros(rows.shape[0], dtype=np.int64) if seq is None else np.asarray(seq)) + side * (5 if seq is not None
                                                                                                  else 1)
    return kept(rows, lost), kept(ids, lost)


@pytest.mark.parametrize("tagged", [False, True])
def test_the_cache_simulation_serves_each_side_of_a_gap_as_its_own_run(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, tagged: bool, kernels: str) -> None:
    """Every policy (the compiled kernel, or the numpy twin under TURBOSPARK_PUREPYTHON) on a gapped capture
    equals the same policy on an in-memory capture whose sides are separate sequences; LRU also naively."""
    from turbospark.offload.cache import cache_report

    path = tmp_path / "c.json"
    recorded = record_with_one_failed_append(path, cls, monkeypatch, tagged)
    rows, seq = recorded["rows"], recorded["seq"] if tagged else None
    lost = json.loads(path.read_text())["stream"]["lost_rows"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = cache_report(turbospark.load(path), [2, 4, 6], ["lru", "lfu", "belady"])
    sides = [_as_sequences(rows[layer], seq, lost[layer]) for layer in range(LAYERS)]
    doc = {"num_layers": LAYERS, "num_experts": EXPERTS, "top_k": K,
           "counts": [np.bincount(ids.ravel(), minlength=EXPERTS).tolist() for ids, _ in sides],
           "trace": [ids.ravel().tolist() for ids, _ in sides], "seq": [s.tolist() for _, s in sides],
           "phase": [[1] * s.shape[0] for _, s in sides]}
    twin = cache_report(turbospark.loads(json.dumps(doc)), [2, 4, 6], ["lru", "lfu", "belady"])
    assert report["layers"] == twin["layers"]
    for layer, (ids, s) in enumerate(sides):
        # LRU, naively: every stream (a sequence's passes on one side of the gap) from an empty cache.
        runs = [ids[s == sid] for sid in np.unique(s).tolist()]
        hits, lookups = map(sum, zip(*(_pass_lru(run.tolist(), 4) for run in runs)))
        assert report["layers"][layer]["hit_rate"]["lru"][1] == hits / lookups
        assert report["layers"][layer]["streams"] == len(runs) == (10 if tagged else 2)


def test_a_summary_never_says_lost_the_rows_of_a_later_take(
        tmp_path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write takes its rows, then, before its flush, another thread records and hands over a chunk whose
    append fails. The flush waits for that chunk too, but its rows are beyond the passes this write's JSON
    counts: that JSON says nothing lost (it had said rows 3..5 lost beside ``passes`` 3); the next one does."""
    import errno
    import os

    path = tmp_path / "c.json"
    first, later = np.array([[0, 1], [2, 3], [4, 5]]), np.array([[6, 7], [1, 2]])
    hist = cls(str(path), 1, 8, 2, trace="stream")
    stream = hist._stream
    real_flush, real_pwrite = stream.flush, os.pwrite
    failing = [False]

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    def flush() -> Any:
        monkeypatch.setattr(stream, "flush", real_flush)
        real_flush()  # this write's own chunk on disk first
        hist.record_many(0, later)  # the other thread's record and hand-over, between the take and the flush
        hist._hand_over()
        failing[0] = True
        try:
            real_flush()
        finally:
            failing[0] = False
        return real_flush()

    monkeypatch.setattr(os, "pwrite", pwrite)
    hist.record_many(0, first)
    monkeypatch.setattr(stream, "flush", flush)
    hist.write()
    summary = json.loads(path.read_text())["stream"]
    assert summary["passes"] == [3] and "lost_rows" not in summary and "lost_passes" not in summary
    assert turbospark.load(path).trace[0].tolist() == first.tolist()
    hist.close()
    summary = json.loads(path.read_text())["stream"]
    assert (summary["passes"], summary["lost_passes"], summary["lost_rows"]) == ([5], [2], [[[3, 5]]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        capture = turbospark.load(path)
    assert capture.trace[0].tolist() == first.tolist()
    assert [list(r) for r in capture.stream.missing[0]] == [[3, 5]]
