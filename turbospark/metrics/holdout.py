"""``analyze --holdout F``: the smallest expert sets, chosen on the first passes, judged on the rest.

Per layer with a trace of P passes: the first floor(F x P) passes are the
fit passes, the others the test passes; with sequence tags (``seq``), whole
sequences are split instead: the first floor(F x S) of the layer's S
sequences, in order of first appearance, are fit, so both halves hold prompt
and decode passes (a layer of one sequence is split by position). F is
taken exactly (``0.29`` of 100 passes fits 29); see
``turbospark.capture.sequences.fit_split``. For each coverage fraction f, the
set is the fewest experts whose fit counts, largest first (lower id first on
ties), reach f of the fit selections (the in-sample ``coverage`` of
``analyze``). Reported on the test passes: ``selections``, the share of the
test selections whose expert is in the set, and ``passes``, the share of
test passes whose whole top-k lies in the set (what a model pruned to that
set could serve without a miss). Without a trace nothing can be split: the
counts do not say which passes came first.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Optional, Union

import numpy as np

from .layers import COVERAGE_FRACTIONS, coverage
from ..capture.reader import Capture
from ..capture.sequences import exact_fraction, fit_mask, split_unit

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


def holdout(capture: Capture, fit: Union[float, Fraction]) -> dict[str, Any]:
    """The ``holdout`` document for fraction ``fit`` (0 < F < 1; a float is read as the decimal it prints as).

    ``{"fraction": F, "reason": null or why not, "layers": [{"layer",
    "fit_passes", "test_passes", "split": "sequences" or "passes", "sets":
    {f: {"experts", "selections", "passes"}} or null}]}``; ``layers`` is
    empty without a trace. Raises ``ValueError`` for F outside (0, 1).
    """
    exact = exact_fraction(fit)
    if not 0 < exact < 1:
        raise ValueError(f"--holdout must be strictly between 0 and 1, got {fit}")
    if capture.trace is None:
        return {"fraction": float(fit), "reason": NO_TRACE, "layers": []}
    layers = []
    # Layer by layer, one mask at a time, and a streamed capture's pages handed back after each:
    # memory is one layer's ids and tags, not the capture's.
    for layer in range(capture.num_layers):
        ids = capture.trace[layer]
        mask, kind = fit_mask(capture, layer, exact)
        fit_counts = np.bincount(ids[mask].ravel(), minlength=capture.num_experts)
        sizes = coverage(fit_counts)
        sets = None
        if sizes is not None:
            sets = {}
            for f, size in sizes.items():
                selections, passes = covered(ids[~mask], top_set(fit_counts, size))
                sets[f] = {"experts": size, "selections": selections, "passes": passes}
        fit_passes = int(mask.sum())
        layers.append({"layer": layer, "fit_passes": fit_passes, "test_passes": int(ids.shape[0]) - fit_passes,
                       "split": kind, "sets": sets})
        release = getattr(capture.trace, "release", None)
        if release is not None:
            release()
    return {"fraction": float(fit), "reason": None, "layers": layers}


def holdout_lines(doc: dict[str, Any]) -> list[str]:
    """The text report's holdout section."""
    unit = split_unit([row["split"] for row in doc["layers"]])
    head = f"holdout: sets chosen on the first {doc['fraction']:g} of each layer's {unit}, judged on the rest"
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
