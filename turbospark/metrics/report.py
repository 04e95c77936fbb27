"""Human-readable text for an ``analyze`` result: a per-layer table and a model-wide summary."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Union


from .layers import COVERAGE_FRACTIONS, count_sum_failures, trace_mismatches, uniform_window_distinct
from ..capture.reader import Capture

__all__ = ["Heading", "format_report", "heading"]


@dataclass(frozen=True)
class Heading:
    """What the text report says of the capture beyond its ``analyze`` result: whether it has a trace
    and predictions, and the layers failing each check (``analyze`` of many files builds it from
    their summed state)."""

    traced: bool
    predicted: bool
    bad_counts: list[int]
    bad_trace: list[int]
    trace_dropped: bool


def heading(capture: Capture, result: dict[str, Any]) -> Heading:
    """The ``Heading`` of one capture and its ``analyze`` result (failing layers looked up only for a failed check)."""
    checks = result["checks"]
    dropped = capture.trace_dropped is not None and bool(capture.trace_dropped.any())
    return Heading(capture.trace is not None, capture.pred is not None,
                   [] if checks["counts_sum_ok"] else count_sum_failures(capture),
                   [] if checks["trace_matches_counts"] is not False else trace_mismatches(capture), dropped)


def format_report(capture: Union[Capture, Heading], result: dict[str, Any]) -> str:
    """The text ``turbospark analyze`` prints without ``--json``.

    Takes the capture (or its ``Heading``) and its ``analyze`` result; returns the table, the
    summary and the check lines, newline-terminated.
    """
    facts = heading(capture, result) if isinstance(capture, Capture) else capture
    lines = [_heading(result, facts)]
    lines += _table(result)
    lines.append("")
    lines += _summary(result)
    lines.append("")
    if "sequences" in result:
        lines += _phases(result)
        lines.append("")
    lines += _checks(result, facts)
    return "\n".join(lines) + "\n"


def _heading(result: dict[str, Any], facts: Heading) -> str:
    parts = [
        f"{result['num_layers']} layers x {result['num_experts']} experts, top-{result['top_k']}",
        "trace: " + ("yes" if facts.traced else "no (window, reuse, pilot and LRU need it)"),
        "predictions: " + ("yes" if facts.predicted else "no"),
    ]
    if "sequences" in result:
        parts.append(f"sequences: {result['sequences']} (trace metrics per sequence, never across)")
    text = "capture: " + "; ".join(parts)
    if "trace_cap" in result:
        text += "\n" + _cap_line(result["trace_cap"], result["trace_dropped"])
    return text


def _cap_line(cap: int, dropped: list[int]) -> str:
    """The capped trace's line: the cap, and which layers dropped how many passes (counted, not traced)."""
    text = f"trace capped at {cap} passes per layer (trace metrics over each layer's first {cap}): "
    full = [(layer, d) for layer, d in enumerate(dropped) if d]
    if not full:
        return text + "no pass dropped"
    listed = ", ".join(f"layer {layer} {d}" for layer, d in full)
    return text + f"{sum(d for _, d in full)} passes dropped (counted, not traced): {listed}"


# ------------------------------------------------------------------- table


def _table(result: dict[str, Any]) -> list[str]:
    layers = result["layers"]
    first = layers[0] if layers else {}
    windows = list((first.get("window_distinct") or {}).keys())
    caches = list((first.get("lru_hit_rate") or {}).keys())
    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("layer", lambda r: str(r["layer"])),
        ("passes", lambda r: _num(r["passes"])),
        ("entropy", lambda r: _fixed(r["entropy_bits"], 2)),
    ]
    for f in COVERAGE_FRACTIONS:
        label = f"cov{round(float(f) * 100)}"
        columns.append((label, lambda r, f=f: "-" if r["coverage"] is None else str(r["coverage"][f])))
    for m in windows:
        columns.append((f"d@{m}", lambda r, m=m: _fixed((r["window_distinct"] or {}).get(m), 2)))
    columns += [
        ("reuse", lambda r: _pct(r["reuse"])),
        ("recall", lambda r: _pct(r["pilot_recall"])),
        ("exact", lambda r: _pct(r["pilot_exact"])),
    ]
    for c in caches:
        columns.append((f"lru@{c}", lambda r, c=c: _pct((r.get("lru_hit_rate") or {}).get(c))))
    cells = [[fmt(row) for _, fmt in columns] for row in layers]
    widths = [max([len(name)] + [len(line[i]) for line in cells]) for i, (name, _) in enumerate(columns)]
    out = ["  ".join(name.rjust(w) for (name, _), w in zip(columns, widths))]
    for row, line in zip(layers, cells):
        text = "  ".join(cell.rjust(w) for cell, w in zip(line, widths))
        out.append(text + ("  (never routed)" if row["passes"] == 0 else ""))
    out += textwrap.wrap(
        "entropy in bits; covNN: fewest experts holding NN% of selections; d@M: distinct "
        "experts per window of M consecutive passes; reuse: share of a pass's experts also "
        "in the previous pass; recall/exact: one-layer-ahead prediction; lru@C: hit rate "
        "of a C-slot LRU expert cache; -: not measurable (no data, too few passes, layer 0).",
        width=100,
    )
    return out


# ----------------------------------------------------------------- summary


def _summary(result: dict[str, Any]) -> list[str]:
    layers = result["layers"]
    e, k = result["num_experts"], result["top_k"]
    routed = [r for r in layers if r["entropy_bits"] is not None]
    dense = [r["layer"] for r in layers if r["entropy_bits"] is None]
    out = ["model-wide (means over routed layers):"]
    out.append(f"  routed layers: {len(routed)} of {len(layers)}" + (f"; never routed: {_ranges(dense)}" if dense else ""))
    if not routed:
        return out
    passes = sorted({r["passes"] for r in routed if r["passes"] is not None})
    out.append("  passes per routed layer: " + ", ".join(_num(p) for p in passes))
    if e > 1:
        out.append(f"  entropy: {_mean(routed, lambda r: r['entropy_bits']):.2f} bits (uniform routing: {math.log2(e):.2f})")
    for f in ("0.5", "0.9"):
        n = _mean(routed, lambda r: r["coverage"][f])
        out.append(f"  {round(float(f) * 100)}% of selections fall on {n:.1f} of {e} experts")
    windows = list((routed[0].get("window_distinct") or {}).keys())
    if windows:
        out.append("  distinct experts a verify of M consecutive tokens reads (vs M x top_k, and uniform routing):")
        for m in windows:
            mean = _mean(routed, lambda r: r["window_distinct"][m])
            if mean is None:
                out.append(f"    M={m}: - (fewer than {m} passes)")
                continue
            reads = int(m) * k
            uniform = uniform_window_distinct(e, k, int(m))
            saving = f", {1 - mean / reads:.0%} fewer reads" if reads and int(m) > 1 else ""
            out.append(f"    M={m}: {mean:.2f} (vs {reads}{saving}; uniform {uniform:.2f})")
    reuse = _mean(routed, lambda r: r["reuse"])
    if reuse is not None:
        out.append(f"  reuse: {reuse:.1%} of a pass's experts were also picked by the pass before")
    recall = _mean(layers, lambda r: r["pilot_recall"])
    baseline = result["random_recall_baseline"]
    if recall is not None:
        exact = _mean(layers, lambda r: r["pilot_exact"])
        lift = f", {recall / baseline:.1f}x" if baseline else ""
        out.append(
            f"  pilot recall: {recall:.1%} (all {k} right in {exact:.1%} of passes) "
            f"vs random baseline {baseline:.2%}{lift}"
        )
    out.extend(_pilot_distance_lines(result.get("pilot_distance")))
    caches = list((routed[0].get("lru_hit_rate") or {}).keys())
    for c in caches:
        rate = _mean(routed, lambda r: r["lru_hit_rate"][c])
        out.append(f"  LRU cache of {c} experts per layer: {_pct(rate)} hit rate")
    return out


def _pilot_distance_lines(distances: list[int] | None) -> list[str]:
    """Which layers were predicted from further back than the layer before (a dense layer in between)."""
    far = [(layer, d) for layer, d in enumerate(distances or []) if d > 1]
    if not far:
        return []
    listed = ", ".join(f"layer {layer} from layer {layer - d} ({d} layers ahead)" for layer, d in far)
    return [f"  pilot across dense layers: {listed}"]


def _phases(result: dict[str, Any]) -> list[str]:
    """Prompt and decode passes apart: the trace metrics over each phase's passes alone."""
    layers = result["layers"]
    routed = [r for r in layers if r["entropy_bits"] is not None]
    out = ["by phase (means over routed layers; each sequence's passes of that phase alone):"]
    for name in ("prompt", "decode"):
        rows = [r["phases"][name] for r in routed]
        parts = [f"{_fixed(_mean(rows, lambda r: r['passes']), 1)} passes per layer"]
        windows = list((rows[0]["window_distinct"] or {}).keys()) if rows else []
        for m in windows:
            parts.append(f"d@{m} {_fixed(_mean(rows, lambda r: r['window_distinct'][m]), 2)}")
        parts.append(f"reuse {_pct(_mean(rows, lambda r: r['reuse']))}")
        parts.append(f"recall {_pct(_mean(rows, lambda r: r['pilot_recall']))}")
        for c in (rows[0].get("lru_hit_rate") or {}).keys() if rows else []:
            parts.append(f"lru@{c} {_pct(_mean(rows, lambda r: r['lru_hit_rate'][c]))}")
        out.append(f"  {name}: " + ", ".join(parts))
    return out


def _checks(result: dict[str, Any], facts: Heading) -> list[str]:
    checks = result["checks"]
    out = []
    if checks["counts_sum_ok"]:
        out.append("check: every layer's counts sum to top_k x passes: ok")
    else:
        out.append(f"CHECK FAILED: counts of layer(s) {_ranges(facts.bad_counts)} do not sum to a multiple of "
                   f"top_k={result['top_k']}")
    if checks["trace_matches_counts"] is None:
        out.append("check: trace matches counts: n/a (no trace)")
    elif checks["trace_matches_counts"]:
        out.append("check: trace matches counts: ok" + (" (kept passes plus dropped ones)" if facts.trace_dropped else ""))
    else:
        out.append(f"CHECK FAILED: trace of layer(s) {_ranges(facts.bad_trace)} does not reproduce the counts")
    return out


# ----------------------------------------------------------------- helpers


def _mean(rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> float | None:
    values = []
    for row in rows:
        try:
            value = get(row)
        except (KeyError, TypeError):  # a null sub-document
            continue
        if value is not None:
            values.append(value)
    return sum(values) / len(values) if values else None


def _num(value: Any) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.2f}"


def _fixed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and runs[-1][1] == layer - 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
