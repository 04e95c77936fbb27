"""``turbospark compare A B``: do two captures of one model route alike, and would a set chosen on A serve B?

Per layer (p, q: A's and B's counts over their totals; a set "holds 90%" as
``coverage`` defines it: the fewest experts whose counts, largest first,
lower id first on ties, reach 90% of the layer's selections):

* ``js_divergence``: Jensen-Shannon divergence of p and q in bits (0 = the
  same distribution, 1 = disjoint supports);
* ``set90_a`` / ``set90_b``: the sizes of the two 90% sets;
  ``set90_overlap``: |A90 & B90| / |A90 | B90| (Jaccard);
* ``a_on_b_selections``: the share of B's selections whose expert is in A's
  90% set; ``a_on_b_passes``: the share of B's passes whose whole top-k is
  in it (needs B's trace) -- out of sample by construction.

Each is null where a capture has no selections in the layer (or B no trace).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any, Optional

import numpy as np

from .layers import coverage
from ..capture.reader import Capture
from .holdout import covered, top_set

__all__ = ["compare", "compare_lines", "geometry_mismatch", "js_divergence"]

_KEYS = ("js_divergence", "set90_a", "set90_b", "set90_overlap", "a_on_b_selections", "a_on_b_passes")


def geometry_mismatch(a: Capture, b: Capture, name_a: str, name_b: str) -> Optional[str]:
    """A message naming both files when their shapes (layers, experts, top_k) differ, else None."""
    if a.header == b.header:
        return None
    return f"{name_a} and {name_b} differ in geometry: {_shape(a)} against {_shape(b)}"


def _shape(c: Capture) -> str:
    return f"{c.num_layers} layers x {c.num_experts} experts, top-{c.top_k}"


def js_divergence(p_counts: np.ndarray, q_counts: np.ndarray) -> Optional[float]:
    """Jensen-Shannon divergence in bits of two count vectors; None when either sums to 0."""
    n_p, n_q = int(p_counts.sum()), int(q_counts.sum())
    if n_p == 0 or n_q == 0:
        return None
    p, q = p_counts / n_p, q_counts / n_q
    m = (p + q) / 2
    terms = [x[x > 0] * np.log2(x[x > 0] / m[x > 0]) for x in (p, q)]
    # Each half is a KL divergence to the midpoint, so the sum is >= 0 up to rounding.
    return max(0.0, math.fsum(terms[0].tolist()) / 2 + math.fsum(terms[1].tolist()) / 2)


def compare(a: Capture, b: Capture) -> dict[str, Any]:
    """The ``compare --json`` document for two captures of equal geometry (see the module doc)."""
    layers = []
    for layer in range(a.num_layers):
        ca, cb = a.counts[layer], b.counts[layer]
        row: dict[str, Any] = {"layer": layer, **{key: None for key in _KEYS}}
        row["js_divergence"] = js_divergence(ca, cb)
        size_a, size_b = _size90(ca), _size90(cb)
        row["set90_a"], row["set90_b"] = size_a, size_b
        if size_a is not None and size_b is not None:
            set_a, set_b = top_set(ca, size_a), top_set(cb, size_b)
            row["set90_overlap"] = int((set_a & set_b).sum()) / int((set_a | set_b).sum())
            row["a_on_b_selections"] = int(cb[set_a].sum()) / int(cb.sum())
            if b.trace is not None:
                row["a_on_b_passes"] = covered(b.trace[layer], set_a)[1]
                release = getattr(b.trace, "release", None)
                if release is not None:
                    release()  # a streamed B: its pages back to the kernel, layer by layer
        layers.append(row)
    summary = {}
    for key in _KEYS:
        values = [row[key] for row in layers if row[key] is not None]
        summary[key] = math.fsum(values) / len(values) if values else None
    return {**a.header, "layers": layers, "summary": summary}


def _size90(counts: np.ndarray) -> Optional[int]:
    sizes = coverage(counts, ("0.9",))
    return None if sizes is None else sizes["0.9"]


def compare_lines(doc: dict[str, Any], name_a: str, name_b: str) -> list[str]:
    """The text table: one row per layer, then the means over the layers with values."""
    header = ["layer", "JS bits", "A90", "B90", "overlap", "A90 on B sel", "A90 on B passes"]
    rows = [_cells(str(row["layer"]), row) for row in doc["layers"]]
    rows.append(_cells("mean", doc["summary"]))
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    out = [f"compare A = {name_a} with B = {name_b}: {doc['num_layers']} layers x {doc['num_experts']} experts, top-{doc['top_k']}"]
    out += ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [header] + rows]
    out += textwrap.wrap(
        "JS bits: Jensen-Shannon divergence of the expert distributions (0 same, 1 disjoint); "
        "A90/B90: experts holding 90% of selections; overlap: |A90 & B90| / |A90 | B90|; "
        "A90 on B: share of B's selections / whole passes that A's 90% set covers (passes need B's trace); "
        "-: no selections (or no trace) to measure.", width=100)
    return out


def _cells(label: str, row: dict[str, Any]) -> list[str]:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return [label, num(row["js_divergence"], ".4f"), num(row["set90_a"], ".1f" if label == "mean" else "d"),
            num(row["set90_b"], ".1f" if label == "mean" else "d"), num(row["set90_overlap"], ".1%"),
            num(row["a_on_b_selections"], ".1%"), num(row["a_on_b_passes"], ".1%")]
