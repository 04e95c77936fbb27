"""``merge`` of streamed captures writes as it reads: its memory is a chunk, not the merged capture (issue 25)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import turbospark
from turbospark.capture.merge import merge_captures

from childproc import run_script

_MERGE_RSS = """
from turbospark.capture import rows
from turbospark.cli import main
rows.CHUNK_PASSES = 1 << 14
before = peak_kib()
assert main(["merge", sys.argv[1], sys.argv[1], "-o", sys.argv[2]]) == 0
print((peak_kib() - before) // 1024)
"""


def test_merging_streamed_captures_stays_bounded(tmp_path: Path) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the peak from /proc/self/status (Linux)")
    path, out = tmp_path / "c.json", tmp_path / "merged.json"
    block = np.random.default_rng(0).integers(0, 128, (20_000, 8))
    with turbospark.RouterHistogram(str(path), 8, 128, 8, trace="stream") as hist:
        for step in range(8 * 10):  # 200 K passes per layer, 12.8 M ids; 64 sequences at a time
            hist.record_batch(step % 8, block, seq=(step // 16) * 64 + np.arange(20_000) % 64, phase="decode")
    result = run_script(tmp_path, _MERGE_RSS, str(path), str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    # The merged text (99 MB) was built whole before it was written: 394 MiB of growth before, 29 after.
    assert int(result.stdout.split()[-1]) < 64, result.stdout
    capture = turbospark.load(path)
    merged = turbospark.load(out)
    assert np.array_equal(merged.counts, 2 * capture.counts)
    for layer in (0, 7):
        assert np.array_equal(merged.trace[layer], np.concatenate([capture.trace[layer]] * 2))
        assert np.array_equal(merged.seq[layer], np.concatenate([capture.seq[layer], capture.seq[layer] + 5 * 64]))


def test_the_merged_pieces_are_merge_captures_bytes_for_any_chunk(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    paths = []
    for name, tagged in (("a", True), ("b", False), ("c", True)):
        paths.append(tmp_path / f"{name}.json")
        with turbospark.RouterHistogram(str(paths[-1]), 3, 9, 2, trace="stream", pilot="next") as hist:
            for step in range(12):
                ids = rng.integers(0, 9, (int(rng.integers(0, 6)), 2))
                if tagged:
                    hist.record_batch(step % 3, ids, seq=rng.integers(0, 4, ids.shape[0]), phase="prompt")
                else:
                    hist.record_many(step % 3, ids)
                hist.record_prediction_many(step % 3, ids)
    inputs = [(str(p), c, None if c.seq is None else (c.seq, c.phase)) for p in paths
              for c in [turbospark.load(p)]]
    from turbospark.capture import rows

    texts = []
    for chunk in (1, 2, 1 << 18):
        monkeypatch.setattr(rows, "CHUNK_PASSES", chunk)
        texts.append(merge_captures(inputs))
    assert texts[0] == texts[1] == texts[2]
    merged = turbospark.loads(texts[0])
    assert merged.trace is not None
    for layer in range(3):
        assert np.array_equal(merged.trace[layer], np.concatenate([c.trace[layer] for _, c, _ in inputs]))
