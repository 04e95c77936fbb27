"""Settings grids, the Pareto front of per-step imbalance against bytes moved, and the engine flags of a setting.

Each replayed setting is a point: ``cost``, the expert-weight bytes moved per
hour of traffic (with ``--step-time``, the mean seconds of an engine step) or
per 1,000 steps (without it), and ``imbalance``, the token-weighted per-step
imbalance (the whole run's extra time over a balanced one). A setting is on
the front when no other has both figures at most its own and one lower. The
recommended setting is the front's lowest imbalance within the byte budget
(``--max-bytes``, in the cost's unit; default none), fewer redundant slots
and then fewer bytes breaking ties; redundant slots cost GPU memory, which the
front does not see, so the table shows them.
"""

from __future__ import annotations

import itertools
import json
from typing import Optional, Sequence

from .replay import Setting

__all__ = ["engine_flags", "grid", "pareto", "recommend"]


def grid(engine: str, redundant: Sequence[int], windows: Optional[Sequence[int]], intervals: Sequence[int],
         moves: Sequence[Optional[int]] = (None,)) -> list[Setting]:
    """Every combination, in the order given (redundant slowest, moves fastest); only the turbospark engine
    takes ``moves``. ``windows`` None: each interval's window is the interval itself (SGLang's default
    recorder buffer)."""
    own = engine == "turbospark"
    return [Setting(engine, r, i if w is None else w, i, m if own else None)
            for r, w, i, m in itertools.product(redundant, windows if windows is not None else (None,), intervals,
                                                moves if own else (None,))]


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, imbalance) points no other point dominates, by ascending cost."""
    front = []
    for i, (cost, imb) in enumerate(points):
        if not any((c <= cost and m <= imb) and (c < cost or m < imb) for j, (c, m) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1], i))


def recommend(points: Sequence[tuple[float, float]], settings: Sequence[Setting],
              budget: Optional[float] = None) -> Optional[int]:
    """The front's lowest imbalance with cost within ``budget``; None when no point fits."""
    front = [i for i in pareto(points) if budget is None or points[i][0] <= budget]
    if not front:
        return None
    return min(front, key=lambda i: (points[i][1], settings[i].redundant, points[i][0], i))


def engine_flags(setting: Setting, gpus: int, num_experts: int, nodes: int = 1) -> str:
    """What to give the engine for ``setting``: vLLM's flags with the exact ``--eplb-config`` JSON, SGLang's
    server flags (``nodes`` > 1 adds ``--nnodes``), or for the turbospark engine the ``place`` command to run
    at each interval."""
    if setting.engine == "vllm":
        config = {"window_size": setting.window, "step_interval": setting.interval,
                  "num_redundant_experts": setting.redundant, "use_async": False}
        text = json.dumps(config, separators=(",", ":"))
        return (f"vllm serve MODEL --enable-expert-parallel --enable-eplb --eplb-config '{text}' "
                f"(expert-parallel size {gpus}: tensor x data parallel = {gpus})")
    if setting.engine == "sglang":
        # Under DeepEP SGLang sets ep_size to tp_size: --tp-size G is what makes the EP size G.
        multi = f" --nnodes {nodes}" if nodes > 1 else ""
        return (f"python -m sglang.launch_server --model-path MODEL --tp-size {gpus} --ep-size {gpus} "
                f"--moe-a2a-backend deepep --ep-dispatch-algorithm static --enable-eplb "
                f"--ep-num-redundant-experts {setting.redundant} --eplb-rebalance-num-iterations {setting.interval} "
                f"--expert-distribution-recorder-buffer-size {setting.window}{multi} "
                f"(expert-parallel size {gpus}; static dispatch, SGLang's default with DeepEP"
                + ("; each node adds --node-rank, --dist-init-addr)" if nodes > 1 else ")"))
    moves = "" if setting.max_moves is None else f" --max-moves {setting.max_moves}"
    return (f"every {setting.interval} steps, on the last {setting.window} steps' counts: turbospark place "
            f"WINDOW --gpus {gpus} --slots {num_experts + setting.redundant} --from SERVED{moves} (not an engine flag: a patched rebalancer)")
