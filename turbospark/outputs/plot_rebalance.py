"""``turbospark plot --rebalance FILE``: per-step imbalance over time for the chosen settings, and the sweep's front.

Left: the per-step imbalance series of the Pareto front's settings (at most 6, the recommended one
bold) and of no rebalancing, with a tick where the recommended setting rearranged. Right: every
setting as (cost, token-weighted imbalance), the front joined. Reads ``turbospark rebalance -o``'s
document (docs/rebalance.md).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .plot import agg_figure

__all__ = ["plot_rebalance", "read_rebalance"]

_KEYS = ("settings", "pareto", "recommended", "steps", "cost_unit")


def read_rebalance(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a rebalance document; raises ``OSError``, or ``ValueError`` when it is not one."""
    with open(path, encoding="utf-8") as handle:
        try:
            doc = json.load(handle)
        except ValueError as exc:
            raise ValueError(f"not turbospark rebalance's JSON ({exc})") from None
    if not isinstance(doc, dict) or any(key not in doc for key in _KEYS):
        raise ValueError("not turbospark rebalance's JSON (write it with `turbospark rebalance ... -o FILE`)")
    return doc


def _label(row: dict[str, Any]) -> str:
    moves = "" if row["engine"] != "turbospark" else f" M={row['max_moves']}"
    return (f"{row['engine']} R={row['num_redundant_experts']} W={row['window_size']} "
            f"I={row['step_interval']}{moves}")


def plot_rebalance(doc: dict[str, Any], path: str | os.PathLike[str], *, title: str | None = None) -> None:
    """Draw the rebalance document ``doc`` into the image file ``path``.

    Raises ``MissingMatplotlib`` without matplotlib and ``OSError`` when ``path`` cannot be written."""
    figure = agg_figure((13, 5.5), 110)
    left, right = figure.subplots(1, 2)
    settings, chosen = doc["settings"], doc["recommended"]
    shown = ([chosen] if chosen is not None else []) + [i for i in doc["pareto"] if i != chosen]
    for index in shown[:6]:
        row = settings[index]
        series = np.array([np.nan if v is None else v for v in row["series"]], dtype=np.float64)
        left.plot(series, linewidth=2.0 if index == chosen else 0.8, label=_label(row)
                  + f" (token-weighted {row['imbalance']['token_weighted']:.3f})")
    if chosen is not None:
        for r in settings[chosen]["rearrangements"]:
            left.axvline(r["step"] + 1, color="grey", alpha=0.25, linewidth=0.6)
    left.set_xlabel(f"step ({doc['steps']['how']})" if len(doc["steps"]["how"]) < 60 else "step")
    left.set_ylabel("per-step imbalance")
    left.set_title("per-step imbalance over time (grey: the recommended setting's rearrangements)", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    costs = [row["cost"] if row["cost"] is not None else row["moved_slots"] for row in settings]
    values = [row["imbalance"]["token_weighted"] for row in settings]
    right.scatter(costs, values, color="grey", s=14, label="settings")
    front = doc["pareto"]
    right.plot([costs[i] for i in front], [values[i] for i in front], "o-", color="C0", label="Pareto front")
    if chosen is not None:
        right.scatter([costs[chosen]], [values[chosen]], color="C3", s=60, zorder=3, label="recommended")
    right.set_xlabel(doc["cost_unit"])
    right.set_ylabel("token-weighted per-step imbalance")
    right.set_title("imbalance against expert weights moved", fontsize=10)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    heading = f"{doc['steps']['count']} steps, {doc.get('gpus')} GPUs"
    figure.suptitle(f"{title}: {heading}" if title else heading, fontsize=12)
    figure.savefig(path)
