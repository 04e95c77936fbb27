"""A failed append in the middle of a streamed capture: the frames after it are kept, the JSON and the
loader name exactly the rows it lost, and the analysis treats the gap as a break (issue 25, section 2)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.cli import main
from turbospark.recording.durable import _stream

from naive_analysis import _coverage, _entropy, lru_counts

PASSES, LAYERS, EXPERTS, K = 1000, 2, 16, 2


def _record_with_one_failed_append(path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, tagged: bool) -> list:
    """1,000 passes per layer, in calls of 10; the 6th append after the header fails with ENOSPC."""
    monkeypatch.setattr(_stream, "CHUNK_IDS", 100)
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 7:  # the header is call 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    rng = np.random.default_rng(7)
    rows = [np.argsort(rng.random((PASSES, EXPERTS)) ** (1 + layer), axis=1)[:, :K] % 6 * 2 + layer
            for layer in range(LAYERS)]
    seq = np.arange(PASSES) // 7 % 5  # five sequences, interleaved seven passes at a time
    hist = cls(str(path), LAYERS, EXPERTS, K, trace="stream")
    for lo in range(0, PASSES, 10):
        for layer in range(LAYERS):
            if tagged:
                hist.record_batch(layer, rows[layer][lo:lo + 10], seq=seq[lo:lo + 10], phase="decode")
            else:
                hist.record_many(layer, rows[layer][lo:lo + 10])
    hist.close()
    assert calls["n"] > 8
    return [rows, seq]


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
