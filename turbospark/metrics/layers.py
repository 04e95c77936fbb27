"""The numbers a capture exists for, per layer, vectorised with numpy.

Definitions (per layer; S_p is the set of ids of pass p in the trace, N the
layer's count total, K = top_k, E = num_experts):

* ``passes`` = N / K; ``entropy_bits`` = Shannon entropy (base 2) of counts / N;
  ``coverage[f]`` = fewest experts whose counts, largest first, reach f x N.
* ``window_distinct[M]`` = mean over the P - M + 1 windows of M consecutive
  passes of |union of their S_p|: the experts a verify of M tokens must read.
* ``reuse`` = mean over p >= 1 of |S_p & S_(p-1)| / |S_p|.
* ``pilot_recall`` / ``pilot_exact``: over the common prefix of the layer's
  predictions and trace, mean |pred_p & S_p| / |S_p|, and the share of passes
  where the two sets are equal.
* ``lru_hit_rate[C]``: a C-slot LRU per layer fed each pass's distinct ids in
  trace order; hits / lookups.

How: each pass's set is a row of 64-bit words, so set sizes, intersections
and unions are whole-array popcount / AND / OR operations; unions over runs
of passes come from a sparse table of power-of-two spans. Nothing loops over
passes in Python. Means of per-pass ratios are summed with ``math.fsum`` so
the result does not depend on summation order; integer totals are divided
once, giving the same float as a plain-Python evaluation.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..capture.reader import Capture
from ..capture.rows import layer_breaks, layer_rows
from ._primitives import _popcount, _window_totals, lru_stack_distances, pass_bitsets
from .trace_sums import run_sums, trace_values

__all__ = [
    "COVERAGE_FRACTIONS",
    "DEFAULT_WINDOWS",
    "analyze",
    "count_sum_failures",
    "coverage",
    "entropy_bits",
    "lru_hit_rates",
    "lru_stack_distances",
    "pass_bitsets",
    "pilot_scores",
    "reuse",
    "self_test",
    "trace_mismatches",
    "uniform_window_distinct",
    "window_distinct",
]

COVERAGE_FRACTIONS: tuple[str, ...] = ("0.5", "0.9", "0.95", "0.99")
DEFAULT_WINDOWS: tuple[int, ...] = (1, 2, 4, 8)


def analyze(
    capture: Capture,
    windows: Iterable[int] = DEFAULT_WINDOWS,
    caches: Iterable[int] = (),
) -> dict[str, Any]:
    """The ``analyze --json`` document for ``capture``, as plain Python values.

    ``windows``: window sizes M (>= 1) for ``window_distinct``; ``caches``:
    LRU sizes C (>= 1), reported only when non-empty and the trace is present.
    Keys ``"M"``/``"C"`` are decimal strings, ascending, duplicates merged.
    Raises ``ValueError`` for a window or cache size below 1.
    """
    window_sizes = _sizes(windows, "window size")
    cache_sizes = _sizes(caches, "cache size")
    k, e = capture.top_k, capture.num_experts
    totals = [int(n) for n in capture.totals]
    trace = capture.trace
    layers = []
    recounts: list[Optional[np.ndarray]] = []  # per layer, the counts recomputed from its trace
    for layer in range(capture.num_layers):
        row = capture.counts[layer]
        entry: dict[str, Any] = {
            "layer": layer,
            "passes": _passes(totals[layer], k),
            "entropy_bits": entropy_bits(row),
            "coverage": coverage(row),
            "window_distinct": None,
            "reuse": None,
            "pilot_recall": None,
            "pilot_exact": None,
        }
        if capture.seq is not None:
            # Batched captures: the trace metrics per sequence, pooled and per phase (these
            # replace the whole-trace values, so those are not computed).
            from .sequences import layer_and_counts

            by_sequence, recount = layer_and_counts(capture, layer, window_sizes, cache_sizes)
            entry.update(by_sequence)
            recounts.append(recount)
        elif trace is not None:
            guesses = capture.pred if layer > 0 else None
            sums = run_sums(trace, guesses, layer, e, k, window_sizes, cache_sizes, layer_breaks(capture, layer))
            entry.update(trace_values(sums, window_sizes, cache_sizes, guesses is not None))
            recounts.append(sums["counts"])
        layers.append(entry)
    extra: dict[str, Any] = {}
    if capture.seq is not None:
        from .sequences import sequence_ids

        extra["sequences"] = len(sequence_ids(capture))
    # From the counts the trace metrics already recomputed: no second pass over the trace.
    trace_ok = None if trace is None else not _mismatches(capture, recounts)
    return document(capture, not count_sum_failures(capture), trace_ok, layers, extra)


def document(capture: Capture, counts_ok: bool, trace_ok: bool | None, layers: list[dict[str, Any]],
             extra: dict[str, Any]) -> dict[str, Any]:
    """``analyze``'s document from its parts: the header, the checks, the layer entries, then ``extra``
    (``sequences`` when given) and the capture's ``pilot_distance``, ``trace_cap`` and ``trace_dropped``.
    ``analyze`` of many files (``distributed``) assembles its document here too, so the keys agree."""
    extra = dict(extra)
    if capture.pilot_distance is not None:
        extra["pilot_distance"] = list(capture.pilot_distance)
    if capture.trace_cap is not None and capture.trace_dropped is not None:
        # The trace metrics are over each layer's first trace_cap passes.
        extra["trace_cap"] = capture.trace_cap
        extra["trace_dropped"] = capture.trace_dropped.tolist()
    k, e = capture.top_k, capture.num_experts
    return {
        "num_layers": capture.num_layers,
        "num_experts": e,
        "top_k": k,
        "random_recall_baseline": k / e if e else None,
        "checks": {"counts_sum_ok": counts_ok, "trace_matches_counts": trace_ok},
        "layers": layers,
        **extra,
    }


def self_test(capture: Capture, result: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The ``--self-test`` verdict for a capture made with the probe in self mode.

    Takes the capture and its ``analyze`` result; returns (checked, failed):
    the layers >= 1 that hold predictions, and those among them whose
    ``pilot_recall`` is not exactly 1.0 (null counts as failed: predictions
    with nothing to compare them to). The test passes when ``checked`` is
    non-empty and ``failed`` is empty.
    """
    if capture.pred is None:
        return [], []
    checked = [layer for layer in range(1, capture.num_layers) if len(capture.pred[layer])]
    failed = [layer for layer in checked if result["layers"][layer]["pilot_recall"] != 1.0]
    return checked, failed


def _sizes(values: Iterable[int], what: str) -> list[int]:
    sizes = sorted({int(v) for v in values})
    if sizes and sizes[0] < 1:
        raise ValueError(f"{what} must be at least 1, got {sizes[0]}")
    return sizes


def _passes(total: int, k: int) -> int | float | None:
    # A count total that is not a multiple of K fails counts_sum_ok; the
    # fractional N / K is reported as is so the mismatch stays visible.
    if k == 0:
        return 0 if total == 0 else None
    return total // k if total % k == 0 else total / k


def count_sum_failures(capture: Capture) -> list[int]:
    """Layers whose count total N is not a multiple of top_k (N must be 0 when top_k is 0)."""
    k = capture.top_k
    return [
        layer
        for layer, total in enumerate(capture.totals.tolist())
        if (total % k if k else total)
    ]


def trace_mismatches(capture: Capture) -> list[int]:
    """Layers whose counts differ from the counts recomputed from the trace;
    empty when the capture has no trace.

    A capped trace (``trace_cap``) is held to what it kept: in a layer that
    dropped passes, the kept passes plus the dropped ones must be the passes
    the counts hold (N / top_k), and no expert may be picked more often in the
    kept passes than the counts say; a layer that dropped none must reproduce
    its counts exactly, as in an uncapped trace.
    """
    if capture.trace is None:
        return []
    return _mismatches(capture, [np.bincount(ids.ravel(), minlength=capture.num_experts) for ids in capture.trace])


def _mismatches(capture: Capture, recounts: Sequence[Optional[np.ndarray]]) -> list[int]:
    """``trace_mismatches`` from each layer's counts recomputed from its trace (None: no trace)."""
    dropped = capture.trace_dropped
    bad = []
    for layer, (kept, row) in enumerate(zip(recounts, capture.counts)):
        if kept is None:
            continue
        if dropped is None or not dropped[layer]:
            if not np.array_equal(kept, row):
                bad.append(layer)
            continue
        passes = (layer_rows(capture.trace, layer) + int(dropped[layer])) * capture.top_k
        if passes != int(row.sum()) or kept.shape != row.shape or bool((kept > row).any()):
            bad.append(layer)
    return bad


# ------------------------------------------------------------ count metrics


def entropy_bits(counts: np.ndarray) -> float | None:
    """Shannon entropy in bits of ``counts / counts.sum()``; None when the sum is 0."""
    total = int(counts.sum())
    if total == 0:
        return None
    nonzero = counts[counts > 0].astype(np.float64)
    # p * log2(1/p) term by term keeps a single-expert layer at 0.0, not -0.0.
    return math.fsum((nonzero / total * np.log2(total / nonzero)).tolist())


def coverage(
    counts: np.ndarray, fractions: Sequence[str] = COVERAGE_FRACTIONS
) -> dict[str, int] | None:
    """For each fraction f (a decimal string), the fewest experts whose counts,
    largest first, reach at least f x N. None when N is 0.

    The comparison is exact (integer arithmetic on the decimal), so 0.9 x 10
    means 9, not 9.000000000000002.
    """
    total = int(counts.sum())
    if total == 0:
        return None
    cumulative = np.cumsum(np.sort(counts)[::-1])
    result = {}
    for text in fractions:
        f = Fraction(text)
        # cumulative * den >= num * N  <=>  cumulative >= f * N
        index = int(np.searchsorted(cumulative * f.denominator, f.numerator * total, side="left"))
        result[text] = min(index + 1, len(cumulative))
    return result


# ------------------------------------------------------------ trace metrics
#
# Each pass's set S_p is a row of 64-bit words (``_primitives.py``: the
# bitsets, their popcount and the sparse table of pass unions).


def window_distinct(
    ids: np.ndarray, num_experts: int, windows: Iterable[int], breaks: Sequence[int] = ()
) -> dict[int, float | None]:
    """Mean size of the union of S_p over every window of M consecutive passes.

    Takes a layer's (P, K) trace, E and window sizes, and optionally the
    positions where rows resume after a gap (``trace_sums.layer_breaks``: no
    window spans one); returns {M: mean or None}, None when no run holds M passes.
    """
    sizes = list(windows)
    cuts = [0] + sorted({b for b in breaks if 0 < b < ids.shape[0]}) + [ids.shape[0]]
    if len(cuts) == 2:
        return _window_distinct(pass_bitsets(ids, num_experts), sizes)
    totals = {m: [0, 0] for m in sizes}
    for a, b in zip(cuts[:-1], cuts[1:]):
        for m, (total, count) in _window_totals(pass_bitsets(ids[a:b], num_experts), sizes).items():
            totals[m][0] += total
            totals[m][1] += count
    return {m: (total / count if count else None) for m, (total, count) in totals.items()}


def _window_distinct(bits: np.ndarray, windows: Sequence[int]) -> dict[int, float | None]:
    # Integer total, one division: the same float as summing the sizes.
    return {m: (total / count if count else None) for m, (total, count) in _window_totals(bits, windows).items()}


def uniform_window_distinct(num_experts: int, top_k: int, window: int) -> float:
    """Expected union size of ``window`` independent uniform top-k draws:
    E (1 - (1 - K/E)^M), the no-locality reference for ``window_distinct``."""
    if num_experts == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** window)


def reuse(ids: np.ndarray, num_experts: int) -> float | None:
    """Mean over p >= 1 of |S_p & S_(p-1)| / |S_p| for a (P, K) trace; None when P < 2."""
    return _reuse(pass_bitsets(ids, num_experts))


def _reuse(bits: np.ndarray) -> float | None:
    ratios = _reuse_ratios(bits)
    return math.fsum(ratios.tolist()) / ratios.shape[0] if ratios.shape[0] else None


def _reuse_ratios(bits: np.ndarray) -> np.ndarray:
    """|S_p & S_(p-1)| / |S_p| for p >= 1, as float64 (P - 1,)."""
    if bits.shape[0] < 2:
        return np.zeros(0, dtype=np.float64)
    return _popcount(bits[1:] & bits[:-1]) / _popcount(bits[1:])


def pilot_scores(
    pred: np.ndarray, ids: np.ndarray, num_experts: int
) -> tuple[float | None, float | None]:
    """(recall, exact) of a layer's (Q, K) predictions against its (P, K) trace.

    Only the first min(P, Q) passes align. Recall is the mean of
    |pred_p & S_p| / |S_p|, exact the share of passes whose two sets are
    equal. Both None when no pass aligns.
    """
    return _pilot(pass_bitsets(pred, num_experts), pass_bitsets(ids, num_experts))


def _pilot(guess: np.ndarray, actual: np.ndarray) -> tuple[float | None, float | None]:
    aligned = min(guess.shape[0], actual.shape[0])
    if aligned == 0:
        return None, None
    ratios, exact = _pilot_passes(guess[:aligned], actual[:aligned])
    return math.fsum(ratios.tolist()) / aligned, int(exact.sum()) / aligned


def _pilot_passes(guess: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per aligned pass: the recall ratio, and whether the two sets are equal."""
    return _popcount(guess & actual) / _popcount(actual), (guess == actual).all(axis=1)


def lru_hit_rates(
    ids: np.ndarray, num_experts: int, caches: Iterable[int]
) -> dict[int, float | None]:
    """Hit rate of a C-slot LRU expert cache per C, for a layer's (P, K) trace.

    The cache starts empty; each pass looks up its distinct ids in trace
    order. Returns {C: hits / lookups}, None when there are no lookups.
    """
    return _lru(ids, num_experts, list(caches))


def _lru(ids: np.ndarray, num_experts: int, caches: Sequence[int]) -> dict[int, float | None]:
    distances = lru_stack_distances(ids, num_experts)
    lookups = distances.shape[0]
    if lookups == 0:
        return {c: None for c in caches}
    # A lookup hits a C-slot LRU exactly when fewer than C other experts were
    # used since its last use, so one pass serves every C.
    seen = np.sort(distances[distances >= 0])
    return {c: int(np.searchsorted(seen, c, side="left")) / lookups for c in caches}
