"""Every command that reads a streamed capture's trace honours a gap (rows lost to a failed append, issue 25):
``place --batch`` / ``--fit`` and round-robin never join rows across it, ``compare`` and ``plot`` count
what is kept, ``export --to parquet`` carries it (recorded pass indices, a ``missing`` entry), and ``merge``,
``export --to json`` and ``export --to routed-experts``, whose formats cannot say which rows are missing,
refuse naming the file and the rows."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import turbospark
from turbospark.capture.sequences import serving_iterations
from turbospark.metrics.compare import compare
from turbospark.cli import main
from turbospark.placement.dispatch import dispatch_loads, routing
from turbospark.placement.dispatch import imbalance

from conftest import require_module
from stream_gap_helpers import EXPERTS, K, LAYERS, PASSES, kept, record_with_one_failed_append


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Every load of a gapped capture warns that rows are missing (tests/recording/test_stream_gaps.py checks it).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _gapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
            tagged: bool = False) -> tuple[Path, dict[str, Any], list[list[list[int]]]]:
    path = tmp_path / "c.json"
    recorded = record_with_one_failed_append(path, turbospark.RouterHistogram, monkeypatch, tagged)
    monkeypatch.undo()  # os.pwrite and the chunk size back: the commands below write files of their own
    capfd.readouterr()
    lost = json.loads(path.read_text())["stream"]["lost_rows"]
    assert all(len(ranges) == 1 and 0 < ranges[0][0] < ranges[0][1] < PASSES for ranges in lost)
    return path, recorded, lost


def _sides(rows: np.ndarray, lost: list[list[int]]) -> list[np.ndarray]:
    """The rows kept before the gap and after it."""
    (a, b), = lost
    return [rows[:a], rows[b:]]


def _batch_mean(phy2log: np.ndarray, batches: list[np.ndarray]) -> dict[str, Any]:
    """The mean imbalance of the batches' (B, K) ids on 2 GPUs under ``phy2log`` (one slot per expert), naively."""
    values = []
    for ids in batches:
        counts = np.bincount(ids.ravel(), minlength=EXPERTS)
        loads = np.array([sum(int(counts[e]) for e in phy2log[g * EXPERTS // 2:(g + 1) * EXPERTS // 2])
                          for g in range(2)], dtype=np.float64)
        mean = loads.sum() / 2
        values.append((loads.max() - mean) / mean)
    return {"imbalance": math.fsum(values) / len(values), "batches": len(values)}


def _place(path: Path, capfd: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    out = path.with_name("placement.json")
    assert main(["place", str(path), "--gpus", "2", *argv, "-o", str(out)]) == 0
    capfd.readouterr()
    return json.loads(out.read_text())


def test_place_batches_of_consecutive_passes_never_span_a_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd)
    doc = _place(path, capfd, "--batch", "7")
    for layer in range(LAYERS):
        phy2log = np.array(doc["physical_to_logical_map"][layer])
        # Each side's batches of 7 consecutive passes, its shorter tail left out: none holds rows of both sides.
        batches = [side[lo:lo + 7] for side in _sides(recorded["rows"][layer], lost[layer])
                   for lo in range(0, side.shape[0] - 6, 7)]
        assert doc["layers"][layer]["after"]["batch_in_sample"] == _batch_mean(phy2log, batches)


def test_place_fit_and_batch_serve_each_side_of_a_gap_as_its_own_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd, tagged=True)
    doc = _place(path, capfd, "--fit", "0.5", "--batch", "3")
    for layer in range(LAYERS):
        phy2log = np.array(doc["physical_to_logical_map"][layer])
        rows, seq = kept(recorded["rows"][layer], lost[layer]), kept(recorded["seq"], lost[layer])
        # The split takes whole sequences (the first 2 of 5 in order of first appearance), as without a gap.
        fit = np.isin(seq, [0, 1])
        assert (doc["layers"][layer]["fit_passes"], doc["layers"][layer]["split"]) == (int(fit.sum()), "sequences")
        at = lost[layer][0][0]  # the kept rows before the gap
        for key, window in (("batch_in_sample", fit), ("batch_out_of_sample", ~fit)):
            batches = []
            for side in (np.arange(rows.shape[0]) < at, np.arange(rows.shape[0]) >= at):
                ids, s = rows[window & side], seq[window & side]
                # Continuous batching of 3 rows over this side alone: a sequence resumes after the gap as new.
                step = serving_iterations(s, np.ones_like(s), 3)
                batches += [ids[step == t] for t in range(int(step.max()) + 1)]
            assert doc["layers"][layer]["after"][key] == _batch_mean(phy2log, batches)


def _round_robin(phy2log: np.ndarray, pieces: list[np.ndarray]) -> float:
    """Round-robin's imbalance with each piece one kernel call (blocks restarting), from the unbroken model."""
    loads = sum(dispatch_loads("round-robin", phy2log[None], routing(
        [np.bincount(p.ravel(), minlength=EXPERTS)[None]], [[p]]), 2) for p in pieces)
    return float(imbalance(loads)[0][0])


def test_round_robin_starts_a_kernel_call_at_a_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd)
    doc = _place(path, capfd, "--slots", "24", "--dispatch", "round-robin")
    placement = path.with_name("placement.json")
    assert main(["analyze", str(path), "--placement", str(placement), "--json"]) == 0
    analyzed = json.loads(capfd.readouterr().out)["placement"]["layers"]
    for layer in range(LAYERS):
        phy2log = np.array(doc["physical_to_logical_map"][layer])
        expected = _round_robin(phy2log, _sides(recorded["rows"][layer], lost[layer]))
        assert expected != _round_robin(phy2log, [kept(recorded["rows"][layer], lost[layer])])  # the gap matters
        assert doc["layers"][layer]["imbalance"]["round-robin"] == expected
        assert analyzed[layer]["imbalance"]["round-robin"] == expected


def test_merge_refuses_a_gapped_capture_naming_it_and_the_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path, _, lost = _gapped(tmp_path, monkeypatch, capfd)
    other = tmp_path / "other.json"
    with turbospark.RouterHistogram(str(other), LAYERS, EXPERTS, K, trace=True) as hist:
        hist.record(0, [1, 2])
    capfd.readouterr()
    out = tmp_path / "m.json"
    assert main(["merge", str(other), str(path), "-o", str(out)]) == 2
    rows = ", ".join(f"layer {layer} rows [{a}, {b})" for layer, ((a, b),) in enumerate(lost))
    assert capfd.readouterr().err == (
        f"turbospark: cannot merge {path}: its streamed trace misses rows lost to a failed append, with rows kept "
        f"after them ({rows}); a merged capture cannot say which rows are missing, so its trace would read as "
        "unbroken across the gap. turbospark analyze FILES... reports the merge with each file's gaps as breaks\n")
    assert not out.exists()
    # analyze FILES... (the merge's report) answers, each file's gap a break.
    assert main(["analyze", str(other), str(path), "--json"]) == 0


def test_export_to_json_and_routed_experts_refuse_a_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    path, _, lost = _gapped(tmp_path, monkeypatch, capfd, tagged=True)
    rows = ", ".join(f"layer {layer} rows [{a}, {b})" for layer, ((a, b),) in enumerate(lost))
    out = tmp_path / "e.json"
    assert main(["export", str(path), "--to", "json", "-o", str(out)]) == 2
    assert capfd.readouterr().err == (
        f"turbospark: cannot export {path} as one JSON document: its streamed trace misses rows lost to a failed "
        f"append, with rows kept after them ({rows}); the JSON cannot say which rows are missing, so its trace "
        "would read as unbroken across the gap. --to parquet keeps the gap (the pass column holds the recorded "
        "row indices)\n")
    assert not out.exists()
    assert main(["export", str(path), "--to", "json"]) == 2
    assert capfd.readouterr().out == ""
    npz = tmp_path / "r.npz"
    assert main(["export", str(path), "--to", "routed-experts", "-o", str(npz)]) == 2
    assert capfd.readouterr().err == (
        "turbospark: routed experts align a sequence's passes across layers by order, but the streamed trace "
        f"misses rows lost to a failed append, with rows kept after them ({rows}): the lost passes' sequences "
        "are unknown, so the later passes would be replayed for the wrong tokens\n")
    assert not npz.exists()


def test_export_to_parquet_carries_the_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    pq = require_module("pyarrow.parquet")
    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd, tagged=True)
    assert main(["export", str(path), "--to", "parquet", "-o", str(tmp_path / "ds")]) == 0
    for layer in range(LAYERS):
        file = tmp_path / "ds" / "rank=0" / f"layer={layer}" / "part-0.parquet"
        table = pq.read_table(file)
        # The pass column holds the recorded indices: it jumps over the missing rows.
        assert table["pass"].to_pylist() == kept(np.arange(PASSES), lost[layer]).tolist()
        assert table["ids"].to_pylist() == kept(recorded["rows"][layer], lost[layer]).tolist()
        assert table["seq"].to_pylist() == kept(recorded["seq"], lost[layer]).tolist()
        meta = json.loads(pq.read_schema(file).metadata[b"turbospark"])
        assert (meta["missing"], meta["passes"]) == (lost[layer], PASSES - (lost[layer][0][1] - lost[layer][0][0]))


def test_compare_counts_what_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """compare reads counts and whole passes, never consecutive ones: it needed no change (this passed before)."""
    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd)
    rows = [kept(recorded["rows"][layer], lost[layer]) for layer in range(LAYERS)]
    twin = turbospark.loads(json.dumps({
        "num_layers": LAYERS, "num_experts": EXPERTS, "top_k": K,
        "counts": [np.bincount(r.ravel(), minlength=EXPERTS).tolist() for r in rows],
        "trace": [r.ravel().tolist() for r in rows]}))
    other = turbospark.loads(json.dumps({"num_layers": LAYERS, "num_experts": EXPERTS, "top_k": K,
                                         "counts": [[1] * EXPERTS] * LAYERS}))
    assert compare(other, turbospark.load(path)) == compare(other, twin)


class _Axes:
    """Records what a panel draws (its plot calls' y values); every other call is taken and ignored."""

    def __init__(self) -> None:
        self.lines: list[list[float]] = []
        self.xaxis = self

    def plot(self, xs: Any, ys: Any, *args: Any, **kwargs: Any) -> None:
        self.lines.append(list(ys))

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def test_plot_windows_never_span_a_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from turbospark.outputs.plot import _windows

    path, recorded, lost = _gapped(tmp_path, monkeypatch, capfd)
    axes = _Axes()
    _windows(axes, turbospark.load(path), 8)
    # The measured curve: per M, the mean over layers of the sides' windows pooled, naively.
    expected = []
    for m in range(1, 9):
        means = []
        for layer in range(LAYERS):
            sides = [[set(p) for p in side.tolist()] for side in _sides(recorded["rows"][layer], lost[layer])]
            sizes = [len(set().union(*s[i:i + m])) for s in sides for i in range(len(s) - m + 1)]
            means.append(sum(sizes) / len(sizes))
        expected.append(float(np.mean(means)))
    assert axes.lines[-1] == expected
