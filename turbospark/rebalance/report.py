"""Per-step imbalance as the commands print it: a JSON object and a few lines, for ``analyze --placement
FILE --per-step`` and ``place`` (which adds it whenever it can form steps: ``--batch B`` or recorded steps).

The JSON object (``"per_step"``): {"steps": how they were formed, "dispatch": the headline model,
"models": {MODEL: {"steps", "mean", "p50", "p99", "max", "token_weighted", "aggregate"}} for each of
``STEP_DISPATCH``} (``turbospark.rebalance.per_step`` defines the figures); placed and trivial maps
under "placed" and "trivial" where both are judged.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..capture.sequences import Sequences
from .per_step import STEP_DISPATCH, per_step_imbalance
from .steps import form_steps, recorded_steps

__all__ = ["can_form", "per_step_doc", "per_step_lines"]


def can_form(capture: Any, batch: Optional[int]) -> bool:
    """Whether steps can be had: a trace, and recorded steps or ``batch``."""
    return capture.trace is not None and (batch is not None or recorded_steps(capture) is not None)


def per_step_doc(capture: Any, maps: dict[str, np.ndarray], gpus: int, batch: Optional[int],
                 seqs: Optional[Sequences], dispatch: str, *, nodes: int = 1, first_layer: int = 0) -> dict[str, Any]:
    """The ``per_step`` object for each named (L, S) map in ``maps``; raises ``ValueError`` (no trace,
    no steps and no ``batch``)."""
    steps = form_steps(capture, batch, seqs)
    out: dict[str, Any] = {"steps": steps.how, "count": steps.count, "dispatch": dispatch}
    for name, phy2log in maps.items():
        out[name] = {model: per_step_imbalance(capture, phy2log, gpus, steps, model, nodes=nodes,
                                               first_layer=first_layer).summary()
                     for model in STEP_DISPATCH}
    return out


def per_step_lines(doc: dict[str, Any]) -> list[str]:
    """Lines for the terminal: the headline model's per-step figures beside the aggregate one, per map."""
    lines = [f"  per step ({doc['count']} steps, {doc['steps']}); imbalance of a step = (sum over layers of the "
             f"busiest GPU - of the mean) / of the mean, {doc['dispatch']} dispatch:"]
    for name in (n for n in ("trivial", "placed", "file") if n in doc):
        row = doc[name][doc["dispatch"]]
        lines.append(f"    {name}: mean {_fmt(row['mean'])}, p50 {_fmt(row['p50'])}, p99 {_fmt(row['p99'])}, "
                     f"max {_fmt(row['max'])}, token-weighted {_fmt(row['token_weighted'])}; "
                     f"aggregate (loads summed over the steps) {_fmt(row['aggregate'])}")
    return lines


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"
