"""A straightforward pure-Python ``analyze --json``: the tests' independent oracle, and
the comparison ``benchmarks/bench_analyze.py`` times ``analyze`` against.

It follows the definitions in the issue literally -- ``json.load`` into lists,
one Python ``set`` per pass, a union per window, an ``OrderedDict`` LRU -- and
does no validation beyond what the definitions need.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from fractions import Fraction
from typing import Any, Iterable

FRACTIONS = ("0.5", "0.9", "0.95", "0.99")


def naive_analyze_file(path: str, windows: Iterable[int] = (1, 2, 4, 8), caches: Iterable[int] = ()) -> dict[str, Any]:
    """Load ``path`` with json and analyse it; returns the ``--json`` document."""
    with open(path, encoding="utf-8") as handle:
        return naive_analyze(json.load(handle), windows, caches)


def naive_analyze(doc: dict[str, Any], windows: Iterable[int] = (1, 2, 4, 8), caches: Iterable[int] = ()) -> dict[str, Any]:
    """Analyse a parsed capture document; returns the ``--json`` document."""
    windows = sorted(set(windows))
    caches = sorted(set(caches))
    k, e = doc["top_k"], doc["num_experts"]
    counts = doc["counts"]
    trace = doc.get("trace")
    pred = doc.get("pred")
    layers = []
    for layer, row in enumerate(counts):
        total = sum(row)
        entry: dict[str, Any] = {"layer": layer}
        if k == 0:
            entry["passes"] = 0 if total == 0 else None
        else:
            entry["passes"] = total // k if total % k == 0 else total / k
        entry["entropy_bits"] = _entropy(row, total)
        entry["coverage"] = _coverage(row, total)
        entry["window_distinct"] = None
        entry["reuse"] = None
        entry["pilot_recall"] = None
        entry["pilot_exact"] = None
        if trace is not None:
            sets = _passes(trace[layer], k)
            entry["window_distinct"] = {str(m): _window(sets, m) for m in windows}
            entry["reuse"] = _reuse(sets)
            if layer > 0 and pred is not None:
                entry["pilot_recall"], entry["pilot_exact"] = _pilot(_passes(pred[layer], k), sets)
            if caches:
                entry["lru_hit_rate"] = {str(c): _lru(trace[layer], k, c) for c in caches}
        layers.append(entry)
    totals = [sum(row) for row in counts]
    matches = None
    if trace is not None:
        matches = True
        for layer, ids in enumerate(trace):
            recount = [0] * e
            for expert in ids:
                recount[expert] += 1
            if recount != counts[layer]:
                matches = False
    return {
        "num_layers": doc["num_layers"],
        "num_experts": e,
        "top_k": k,
        "random_recall_baseline": k / e if e else None,
        "checks": {
            "counts_sum_ok": all((n % k == 0) if k else n == 0 for n in totals),
            "trace_matches_counts": matches,
        },
        "layers": layers,
    }


def _passes(flat: list[int], k: int) -> list[set[int]]:
    return [set(flat[i : i + k]) for i in range(0, len(flat), k)] if k else []


def _entropy(row: list[int], total: int) -> float | None:
    if total == 0:
        return None
    return sum(c / total * math.log2(total / c) for c in row if c)


def _coverage(row: list[int], total: int) -> dict[str, int] | None:
    if total == 0:
        return None
    ranked = sorted(row, reverse=True)
    result = {}
    for text in FRACTIONS:
        need = Fraction(text) * total
        running = 0
        for n, c in enumerate(ranked, start=1):
            running += c
            if running >= need:
                result[text] = n
                break
    return result


def _window(sets: list[set[int]], m: int) -> float | None:
    if len(sets) < m:
        return None
    sizes = [len(set().union(*sets[s : s + m])) for s in range(len(sets) - m + 1)]
    return sum(sizes) / len(sizes)


def _reuse(sets: list[set[int]]) -> float | None:
    if len(sets) < 2:
        return None
    ratios = [len(sets[p] & sets[p - 1]) / len(sets[p]) for p in range(1, len(sets))]
    return sum(ratios) / len(ratios)


def _pilot(guesses: list[set[int]], sets: list[set[int]]) -> tuple[float | None, float | None]:
    pairs = list(zip(guesses, sets))
    if not pairs:
        return None, None
    recall = sum(len(g & s) / len(s) for g, s in pairs) / len(pairs)
    exact = sum(1 for g, s in pairs if g == s) / len(pairs)
    return recall, exact


def _lru(flat: list[int], k: int, slots: int) -> float | None:
    hits, lookups = lru_counts((flat[start : start + k] for start in range(0, len(flat), k)), slots)
    return hits / lookups if lookups else None


def lru_counts(passes: Iterable[Iterable[int]], slots: int) -> tuple[int, int]:
    """(hits, lookups) of an LRU cache of ``slots`` experts over ``passes``, each looked up once per pass."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = lookups = 0
    for ids in passes:
        for expert in dict.fromkeys(ids):  # distinct, trace order
            lookups += 1
            if expert in cache:
                hits += 1
                cache.move_to_end(expert)
            else:
                cache[expert] = None
                if len(cache) > slots:
                    cache.popitem(last=False)
    return hits, lookups
