"""vLLM 0.33.0's own EPLB policy, imported from its wheel on CPU (not a test module).

``load(wheel, directory)`` extracts ``vllm/distributed/eplb/policy/abstract.py``
and ``default.py`` from the wheel into ``directory`` and imports them as the
package ``_vllm033_eplb_policy`` (the package's ``__init__`` is not run: it
only checks the policy names against ``vllm.config``). ``default.py`` imports
numpy, torch and ``.abstract``, nothing else of vLLM, so no stub is needed.
"""

from __future__ import annotations

import importlib
import sys
import zipfile

import numpy as np
from pathlib import Path
from types import ModuleType
from typing import Any

POLICY = "vllm/distributed/eplb/policy/"
PACKAGE = "_vllm033_eplb_policy"


def load(wheel: str, directory: Path) -> ModuleType:
    """The wheel's ``default`` module (its ``DefaultEplbPolicy``), imported from ``directory``."""
    target = directory / PACKAGE
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in ("abstract.py", "default.py"):
            (target / name).write_bytes(archive.read(POLICY + name))
    package = ModuleType(PACKAGE)
    package.__path__ = [str(target)]  # a package without running vLLM's __init__
    sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.default")


def close() -> None:
    """Drop the imported modules from ``sys.modules``."""
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def simulate(policy: Any, trace: list[list[list[int]]], num_experts: int, batch: int, gpus: int, redundant: int,
             window: int, interval: int) -> tuple[list[float | None], list[tuple[int, list[list[int]]]]]:
    """vLLM 0.33's ``EplbState.step`` / ``rearrange`` transliterated, a token at a time: per step (``batch``
    consecutive passes of each layer's ``trace``) the imbalance (sum over layers of the busiest GPU - of
    the mean) / of the mean, and each rearrangement as (step, map). ``policy(weight, old)`` is the
    rebalance call (the wheel's or turbospark's), on (L, E) int loads and the (L, S) served map."""
    layers, slots = len(trace), num_experts + redundant
    per_gpu = slots // gpus
    phy2log = [[s % num_experts for s in range(slots)] for _ in range(layers)]
    load_pass = [[0] * slots for _ in range(layers)]
    ring = [[[0] * slots for _ in range(layers)] for _ in range(window)]
    ring_step, counter, record_enabled = 0, max(0, interval - interval // 4), True
    steps = -(-max(len(t) for t in trace) // batch)
    series: list[float | None] = []
    done: list[tuple[int, list[list[int]]]] = []
    for step in range(steps):
        busiest = mean = 0.0
        for layer in range(layers):
            row = phy2log[layer]
            loads = [0] * gpus
            for token, ids in enumerate(trace[layer][step * batch:(step + 1) * batch]):
                for e in ids:
                    copies = [s for s in range(slots) if row[s] == e]  # compute_logical_maps: ascending
                    slot = copies[((token * 2654435769) & 0xFFFFFFFF) % len(copies)]
                    loads[slot // per_gpu] += 1
                    if record_enabled:
                        load_pass[layer][slot] += 1
            busiest += max(loads)
            mean += sum(loads) / gpus
        series.append(None if mean == 0 else (busiest - mean) / mean)
        if interval - counter <= window:  # _should_record_current_step
            ring[ring_step] = load_pass
            load_pass = [[0] * slots for _ in range(layers)]
            ring_step = (ring_step + 1) % window
        counter += 1
        if counter >= interval:
            counter = 0
            weight = [[0] * num_experts for _ in range(layers)]
            for rows in ring:
                for layer in range(layers):
                    for s in range(slots):
                        weight[layer][phy2log[layer][s]] += rows[layer][s]
            phy2log = [list(map(int, r)) for r in policy(weight, phy2log)]
            done.append((step, phy2log))
        record_enabled = interval - counter <= window  # _update_layer_should_record
    return series, done


def drifting(seed: int, layers: int, experts: int, top_k: int, passes: int) -> Any:
    """Random routing whose hot experts change half-way."""
    rng = np.random.default_rng(seed)
    trace = []
    for _ in range(layers):
        rows = []
        for p in range(passes):
            hot = np.array([1.0] * experts)
            hot[(p * 2 // passes) * 3 % experts] = 12.0
            hot[(p * 2 // passes) * 5 % experts + 1 if experts > 6 else 0] += 5.0
            rows.append(rng.choice(experts, top_k, replace=False, p=hot / hot.sum()))
        trace.append(np.array(rows, dtype=np.int64))
    counts = np.stack([np.bincount(t.ravel(), minlength=experts) for t in trace])
    from turbospark.capture.reader import Capture

    return Capture(layers, experts, top_k, counts, trace=tuple(trace))
