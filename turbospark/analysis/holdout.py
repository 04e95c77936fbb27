"""``analyze --holdout F``: the smallest expert sets, chosen on the first passes, judged on the rest.

Per layer with a trace of P passes: the first floor(F x P) passes are the
fit passes, the others the test passes. For each coverage fraction f, the
set is the fewest experts whose fit counts, largest first (lower id first on
ties), reach f of the fit selections (the in-sample ``coverage`` of
``analyze``). Reported on the test passes: ``selections``, the share of the
test selections whose expert is in the set, and ``passes``, the share of
test passes whose whole top-k lies in the set (what a model pruned to that
set could serve without a miss). Without a trace nothing can be split: the
counts do not say which passes came first.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .metrics import COVERAGE_FRACTIONS, coverage
from .capture import Capture

__all__ = ["NO_TRACE", "covered", "holdout", "holdout_lines", "top_set"]

NO_TRACE = ("the capture has no trace (record with trace=True): counts alone do not say "
            "which passes came first, so a set cannot be chosen on some passes and judged on others")


def top_set(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` experts with the largest counts, lower id first on ties, as a boolean mask over E."""
    mask = np.zeros(counts.shape[0], dtype=bool)
    mask[np.argsort(-counts, kind="stable")[:size]] = True
    return mask


def covered(ids: np.ndarray, mask: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    """(share of the selections of a (P, K) trace whose expert is in ``mask``,
    share of its passes whose whole top-k is in it); None for an empty trace."""
    if ids.size == 0:
        return None, None
    inside = mask[ids]
    return float(inside.sum()) / ids.size, float(inside.all(axis=1).sum()) / ids.shape[0]


def holdout(capture: Capture, fit: float) -> dict[str, Any]:
    """The ``holdout`` document for fraction ``fit`` (0 < F < 1).

    ``{"fraction": F, "reason": null or why not, "layers": [{"layer",
    "fit_passes", "test_passes", "sets": {f: {"experts", "selections",
    "passes"}} or null}]}``; ``layers`` is empty without a trace. Raises
    ``ValueError`` for F outside (0, 1).
    """
    if not 0 < fit < 1:
        raise ValueError(f"--holdout must be strictly between 0 and 1, got {fit}")
    if capture.trace is None:
        return {"fraction": fit, "reason": NO_TRACE, "layers": []}
    layers = []
    for layer, ids in enumerate(capture.trace):
        cut = int(fit * ids.shape[0])
        fit_counts = np.bincount(ids[:cut].ravel(), minlength=capture.num_experts)
        sizes = coverage(fit_counts)
        sets = None
        if sizes is not None:
            sets = {}
            for f, size in sizes.items():
                selections, passes = covered(ids[cut:], top_set(fit_counts, size))
                sets[f] = {"experts": size, "selections": selections, "passes": passes}
        layers.append({"layer": layer, "fit_passes": cut, "test_passes": int(ids.shape[0]) - cut, "sets": sets})
    return {"fraction": fit, "reason": None, "layers": layers}


def holdout_lines(doc: dict[str, Any]) -> list[str]:
    """The text report's holdout section."""
    head = f"holdout: sets chosen on the first {doc['fraction']:g} of each layer's passes, judged on the rest"
    if doc["reason"] is not None:
        return ["", f"{head}: not computable: {doc['reason']}"]
    out = ["", head + " (n experts: share of test selections / of test passes wholly covered):"]
    header = ["layer", "fit", "test"] + [f"cov{round(float(f) * 100)}" for f in COVERAGE_FRACTIONS]
    rows = []
    for row in doc["layers"]:
        cells = [str(row["layer"]), str(row["fit_passes"]), str(row["test_passes"])]
        for f in COVERAGE_FRACTIONS:
            entry = (row["sets"] or {}).get(f)
            cells.append("-" if entry is None else
                         f"{entry['experts']}: {_pct(entry['selections'])} / {_pct(entry['passes'])}")
        rows.append(cells)
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    for line in [header] + rows:
        out.append("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))
    return out


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"
