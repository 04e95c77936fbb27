"""The ``turbospark rebalance`` document (``--json``) and its terminal table.

Shape (every number a script needs to check the replay)::

    {"capture": PATH, "gpus": G, "groups": X, "nodes": N, "first_moe_layer": D, "expert_bytes": B or null,
     "step_time": SECONDS or null, "cost_unit": "bytes per hour" or "bytes per 1000 steps",
     "dispatch": how tokens reach replicas (the engine's router, or SGLang's static dispatch and algorithm),
     "steps": {"how": how they were formed, "count": T},
     "trivial": SUMMARY,                      # the trivial map (E slots) served throughout
     "settings": [SETTING, ...],
     "pareto": [index, ...], "recommended": index or null, "recommended_flags": TEXT or null,
     "drift": [DRIFT, ...] or null}          # turbospark.rebalance.drift, with --drift

    SETTING = {"engine", "num_redundant_experts", "window_size", "step_interval", "max_moves", "slots",
               "imbalance": SUMMARY, "series": [per-step imbalance or null, T of them],
               "rearrangements": [{"step": t, "moved_slots": n, "moved_bytes": n x B or null,
                                   "physical_to_logical_map": [[...] x S] x L}, ...],
               "moved_slots": total, "moved_bytes": total or null, "cost": the cost unit's figure or null}
    SUMMARY = {"steps", "mean", "p50", "p99", "max", "token_weighted"}

Rearrangement at step t serves from step t + 1 (``turbospark.rebalance.replay``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..placement.dispatch import trivial_map
from .per_step import per_step_imbalance, step_summary
from . import sglang_policy
from .replay import Replay, Setting, replay
from .steps import Steps
from .sweep import engine_flags, pareto, recommend

__all__ = ["build", "dispatch_text", "table_lines"]


def build(capture: Any, path: str, steps: Steps, gpus: int, settings: Sequence[Setting], *, groups: int = 1,
          nodes: int = 1, first_layer: int = 0, expert_bytes: Optional[int] = None, step_time: Optional[float] = None,
          budget: Optional[float] = None, drift: Optional[list[dict[str, Any]]] = None,
          keep_maps: bool = True, results: Optional[Sequence[Replay]] = None) -> dict[str, Any]:
    """Replay ``settings`` (or take their ``results``, replayed elsewhere with the same arguments) and
    assemble the document (module docstring). Raises ``ValueError`` for a setting that cannot run or a
    non-positive ``step_time``."""
    if step_time is not None and not step_time > 0:
        raise ValueError(f"--step-time must be a positive number of seconds, got {step_time!r}")
    if results is None:
        results = replay(capture, steps, gpus, settings, groups=groups, nodes=nodes, first_layer=first_layer,
                         keep_maps=keep_maps)
    trivial = per_step_imbalance(capture, trivial_map(capture.num_layers, capture.num_experts, capture.num_experts),
                                 gpus, steps, "vllm")
    rows = [_setting(r, expert_bytes, steps.count, step_time) for r in results]
    points = [(row["cost"] if row["cost"] is not None else float(row["moved_slots"]),
               _imbalance(row)) for row in rows]
    front = pareto(points)
    chosen = recommend(points, list(settings), budget)
    return {"capture": path, "gpus": gpus, "groups": groups, "nodes": nodes, "first_moe_layer": first_layer,
            "expert_bytes": expert_bytes, "step_time": step_time,
            "cost_unit": ("bytes per hour" if step_time is not None else "bytes per 1000 steps")
            if expert_bytes is not None else "slots moved",
            "dispatch": dispatch_text(settings[0].engine if settings else "vllm", gpus, groups, nodes),
            "steps": {"how": steps.how, "count": steps.count},
            "trivial": _summary(trivial.series, trivial.mean),
            "settings": rows, "pareto": front, "recommended": chosen,
            "recommended_flags": None if chosen is None else engine_flags(settings[chosen], gpus, capture.num_experts,
                                                                          nodes),
            "drift": drift}


def dispatch_text(engine: str, gpus: int, groups: int, nodes: int) -> str:
    """How ``engine``'s tokens reach an expert's replicas, as the document and the table say it."""
    if engine != "sglang":
        return "vLLM's router: the token at index i of a step goes to replica hash(i) % r"
    name = sglang_policy.algorithm(groups if groups > 1 else None, nodes)
    why = (f"{groups} expert groups over {nodes} node(s)" if name == "deepseek_hierarchical"
           else "no expert groups" if groups == 1 else f"{groups} expert groups do not divide over {nodes} nodes")
    return (f"SGLang's static dispatch (DeepEP): each source rank sends all its tokens of an expert to one slot, "
            f"each expert's tokens taken as spread evenly over the {gpus} source ranks (one capture); "
            f"rebalance algorithm {name} (--eplb-algorithm auto: {why})")


def _imbalance(row: dict[str, Any]) -> float:
    value = row["imbalance"]["token_weighted"]
    return float("inf") if value is None else value


def _summary(series: np.ndarray, weight: np.ndarray) -> dict[str, Any]:
    return step_summary(series, weight)


def _setting(result: Replay, expert_bytes: Optional[int], total: int, step_time: Optional[float]) -> dict[str, Any]:
    s = result.setting
    moved = [int(m) for m in result.moved.tolist()]
    rearrangements = [{"step": int(step), "moved_slots": n, "moved_bytes": None if expert_bytes is None else n * expert_bytes,
                       **({} if result.maps is None else {"physical_to_logical_map": result.maps[k].tolist()})}
                      for k, (step, n) in enumerate(zip(result.steps, moved))]
    total_moved = sum(moved)
    cost: Optional[float] = None
    if expert_bytes is not None and total:
        moved_bytes = total_moved * expert_bytes
        cost = moved_bytes / (total * step_time) * 3600 if step_time is not None else moved_bytes / total * 1000
    series = result.series
    return {"engine": s.engine, "num_redundant_experts": s.redundant, "window_size": s.window,
            "step_interval": s.interval, "max_moves": s.max_moves, "slots": result.slots,
            "imbalance": _summary(series, result.mean),
            "series": [None if v != v else float(v) for v in series.tolist()],
            "rearrangements": rearrangements, "moved_slots": total_moved,
            "moved_bytes": None if expert_bytes is None else total_moved * expert_bytes, "cost": cost}


def table_lines(doc: dict[str, Any], settings: Sequence[Setting]) -> list[str]:
    """The terminal report: how steps were formed, the no-rebalancing baseline, one row per setting
    (``*``: on the Pareto front; ``>``: recommended), and the recommended flags."""
    trivial = doc["trivial"]
    lines = [f"rebalance replay: {doc['steps']['count']} steps ({doc['steps']['how']}), {doc['gpus']} GPUs; "
             "per-step imbalance = (sum over layers of the busiest GPU - of the mean) / of the mean",
             f"  no rebalancing (trivial map, {_baseline(doc)}): token-weighted {_fmt(trivial['token_weighted'])}, "
             f"p99 {_fmt(trivial['p99'])}",
             f"  {'setting':<34} {'rearr.':>6} {'mean':>7} {'p50':>7} {'p99':>7} {'max':>7} {'tok-w':>7} "
             f"{'slots/rearr.':>12} {doc['cost_unit']:>22}"]
    if not doc["dispatch"].startswith("vLLM"):
        lines.insert(1, f"  dispatch: {doc['dispatch']}")
    front = set(doc["pareto"])
    for index, (row, setting) in enumerate(zip(doc["settings"], settings)):
        imb = row["imbalance"]
        count = len(row["rearrangements"])
        per = f"{row['moved_slots'] / count:.1f}" if count else "-"
        cost = row["cost"] if row["cost"] is not None else row["moved_slots"]
        mark = ">" if index == doc["recommended"] else ("*" if index in front else " ")
        lines.append(f"{mark} {setting.label():<34} {count:>6} {_fmt(imb['mean'])} {_fmt(imb['p50'])} "
                     f"{_fmt(imb['p99'])} {_fmt(imb['max'])} {_fmt(imb['token_weighted'])} {per:>12} "
                     f"{_number(cost):>22}")
    if len(doc["settings"]) > 1:
        lines.append(f"  * Pareto front of token-weighted imbalance against {doc['cost_unit']}; > recommended")
    if doc["recommended_flags"] is not None:
        lines.append(f"  recommended: {doc['recommended_flags']}")
    return lines


def _baseline(doc: dict[str, Any]) -> str:
    return "vLLM's dispatch" if doc["dispatch"].startswith("vLLM") else "one slot per expert"


def _fmt(value: Optional[float]) -> str:
    return "      -" if value is None else f"{value:>7.3f}"


def _number(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else "-"
