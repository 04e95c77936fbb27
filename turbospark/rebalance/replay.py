"""Replaying an engine's periodic expert rearrangement over a capture's steps.

``vllm_schedule(steps, step_interval, window_size)`` is vLLM 0.33's
``EplbState`` bookkeeping (``vllm/distributed/eplb/eplb_state.py``), step by
step, without the model:

* ``add_model`` (lines 468-473) starts the rearrangement counter at
  ``step_interval - step_interval // 4``, so the first rearrangement comes after
  ``step_interval // 4`` steps (at least one), then every ``step_interval``;
* ``step`` (561-695): the router's kernel adds the step's tokens to the pass
  counts when recording is on (it starts on: ``should_record_tensor`` is
  created as ones); the pass counts are copied into the next row of a ring of
  ``window_size`` rows and zeroed when ``_should_record_current_step`` (697-717:
  ``step_interval - counter <= window_size``) holds; the counter then steps,
  and on reaching ``step_interval`` it returns to 0 and ``rearrange`` runs;
* ``rearrange`` (758-875): the ring's physical-slot counts, summed over its
  rows, are mapped to logical experts through the map served *now* (a row
  recorded under an earlier map is attributed by the current one, as vLLM
  does when ``window_size > step_interval``), and
  ``DefaultEplbPolicy.rebalance_experts`` runs with the served map as
  ``old_global_expert_indices``. On CUDA the result is always committed (the
  5 % no-gain skip, 876-931, is ROCm only); it serves from the next step.

vLLM's default ``use_async: true`` computes the same map in a worker and
commits it one layer per step over the following steps; the replay commits
all layers at once (``"use_async": false``, which the recommended
``--eplb-config`` carries). Dummy and profile steps are not in a capture.

``turbospark`` engine: the same schedule and window, each rearrangement
being turbospark's own ``place`` on the window's loads, reached from the
served map by at most M slot moves per layer (``place --from --max-moves M``).

``sglang`` engine, ``sglang_schedule(steps, interval, window)``: SGLang 0.5.23's
loop (``sglang/srt/eplb/``, ``turbospark.rebalance.sglang_policy`` for the
policy and the dispatch it installs):

* ``eplb_manager.py`` ``EPLBManager``: ``__init__`` (lines 30-70) asserts
  ``eplb_rebalance_num_iterations >= expert_distribution_recorder_buffer_size``
  and starts the recorder; ``_entrypoint`` (89-94) yields once per forward pass
  (``on_forward_pass_end``, 72-73, called after every forward by
  ``model_executor/model_runner.py`` ``forward``, 1896-1898) and runs
  ``rebalance`` (96-185) at the end of pass I + 1, 2I + 1, ...: after 0-based
  steps I, 2I, 3I, ...; the new map serves from the next step;
* ``expert_distribution.py``: the recorder's ``_StatAccumulator`` (950-1035) keeps
  each pass's physical-slot counts in a ``_CircularBuffer`` (1065-1080) of
  ``--expert-distribution-recorder-buffer-size`` W rows; ``dump_record`` (362-366)
  sums them to logical experts through the map served now and resets the buffer.
  As W <= I, every window is the last W steps up to and including the
  rearrangement's, all served by one map: its logical counts are the capture's;
* dispatch: static (SGLang's default with DeepEP: ``arg_groups/parallel_hook.py``
  766-777), each source rank sending all its tokens of an expert to one slot;
  the trivial start's map is each rank's own (``placement.dispatch.static_slots``),
  each rearrangement's the shared-generator map of ``sglang_policy.dispatch_layer``.
  One capture does not say which rank a token came from: each expert's tokens
  are taken as spread evenly over the G source ranks (as ``place --dispatch
  static`` assumes for one capture). ``first_layer`` dense layers lead the map
  (their rows' draws come first; a dense row's window is all zeros).

Not modelled: ``--eplb-rebalance-layers-per-chunk`` (default off: all layers at
once), the utilization threshold (default 1.0: always rebalance), the
server's warm-up and other forwards before the capture's first step.

The rearrangement policy is per layer (vLLM's operates row by row), so
``replay`` reads one layer at a time and runs every setting on it: memory is
one layer's passes plus per-step (T,) sums and a (T, S) count array per
setting, not the capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from ..placement import place
from ..placement.dispatch import static_generators, static_layer, static_senders, trivial_map
from ..placement.migrate import align, rebalance
from . import sglang_policy
from .per_step import LayerDispatch
from .steps import Steps
from .vllm_policy import hash_replica, logical_to_physical, rebalance_experts

__all__ = ["ENGINES", "Replay", "Schedule", "Setting", "replay", "sglang_schedule", "vllm_schedule"]

ENGINES = ("vllm", "turbospark", "sglang")


@dataclass(frozen=True)
class Setting:
    """One configuration: ``engine`` (one of ``ENGINES``), ``redundant`` spare slots
    (num_redundant_experts; SGLang's ep_num_redundant_experts), ``window`` (window_size; SGLang's
    expert_distribution_recorder_buffer_size), ``interval`` (step_interval; SGLang's
    eplb_rebalance_num_iterations), ``max_moves`` (turbospark engine: at most M moved slots per layer
    per rearrangement; None: unbounded)."""

    engine: str
    redundant: int
    window: int
    interval: int
    max_moves: Optional[int] = None

    def check(self, num_experts: int, gpus: int) -> None:
        """Raises ``ValueError`` naming the value when the setting cannot run for E experts on G GPUs."""
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        for name, value in (("--window-size", self.window), ("--step-interval", self.interval)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if type(self.redundant) is not int or self.redundant < 0:
            raise ValueError(f"--num-redundant-experts must be 0 or more, got {self.redundant!r}")
        if (num_experts + self.redundant) % gpus:
            raise ValueError(f"{num_experts} experts + {self.redundant} redundant = "
                             f"{num_experts + self.redundant} slots, not divisible by --gpus {gpus}")
        if self.max_moves is not None and (type(self.max_moves) is not int or self.max_moves < 0):
            raise ValueError(f"--max-moves must be 0 or more, got {self.max_moves!r}")
        if self.engine == "sglang" and self.window > self.interval:
            # EPLBManager.__init__ asserts it: a longer buffer would hold steps of the previous map.
            raise ValueError(f"--window-size {self.window} (SGLang's --expert-distribution-recorder-buffer-size) "
                             f"exceeds --step-interval {self.interval} (--eplb-rebalance-num-iterations): "
                             "SGLang refuses it")

    def label(self) -> str:
        """A short name: ``vllm R=32 W=1000 I=3000`` (``M=8`` for the turbospark engine)."""
        moves = "" if self.engine != "turbospark" else f" M={'inf' if self.max_moves is None else self.max_moves}"
        return f"{self.engine} R={self.redundant} W={self.window} I={self.interval}{moves}"


@dataclass(frozen=True)
class Schedule:
    """``steps`` (rearrangement k runs after step ``steps[k]`` and serves from ``steps[k] + 1``) and
    ``windows[k]``, the steps whose counts are in the window it reads (each once)."""

    steps: list[int]
    windows: list[np.ndarray]


def vllm_schedule(total: int, interval: int, window: int) -> Schedule:
    """vLLM 0.33's rearrangement steps and windows over ``total`` steps (module docstring)."""
    counter = max(0, interval - interval // 4)
    enabled = True  # should_record_tensor starts as ones
    pending: list[int] = []
    ring: list[list[int]] = [[] for _ in range(window)]
    slot = 0
    steps, windows = [], []
    for step in range(total):
        if enabled:
            pending.append(step)
        if interval - counter <= window:
            ring[slot], pending = pending, []
            slot = (slot + 1) % window
        counter += 1
        if counter >= interval:
            counter = 0
            steps.append(step)
            windows.append(np.array(sorted(s for row in ring for s in row), dtype=np.int64))
        enabled = interval - counter <= window
    return Schedule(steps, windows)


@dataclass
class Replay:
    """One setting's replay: ``busiest`` and ``mean`` (T,) sums over layers of the busiest and mean GPU
    load per step; per rearrangement its ``steps``, ``moved`` slots (all layers) and, with
    ``keep_maps``, the (L, S) ``maps`` chosen."""

    setting: Setting
    slots: int
    busiest: np.ndarray
    mean: np.ndarray
    steps: list[int]
    moved: np.ndarray
    maps: Optional[list[np.ndarray]] = None
    _rows: list[list[np.ndarray]] = field(default_factory=list, repr=False)

    @property
    def series(self) -> np.ndarray:
        """(T,) per-step imbalance, NaN for a step without load (``turbospark.rebalance.per_step``)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.mean > 0, (self.busiest - self.mean) / np.where(self.mean > 0, self.mean, 1), np.nan)


def sglang_schedule(total: int, interval: int, window: int) -> Schedule:
    """SGLang 0.5.23's rearrangement steps and windows over ``total`` steps (module docstring): after steps
    I, 2I, ..., each on the last W steps up to its own (W <= I)."""
    steps = list(range(interval, total, interval))
    return Schedule(steps, [np.arange(s - window + 1, s + 1, dtype=np.int64) for s in steps])


def _schedule(setting: Setting, total: int) -> Schedule:
    return (sglang_schedule if setting.engine == "sglang" else vllm_schedule)(total, setting.interval, setting.window)


def replay(capture: Any, steps: Steps, gpus: int, settings: Sequence[Setting], *, groups: int = 1,
           nodes: int = 1, first_layer: int = 0, keep_maps: bool = True) -> list[Replay]:
    """Replay every setting of ``settings`` over ``capture``'s traced passes cut into ``steps``, on G
    ``gpus`` (``groups`` and ``nodes``: the model's expert groups, vLLM's num_expert_groups, and the node
    count; ``first_layer``: the dense layers SGLang's map starts with). Dispatch is vLLM's router (token
    index hash) for the vllm and turbospark engines, SGLang's static dispatch for sglang. Returns one
    ``Replay`` per setting, in order.

    Raises ``ValueError`` naming the value for a setting that cannot run (``Setting.check``)."""
    experts = capture.num_experts
    for setting in settings:
        setting.check(experts, gpus)
    if type(nodes) is not int or nodes < 1 or gpus % nodes:
        raise ValueError(f"--gpus {gpus} is not divisible by --nodes {nodes!r}")
    if type(groups) is not int or groups < 1:
        raise ValueError(f"--groups must be a positive integer, got {groups!r}")
    if type(first_layer) is not int or first_layer < 0:
        raise ValueError(f"--first-moe-layer must be 0 or more, got {first_layer!r}")
    total = steps.count
    plans = [_schedule(s, total) for s in settings]
    out = [Replay(s, experts + s.redundant, np.zeros(total), np.zeros(total), plan.steps,
                  np.zeros(len(plan.steps), dtype=np.int64), [] if keep_maps else None)
           for s, plan in zip(settings, plans)]
    lead = {r.slots: _SglangStart(r.slots, experts, gpus, groups, nodes, first_layer)
            for r in out if r.setting.engine == "sglang"}
    carried = [lead[r.slots].carried(len(r.steps)) if r.setting.engine == "sglang" else None for r in out]
    for layer in range(capture.num_layers):
        step, index = steps.layer(layer)
        # The ids in their own (narrow) dtype: an int64 copy of a 2 M-pass layer is 128 MB, and recorded
        # steps come in order already (each pass's step is its mark's), so nothing is sorted or copied then.
        ids = np.asarray(capture.trace[layer])
        ids = ids[:, None] if ids.ndim == 1 else ids
        if step.shape[0] > 1 and (step[1:] < step[:-1]).any():
            order = np.argsort(step, kind="stable")
            ids, step, index = ids[order], step[order], index[order]
        counts = None
        for result, plan, state in zip(out, plans, carried):
            if state is None:
                rows = _replay_layer(ids, step, index, total, plan, result, experts, gpus, groups, nodes)
            else:
                if counts is None:  # what SGLang's policy and its even-spread dispatch read: per-step counts
                    counts = _step_counts(ids, step, total, experts)
                rows = _sglang_layer(counts, plan, result, state, experts, gpus, groups, nodes)
            if keep_maps:
                result._rows.append(rows)
    if keep_maps:
        for result in out:
            result.maps = [np.stack([rows[k] for rows in result._rows]) for k in range(len(result.steps))]
            result._rows = []
    return out


class _SglangStart:
    """What every layer of an SGLang setting with ``slots`` slots starts from: the dense rows' map (the
    policy on an all-zero window), through which each generator runs before the first MoE layer."""

    def __init__(self, slots: int, experts: int, gpus: int, groups: int, nodes: int, first_layer: int) -> None:
        self.slots, self.experts, self.gpus, self.nodes, self.first_layer = slots, experts, gpus, nodes, first_layer
        self.dense = sglang_policy.rebalance_experts(np.zeros((1, experts), dtype=np.int64), slots,
                                                     _groups(groups), nodes, gpus)[1][0]

    def carried(self, rearrangements: int) -> "_SglangState":
        """Fresh generators: each rank's for the trivial start, one per rearrangement, past the dense rows."""
        shared = []
        for _ in range(rearrangements):
            rng = sglang_policy.generator()
            for _ in range(self.first_layer):
                sglang_policy.dispatch_layer(self.dense, self.slots, self.gpus, self.nodes, rng)
            shared.append(rng)
        return _SglangState(static_generators(self.gpus, self.experts, self.slots, self.nodes, self.first_layer),
                            shared)


@dataclass
class _SglangState:
    """The dispatch generators an SGLang setting carries from one layer to the next."""

    ranks: list[Any]
    shared: list[Any]


def _groups(groups: int) -> Optional[int]:
    # One group is no grouping (a model without n_group): SGLang's choice and maps are the same.
    return groups if groups > 1 else None


def _sglang_layer(counts: np.ndarray, plan: Schedule, result: Replay, state: _SglangState, experts: int,
                  gpus: int, groups: int, nodes: int) -> list[np.ndarray]:
    """One layer of one SGLang setting (module docstring): adds its per-step sums into ``result``; returns
    its map at each rearrangement."""
    slots, total = result.slots, counts.shape[0]
    per_gpu = slots // gpus
    served = trivial_map(1, experts, slots)[0]
    dispatch = static_layer(served, experts, gpus, state.ranks, nodes)
    bounds = [0] + [s + 1 for s in plan.steps] + [total]
    loads = np.zeros((total, gpus), dtype=np.int64)
    chosen = []
    for k in range(len(bounds) - 1):
        # Rank g sends counts / G of each expert to its slot: G x the GPU loads, in integers.
        loads[bounds[k]:bounds[k + 1]] = counts[bounds[k]:bounds[k + 1]] @ static_senders(dispatch // per_gpu, gpus)
        if k == len(bounds) - 2:
            break
        window = counts[plan.windows[k]].sum(axis=0)
        phy2log, log2phy = sglang_policy.rebalance_experts(window[None, :], slots, _groups(groups), nodes, gpus)
        result.moved[k] += int((phy2log[0] != served).sum())
        served = phy2log[0]
        dispatch = sglang_policy.dispatch_layer(log2phy[0], slots, gpus, nodes, state.shared[k])
        chosen.append(served)
    result.busiest += loads.max(axis=1) / gpus
    result.mean += loads.sum(axis=1) / gpus / gpus
    return chosen


def _step_counts(ids: np.ndarray, step: np.ndarray, total: int, experts: int) -> np.ndarray:
    """(T, E) int64: how many of the (P, K) ``ids`` each expert got in each step, a piece of passes at a time."""
    counts = np.zeros(total * experts, dtype=np.int64)
    for at in range(0, ids.shape[0], LayerDispatch.PIECE):
        part = ids[at:at + LayerDispatch.PIECE]
        counts += np.bincount((step[at:at + LayerDispatch.PIECE, None] * experts + part).ravel(),
                              minlength=total * experts)
    return counts.reshape(total, experts)


def _replay_layer(ids: np.ndarray, step: np.ndarray, index: np.ndarray, total: int, plan: Schedule,
                  result: Replay, experts: int, gpus: int, groups: int, nodes: int) -> list[np.ndarray]:
    """One layer of one setting: adds its per-step sums into ``result``; returns its map at each rearrangement."""
    slots = result.slots
    per_gpu = slots // gpus
    width = ids.shape[1]
    served = trivial_map(1, experts, slots)[0]
    physical = np.zeros((total, slots), dtype=np.int64)
    bounds = [0] + [s + 1 for s in plan.steps] + [total]
    cut = np.searchsorted(step, bounds)
    chosen = []
    for k in range(len(bounds) - 1):
        lo, hi = cut[k], cut[k + 1]
        if hi > lo:
            table, replicas = logical_to_physical(served[None, :], experts)
            first, last = bounds[k], bounds[k + 1]
            # A piece of passes at a time (a segment is the whole layer when nothing is rearranged), and
            # only the segment's steps: a bincount over all T steps per segment would be O(T x segments).
            for at in range(lo, hi, LayerDispatch.PIECE):
                end = min(hi, at + LayerDispatch.PIECE)
                flat = ids[at:end].astype(np.int64).ravel()
                replica = hash_replica(np.repeat(index[at:end], width), replicas[0][flat])
                slot = table[0][flat, replica]
                physical[first:last] += np.bincount((np.repeat(step[at:end], width) - first) * slots + slot,
                                                    minlength=(last - first) * slots).reshape(last - first, slots)
        if k == len(bounds) - 2:
            break
        # Rearrangement k: the window's slot counts, attributed through the map served now.
        window = physical[plan.windows[k]].sum(axis=0)
        weight = np.bincount(served, weights=window, minlength=experts).astype(np.int64)[None, :]
        new = _policy(result.setting, weight, served[None, :], slots, experts, gpus, groups, nodes)[0]
        result.moved[k] += int((new != served).sum())
        served = new
        chosen.append(new)
    loads = physical.reshape(total, gpus, per_gpu).sum(axis=2)
    result.busiest += loads.max(axis=1)
    result.mean += loads.mean(axis=1)
    return chosen


def _policy(setting: Setting, weight: np.ndarray, served: np.ndarray, slots: int, experts: int, gpus: int,
            groups: int, nodes: int) -> np.ndarray:
    if setting.engine == "vllm":
        return rebalance_experts(weight.astype(np.int32), slots, groups, nodes, gpus, served)
    target = align(place(weight, gpus, slots).phy2log, served, gpus, True)
    return rebalance(served, weight, gpus, setting.max_moves, target)
