"""The trace metrics of ``analyze`` from the compiled sums kernel and its numpy twin: against a brute force
written from the definitions (with the float arithmetic the report has always used: ``math.fsum`` of the
per-pass ratios, integer totals divided once), on random captures with tags, predictions, narrow id
widths, empty layers and windows longer than sequences; fed whole or in chunks; in memory and streamed;
and analyze's memory on a streamed capture, in a child process."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turbospark
from turbospark.metrics import _metrics_py, trace_sums
from turbospark.capture import rows as capture_rows
from turbospark.capture.reader import Capture
from turbospark.metrics.layers import analyze
from turbospark.cli import main
from turbospark.recording.durable import _stream

from childproc import run_script
from naive_analysis import lru_counts

PHASES = ("prompt", "decode")


# --- brute force, from the definitions alone ------------------------------------------------------

def brute(ids: list[list[int]], pred: Optional[list[list[int]]], runs: list[list[int]], windows: list[int],
          caches: list[int]) -> dict[str, Any]:
    """One layer's trace keys over ``runs`` (lists of pass indices), one Python set per pass."""
    sets = [set(row) for row in ids]
    totals = {m: [0, 0] for m in windows}
    ratios: list[float] = []
    hits = {c: 0 for c in caches}
    lookups = 0
    for run in runs:
        s = [sets[p] for p in run]
        for m in windows:
            if len(s) >= m:
                totals[m][0] += sum(len(set().union(*s[i:i + m])) for i in range(len(s) - m + 1))
                totals[m][1] += len(s) - m + 1
        ratios += [len(s[i] & s[i - 1]) / len(s[i]) for i in range(1, len(s))]
        for c in caches:
            h, n = lru_counts([ids[p] for p in run], c)
            hits[c] += h
        lookups += sum(len(x) for x in s)
    out: dict[str, Any] = {
        "window_distinct": {str(m): (t / c if c else None) for m, (t, c) in totals.items()},
        "reuse": math.fsum(ratios) / len(ratios) if ratios else None,
        "pilot_recall": None,
        "pilot_exact": None,
    }
    if pred is not None:
        aligned = sorted(p for run in runs for p in run if p < len(pred))
        if aligned:
            out["pilot_recall"] = math.fsum(len(set(pred[p]) & sets[p]) / len(sets[p]) for p in aligned) / len(aligned)
            out["pilot_exact"] = sum(set(pred[p]) == sets[p] for p in aligned) / len(aligned)
    if caches:
        out["lru_hit_rate"] = {str(c): (hits[c] / lookups if lookups else None) for c in caches}
    return out


def brute_layer(capture: Capture, layer: int, windows: list[int], caches: list[int]) -> dict[str, Any]:
    assert capture.trace is not None
    ids = capture.trace[layer].tolist()
    pred = capture.pred[layer].tolist() if capture.pred is not None and layer > 0 else None
    if capture.seq is None:
        return brute(ids, pred, [list(range(len(ids)))], windows, caches)
    seq, phase = capture.seq[layer].tolist(), capture.phase[layer].tolist()

    def runs(keep: Any) -> list[list[int]]:
        return [[p for p in range(len(ids)) if seq[p] == s and keep(p)] for s in sorted(set(seq))]

    out = brute(ids, pred, runs(lambda p: True), windows, caches)
    out["phases"] = {}
    for code, name in enumerate(PHASES):
        chosen = [r for r in runs(lambda p: phase[p] == code) if r]
        out["phases"][name] = {"passes": sum(map(len, chosen)), **brute(ids, pred, chosen, windows, caches)}
    return out


# --- random captures ------------------------------------------------------------------------------

def random_capture(seed: int, *, dtype: Any = np.int64, tagged: bool = False, predicted: bool = True,
                   layers: int = 3, experts: int = 9, k: int = 3, passes: int = 40) -> Capture:
    rng = np.random.default_rng(seed)
    trace, pred, seq, phase = [], [], [], []
    for layer in range(layers):
        p = 0 if layer == 1 else int(rng.integers(0, passes + 1))  # layer 1: empty
        # Few distinct experts per layer, so windows, reuse and caches see repeats; ids may repeat in a pass.
        hot = rng.choice(experts, min(experts, int(rng.integers(1, 2 * k + 2))), replace=False)
        trace.append(hot[rng.integers(0, hot.shape[0], (p, k))].astype(dtype))
        q = int(rng.integers(0, p + 3))
        pred.append(rng.integers(0, experts, (q, k)).astype(dtype))
        seq.append(rng.integers(0, int(rng.integers(1, 6)), p).astype(np.int64))
        phase.append((rng.random(p) < 0.6).astype(np.int64))
    counts = np.stack([np.bincount(t.ravel().astype(np.int64), minlength=experts) for t in trace])
    return Capture(layers, experts, k, counts, tuple(trace), tuple(pred) if predicted else None, None,
                   seq if tagged else None, phase if tagged else None)


def analyzed(capture: Capture, backend: str, monkeypatch: pytest.MonkeyPatch, windows: list[int],
             caches: list[int]) -> str:
    with monkeypatch.context() as patch:
        if backend == "python":
            patch.setenv("TURBOSPARK_PUREPYTHON", "1")
        else:
            patch.delenv("TURBOSPARK_PUREPYTHON", raising=False)
        return json.dumps(analyze(capture, windows, caches))


TRACE_KEYS = ("window_distinct", "reuse", "pilot_recall", "pilot_exact", "lru_hit_rate", "phases")


@pytest.mark.both_backends
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.sampled_from(["u1", "u2", "u4", "i8", "i4"]),
       tagged=st.booleans(), predicted=st.booleans(), chunk=st.sampled_from([1, 2, 7, 1 << 18]),
       windows=st.sets(st.sampled_from([1, 2, 3, 5, 8, 60]), min_size=1),
       caches=st.sets(st.sampled_from([1, 2, 3, 7, 400]), max_size=3),
       experts=st.sampled_from([1, 5, 9, 70, 300]))
def test_both_backends_match_the_definitions_exactly(seed: int, width: str, tagged: bool, predicted: bool,
                                                     chunk: int, windows: set[int], caches: set[int],
                                                     experts: int) -> None:
    if width == "u1" and experts > 256:
        width = "u2"
    capture = random_capture(seed, dtype=np.dtype(width), tagged=tagged, predicted=predicted, experts=experts)
    ws, cs = sorted(windows), sorted(caches)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capture_rows, "CHUNK_PASSES", chunk)
        docs = [analyzed(capture, backend, patch, ws, cs) for backend in ("cython", "python")]
    # The report's bytes are the same from either backend, and the values are the definitions' exactly.
    assert docs[0] == docs[1]
    layers = json.loads(docs[0])["layers"]
    for layer in range(capture.num_layers):
        want = json.loads(json.dumps(brute_layer(capture, layer, ws, cs)))
        got = {key: layers[layer][key] for key in TRACE_KEYS if key in layers[layer]}
        assert got == want, layer


def test_a_wide_capture_and_its_narrow_copy_give_the_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = random_capture(3, tagged=True, experts=200, passes=300)
    narrow = Capture(wide.num_layers, wide.num_experts, wide.top_k, wide.counts,
                     tuple(t.astype(np.uint8) for t in wide.trace), tuple(p.astype(np.uint8) for p in wide.pred),
                     None, wide.seq, wide.phase)
    assert json.dumps(analyze(narrow, caches=[4, 16])) == json.dumps(analyze(wide, caches=[4, 16]))


def test_the_sums_fed_in_any_chunks_are_the_sums_of_the_whole_run() -> None:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 20, (500, 4)).astype(np.uint16)
    pred = rng.integers(0, 20, (321, 4)).astype(np.uint16)
    for cls in (trace_sums.backend(), _metrics_py.RunSums):
        whole = cls(20, 4, [1, 4, 9], 12)
        whole.feed(ids, pred)
        whole.end_run()
        parts = cls(20, 4, [1, 4, 9], 12)
        cuts = [0, 1, 2, 50, 51, 300, 321, 322, 500]
        for lo, hi in zip(cuts, cuts[1:]):
            parts.feed(ids[lo:hi], pred[lo:min(hi, 321)] if lo < 321 else None)
        parts.end_run()
        want = whole.sums()
        got = parts.sums()
        assert np.array_equal(got.pop("counts"), want.pop("counts"))
        assert got == want


@pytest.mark.both_backends
def test_bad_ids_are_refused_by_both() -> None:
    for cls in (trace_sums.backend(), _metrics_py.RunSums):
        sums = cls(4, 2, [1, 2], 2)
        with pytest.raises(ValueError, match="expert id 4 outside 0..3"):
            sums.feed(np.array([[1, 4]], dtype=np.int64))
        with pytest.raises(ValueError, match=r"ids must be \(passes, 2\)"):
            sums.feed(np.zeros((3, 3), dtype=np.uint8))
        with pytest.raises(TypeError, match="uint8, uint16, uint32 or int64"):
            sums.feed(np.zeros((3, 2), dtype=np.int32))


def test_the_compiled_kernel_is_used_unless_pure_python_is_forced() -> None:
    expected = "turbospark.metrics._metrics_py" if trace_sums.os.environ.get("TURBOSPARK_PUREPYTHON") else \
        "turbospark.metrics._metrics_kernels"
    assert trace_sums.backend().__module__ == expected


# --- streamed captures ----------------------------------------------------------------------------

def _record(path: Path, trace: Any, seed: int, tagged: bool) -> None:
    rng = np.random.default_rng(seed)
    with turbospark.RouterHistogram(str(path), 3, 40, 4, trace=trace, pilot="next") as hist:
        for step in range(60):
            layer = step % 3
            block = rng.integers(0, 12, (int(rng.integers(1, 30)), 4))
            if tagged:
                hist.record_batch(layer, block, seq=rng.integers(0, 4, block.shape[0]),
                                  phase=PHASES[int(rng.integers(2))])
            else:
                hist.record_many(layer, block)
            if layer < 2:
                hist.record_prediction_many(layer + 1, rng.integers(0, 12, block.shape))


@pytest.mark.parametrize("tagged", [False, True])
def test_analyze_json_is_the_same_for_a_streamed_capture(tmp_path: Path, tagged: bool,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_stream, "CHUNK_IDS", 40)  # layers span many frames
    monkeypatch.setattr(capture_rows, "CHUNK_PASSES", 5)  # and are read in many chunks
    for side in ("memory", "stream"):
        (tmp_path / side).mkdir()
        _record(tmp_path / side / "c.json", True if side == "memory" else "stream", 11, tagged)
    capfd.readouterr()
    outputs = []
    for side in ("memory", "stream"):
        argv = ["analyze", str(tmp_path / side / "c.json"), "--json", "--cache", "3", "--cache", "9",
                "--window", "1", "--window", "6", "--window", "100"]
        assert main(argv) == 0
        outputs.append(capfd.readouterr().out)
    assert turbospark.load(tmp_path / "stream" / "c.json").stream.frames > 20
    assert outputs[0] == outputs[1]


_ANALYZE_RSS = """
from turbospark.capture import rows
rows.CHUNK_PASSES = 1 << 16  # several chunks per layer
capture = turbospark.load(sys.argv[1])
before = peak_kib()
turbospark.analyze(capture, caches=[16])
print((peak_kib() - before) // 1024)
"""


@pytest.mark.both_backends  # the compiled kernel's bound; the numpy twin holds a whole run (by design)
def test_analyze_of_a_streamed_capture_stays_bounded(tmp_path: Path) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the peak from /proc/self/status (Linux)")
    path = tmp_path / "c.json"
    block = np.random.default_rng(0).integers(0, 128, (25_000, 8))
    with turbospark.RouterHistogram(str(path), 8, 128, 8, trace="stream") as hist:
        for step in range(8 * 8):  # 200 K passes per layer, 12.8 M ids
            hist.record_many(step % 8, block)
    result = run_script(tmp_path, _ANALYZE_RSS, str(path), timeout=300)
    assert result.returncode == 0, result.stderr
    # Its layers are 1.6 MB of uint8 each, read in chunks and handed back to the kernel; the same
    # capture in memory holds 102 MB of int64 ids before analyze starts, and the whole-array
    # analysis this replaced grew by ~420 MiB here.
    assert int(result.stdout) < 16, result.stdout


@pytest.mark.both_backends  # the compiled kernel's bound; the numpy twin holds a whole run (by design)
def test_analyze_of_a_tagged_streamed_capture_stays_bounded(tmp_path: Path) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the peak from /proc/self/status (Linux)")
    path = tmp_path / "c.json"
    rng = np.random.default_rng(0)
    block = rng.integers(0, 128, (25_000, 8))
    with turbospark.RouterHistogram(str(path), 8, 128, 8, trace="stream") as hist:
        for step in range(8 * 8):  # 200 K passes per layer, 12.8 M ids
            # 64 sequences in flight, each ~781 passes of a layer (runs cross the 65,536-pass chunks),
            # a new generation every 2 blocks of a layer, its first block prompt, its second decode
            seq = (step // 16) * 64 + np.arange(25_000, dtype=np.int64) % 64
            hist.record_batch(step % 8, block, seq=seq, phase="prompt" if step // 8 % 2 == 0 else "decode")
    result = run_script(tmp_path, _ANALYZE_RSS, str(path), timeout=300)
    assert result.returncode == 0, result.stderr
    # Chunks of the layer's ids and tags and 64 open runs' sums; the whole-layer analysis this replaced
    # held every layer's seq column for the sequence count and each layer's ids, tags and pass orders.
    assert int(result.stdout) < 10, result.stdout  # 30 MiB before
    assert turbospark.analyze(turbospark.load(path))["sequences"] == 4 * 64


@pytest.mark.both_backends
@pytest.mark.parametrize("tagged", [False, True])
def test_a_window_longer_than_every_run_is_null_on_both_backends(tagged: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiled kernel sized a ring of M - 1 passes: 10**11 raised MemoryError, 10**19 (beyond
    # int64) OverflowError, where the twin answers null (no window of M passes fits).
    capture = random_capture(3, dtype=np.dtype("u1"), tagged=tagged, predicted=True, experts=9)
    windows = [2, 10**11, 10**19]
    docs = [json.loads(analyzed(capture, backend, monkeypatch, windows, [3])) for backend in ("cython", "python")]
    assert docs[0] == docs[1]
    for layer in range(capture.num_layers):
        want = brute_layer(capture, layer, [2], [3])["window_distinct"]
        assert docs[0]["layers"][layer]["window_distinct"] == {
            "2": want["2"], "100000000000": None, "10000000000000000000": None}


def test_cli_window_beyond_the_passes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"num_layers":1,"num_experts":4,"top_k":1,"counts":[[2,1,0,0]],"trace":[[0,1,0]]}')
    assert main(["analyze", str(path), "--window", "2", "--window", str(10**19), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["layers"][0]["window_distinct"] == {"2": 2.0, "10000000000000000000": None}
    assert main(["analyze", str(path), "--window", str(10**11)]) == 0
    assert "    M=100000000000: - (fewer than 100000000000 passes)\n" in capfd.readouterr().out
