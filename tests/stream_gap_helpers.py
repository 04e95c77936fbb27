"""A streamed capture with one failed append, and its rows as recorded (a helper module, not a test).

Used by the tests of the gap itself (tests/recording/test_stream_gaps.py) and of every command that
reads a gapped capture (tests/recording/test_stream_gap_consumers.py).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from turbospark.recording.durable import _stream

PASSES, LAYERS, EXPERTS, K = 1000, 2, 16, 2


def record_with_one_failed_append(path: Path, cls: Any, monkeypatch: pytest.MonkeyPatch, tagged: bool, *,
                                  pilot: bool = False, fail: int = 7,
                                  predict_ahead: bool = False) -> dict[str, Optional[np.ndarray]]:
    """1,000 passes per layer, in calls of 10; append ``fail`` - 1 after the header fails with ENOSPC.

    Returns the rows as recorded: ``rows`` (per layer (P, K)), ``seq`` (P,) (five sequences,
    interleaved seven passes at a time; used only when ``tagged``), and with ``pilot`` (``pilot="next"``)
    ``preds``, layer 1's (P, K) predictions, filed after layer 0's passes of the call (``predict_ahead``:
    before them, so a chunk can hold a prediction whose pass it does not hold).
    """
    monkeypatch.setattr(_stream, "CHUNK_IDS", 100)
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == fail:  # the header is call 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    rng = np.random.default_rng(7)
    rows = [np.argsort(rng.random((PASSES, EXPERTS)) ** (1 + layer), axis=1)[:, :K] % 6 * 2 + layer
            for layer in range(LAYERS)]
    # Predictions near the passes: a pass's prediction is its ids with the second one moved on, now and then.
    preds = rows[1].copy()
    preds[::3, 1] = (preds[::3, 1] + 5) % EXPERTS
    seq = np.arange(PASSES) // 7 % 5  # five sequences, interleaved seven passes at a time
    hist = cls(str(path), LAYERS, EXPERTS, K, trace="stream", pilot="next" if pilot else None)
    for lo in range(0, PASSES, 10):
        if pilot and predict_ahead:
            hist.record_prediction_many(1, preds[lo:lo + 10])
        for layer in range(LAYERS):
            if tagged:
                hist.record_batch(layer, rows[layer][lo:lo + 10], seq=seq[lo:lo + 10], phase="decode")
            else:
                hist.record_many(layer, rows[layer][lo:lo + 10])
            if pilot and not predict_ahead and layer == 0:
                hist.record_prediction_many(1, preds[lo:lo + 10])
    hist.close()
    assert calls["n"] > fail + 1
    return {"rows": rows, "seq": seq, "preds": preds if pilot else None}


def kept(rows: np.ndarray, lost: list[list[int]]) -> np.ndarray:
    """``rows`` less the ``[first, stop)`` ranges ``lost`` (a layer's ``stream.lost_rows``)."""
    keep = np.ones(rows.shape[0], dtype=bool)
    for first, stop in lost:
        keep[first:stop] = False
    return rows[keep]
