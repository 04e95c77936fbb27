"""The trace-metric sums in numpy: the reference the compiled kernel must match.

``csrc/_metrics.pyx`` (``turbospark.metrics._metrics_kernels``) computes the
same integer sums one pass at a time in O(E) memory per run; this twin
keeps the current run's passes and, when the run ends, answers with the
whole-array bitset code of ``layers.py`` (sparse-table window unions,
popcounts, LRU stack distances), so its memory grows with the longest run.
``trace_sums.py`` turns the sums into the report's floats for both.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._primitives import _popcount, _window_totals, lru_stack_distances, pass_bitsets

__all__ = ["RunSums"]

_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.int64))


class RunSums:
    """Exact integer sums of one layer's trace metrics (same API as the compiled ``RunSums``).

    ``feed(ids, pred)`` continues the current run, ``end_run()`` closes it,
    ``add_runs(ids, pred, order, starts)`` adds whole runs, ``sums()`` returns
    the totals. Raises ValueError for ids outside 0..E-1 or a wrong width.
    """

    def __init__(self, num_experts: int, top_k: int, windows: Any, max_cache: int) -> None:
        ws = sorted({int(w) for w in windows})
        if ws and ws[0] < 1:
            raise ValueError(f"window size must be at least 1, got {ws[0]}")
        if num_experts < 0 or top_k < 0 or max_cache < 0:
            raise ValueError("num_experts, top_k and max_cache must be non-negative")
        self._e, self._k, self._windows = num_experts, top_k, ws
        self._d1 = min(top_k, num_experts) + 1
        self._cap = min(max_cache, num_experts)
        self._run: list[np.ndarray] = []
        self._total = [0] * len(ws)
        self._count = [0] * len(ws)
        self._reuse = np.zeros(self._d1 * self._d1, dtype=np.int64)
        self._pilot = np.zeros(self._d1 * self._d1, dtype=np.int64)
        self._exact = self._aligned = self._lookups = 0
        self._hits = np.zeros(self._cap, dtype=np.int64)
        self._counts = np.zeros(num_experts, dtype=np.int64)

    def _checked(self, ids: np.ndarray, pred: Optional[np.ndarray]) -> np.ndarray:
        if ids.ndim != 2 or ids.shape[1] != self._k:
            raise ValueError(f"ids must be (passes, {self._k}), got shape {ids.shape}")
        for what, array in (("ids", ids), ("pred", pred)):
            if array is None:
                continue
            if array.dtype not in _DTYPES:
                raise TypeError(f"ids must be uint8, uint16, uint32 or int64, got {array.dtype}")
            if array.ndim != 2 or not array.flags.c_contiguous:
                raise ValueError(f"{what} must be a C-contiguous 2-D array")
            if array.size and (int(array.max()) >= self._e or (array.dtype.kind == "i" and int(array.min()) < 0)):
                bad = int(array.max()) if int(array.max()) >= self._e else int(array.min())
                name = "predicted expert id" if what == "pred" else "expert id"
                raise ValueError(f"{name} {bad} outside 0..{self._e - 1}")
        # Widened once: the twin favours clarity; the kernel reads the narrow ids.
        return ids.astype(np.int64)

    def feed(self, ids: np.ndarray, pred: Optional[np.ndarray] = None) -> None:
        """Continue the current run with the passes ``ids`` (P, K); row i of ``pred`` is pass i's prediction."""
        wide = self._checked(ids, pred)
        self._per_pass(wide, pred, np.arange(wide.shape[0]))
        self._run.append(wide)

    def end_run(self) -> None:
        """Close the current run: its windows are counted, its cache emptied."""
        if not self._run:
            return
        ids = np.concatenate(self._run) if len(self._run) > 1 else self._run[0]
        self._run = []
        bits = pass_bitsets(ids, self._e)
        for index, (total, count) in enumerate(_window_totals(bits, self._windows).values()):
            self._total[index] += total
            self._count[index] += count
        if bits.shape[0] >= 2:
            a, b = _popcount(bits[1:] & bits[:-1]), _popcount(bits[1:])
            self._reuse += np.bincount(a * self._d1 + b, minlength=self._reuse.shape[0])
        if self._cap:
            distances = lru_stack_distances(ids, self._e)
            self._lookups += distances.shape[0]
            hit = distances[(distances >= 0) & (distances < self._cap)]
            self._hits += np.bincount(hit, minlength=self._cap)

    def add_runs(self, ids: np.ndarray, pred: Optional[np.ndarray], order: np.ndarray, starts: np.ndarray) -> None:
        """Whole runs: passes ``ids[order[starts[r]:starts[r + 1]]]`` form run r (the last runs to the end)."""
        wide = self._checked(ids, pred)
        if order.dtype != np.int64 or starts.dtype != np.int64 or order.ndim != 1 or starts.ndim != 1:
            raise ValueError("order and starts must be 1-D int64 arrays")
        if order.size and (int(order.min()) < 0 or int(order.max()) >= wide.shape[0]):
            raise ValueError(f"order holds a pass outside 0..{wide.shape[0] - 1}")
        if starts.size and (int(starts.min()) < 0 or int(starts.max()) > order.shape[0]
                            or bool((np.diff(starts) < 0).any())):
            raise ValueError("starts must be ascending positions in order")
        self.end_run()
        bounds = starts.tolist() + [order.shape[0]]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            run = order[lo:hi]
            self._per_pass(wide[run], pred, run)
            self._run.append(wide[run])
            self.end_run()

    def _per_pass(self, ids: np.ndarray, pred: Optional[np.ndarray], rows: np.ndarray) -> None:
        """Counts and the pilot sums: per pass, independent of runs (``rows``: the passes' indices)."""
        self._counts += np.bincount(ids.ravel(), minlength=self._e)[: self._e]
        if pred is None:
            return
        aligned = rows < pred.shape[0]
        if not aligned.any():
            return
        actual = pass_bitsets(ids[aligned], self._e)
        guess = pass_bitsets(pred[rows[aligned]].astype(np.int64), self._e)
        a, b = _popcount(guess & actual), _popcount(actual)
        self._pilot += np.bincount(a * self._d1 + b, minlength=self._pilot.shape[0])
        self._exact += int((guess == actual).all(axis=1).sum())
        self._aligned += int(aligned.sum())

    def sums(self) -> dict[str, Any]:
        """The totals so far (the current run, if open, is not in the window sums): a dict of ints and lists."""
        return {
            "window_total": list(self._total),
            "window_count": list(self._count),
            "reuse": self._reuse.tolist(),
            "pilot": self._pilot.tolist(),
            "exact": self._exact,
            "aligned": self._aligned,
            "hits": self._hits.tolist(),
            "lookups": self._lookups,
            "counts": self._counts.copy(),
        }
