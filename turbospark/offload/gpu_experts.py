"""Static GPU-resident expert sets for hybrid (GPU + CPU) MoE inference: which (layer, expert) pairs
live on the GPU for a budget of N experts, and what each choice costs.

In KTransformers (kt-kernel, sglang-kt) and llama.cpp-style offloading the
experts not on the GPU run on the CPU, and the CPU side decides the speed: a
token's CPU time through a layer grows with the distinct CPU experts it
needs, and a serving step of B rows reads each distinct CPU expert's weights
once. Figures, over a window of traced passes (``score``):

* ``cpu_experts_per_token``: sum over layers of (CPU-resident distinct ids
  of a pass) / passes, the expected CPU experts one token computes through
  the whole model;
* ``cpu_union_per_step``: sum over layers of the mean, over the serving steps
  of B passes, of the distinct CPU experts in the step (B = 1: the figure
  above). Steps are ``turbospark.placement.samples.batch_counts``' batches,
  as ``place --batch`` forms them: with sequence tags continuous batching
  with B rows, otherwise B consecutive passes (a shorter tail left out);
* ``gpu_share``: GPU lookups / all lookups (a lookup: one distinct id of a pass);
* ``cpu_free_steps``: share of (layer, step) pairs needing no CPU expert (the
  CPU round trip of that layer is skipped).

Strategies. KTransformers' four, reproduced exactly (MoE-layer space: the
capture's layers are the model's MoE layers; sglang-kt's dense layers are
all-True rows outside it and take no budget):

* ``uniform`` (sglang-kt ``generate_uniform_masks``, its default): N // L
  experts per layer, the first N % L layers one more, always experts
  0..n-1 of the layer (ids, not counts);
* ``front-loading`` (``generate_front_loading_masks``): layers filled in
  order, experts 0..E-1, until N is spent;
* ``random`` (``generate_random_masks``): ``torch.randperm(L * E)`` from a
  CPU generator seeded 42, its first N positions (layer-major); torch's
  CPU randperm (a Fisher-Yates swap with mt19937's 32-bit draws mod n - i)
  is reproduced with numpy's ``RandomState``, the same mt19937;
* ``frequency`` (kt-kernel ``generate_gpu_experts_masks``): one global top-N
  of the fit window's counts. kt takes ``torch.topk(sorted=False)``, whose
  choice among equal counts at the N-th place is torch's; turbospark takes
  the lower (layer, expert) first. The file turbospark writes (``kt_counts``)
  carries the mask itself, so the engine picks turbospark's set either way.

turbospark's own (all ties: the lower (layer, expert) first):

* ``layer-aware``: the top-N of each layer's rate, count / the layer's
  passes: the exact minimiser of the fit window's ``cpu_experts_per_token``
  (it equals ``frequency`` when every layer has the same passes, and differs
  where they do not: a pruned last layer, a streamed capture's gaps, a fit
  split by sequences);
* ``batch-aware``: the top-N of each expert's step occupancy (the share of
  the layer's B-pass steps it appears in): the exact minimiser of the fit
  window's ``cpu_union_per_step`` (B = 1: ``layer-aware``);
* ``coactivation``: greedy on the experts that fire together: repeatedly
  the step expert-set (per layer) with the most fit steps per expert it still
  needs is put on the GPU whole, while it fits, so those steps need no CPU
  at all (``cpu_free_steps``); what is left of N goes by ``batch-aware``'s
  order. A heuristic (maximum coverage is NP-hard), judged like the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Optional, Sequence, Union

import numpy as np

from ..capture.reader import Capture
from ..capture.sequences import exact_fraction, fit_mask, serving_iterations

__all__ = [
    "KT_STRATEGIES",
    "OWN_STRATEGIES",
    "STRATEGIES",
    "Window",
    "choose",
    "gpu_experts_report",
    "kt_frequency_mask",
    "kt_front_loading_mask",
    "kt_random_mask",
    "kt_uniform_mask",
    "parse_strategies",
    "score",
    "windows",
]

KT_STRATEGIES: tuple[str, ...] = ("uniform", "frequency", "front-loading", "random")
OWN_STRATEGIES: tuple[str, ...] = ("layer-aware", "batch-aware", "coactivation")
STRATEGIES: tuple[str, ...] = KT_STRATEGIES + OWN_STRATEGIES
NO_TRACE = "the capture has no trace (record with trace=True): GPU expert sets are scored pass by pass"


def parse_strategies(text: Union[str, Sequence[str]]) -> list[str]:
    """Strategy names from ``"uniform,batch-aware"`` or a list (``all``: every one), order kept,
    duplicates merged. Raises ``ValueError`` naming an unknown one."""
    names = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        for one in (STRATEGIES if name == "all" else (name,)):
            if one not in STRATEGIES:
                raise ValueError(f"unknown GPU expert strategy {raw.strip()!r}: choose from "
                                 f"{', '.join(STRATEGIES)} or all")
            if one not in out:
                out.append(one)
    if not out:
        raise ValueError("no GPU expert strategy given")
    return out


# --- KTransformers' four, in MoE-layer space -------------------------------------------------


def _check_budget(num_layers: int, num_experts: int, budget: int) -> None:
    if num_layers < 1 or num_experts < 1:
        raise ValueError(f"need at least one layer and one expert, got {num_layers} x {num_experts}")
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"GPU expert budget must be a whole number >= 0, got {budget!r}")


def kt_uniform_mask(num_layers: int, num_experts: int, budget: int) -> np.ndarray:
    """sglang-kt's ``uniform``: (L, E) bool, N // L experts per layer (the first N % L layers one
    more, at most E), experts 0..n-1. Raises ``ValueError`` for a negative budget."""
    _check_budget(num_layers, num_experts, budget)
    mask = np.zeros((num_layers, num_experts), dtype=bool)
    each, extra = divmod(int(budget), num_layers)
    for layer in range(num_layers):
        mask[layer, : min(each + (1 if layer < extra else 0), num_experts)] = True
    return mask


def kt_front_loading_mask(num_layers: int, num_experts: int, budget: int) -> np.ndarray:
    """sglang-kt's ``front-loading``: layers filled in order with experts 0..E-1 until N is spent."""
    _check_budget(num_layers, num_experts, budget)
    flat = np.zeros(num_layers * num_experts, dtype=bool)
    flat[: min(int(budget), flat.shape[0])] = True
    return flat.reshape(num_layers, num_experts)


def torch_randperm(n: int, seed: int) -> np.ndarray:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` on the CPU, without torch.

    torch's CPU randperm swaps r[i] with r[i + draw % (n - i)] for i < n - 1, each draw a 32-bit
    output of mt19937 seeded as ``init_genrand(seed)``: numpy's legacy ``RandomState`` is that
    generator, and a full-range uint32 draw is its raw output.
    """
    r = np.arange(n, dtype=np.int64)
    if n < 2:
        return r
    draws = np.random.RandomState(seed).randint(0, 2**32, size=n - 1, dtype=np.uint64).tolist()
    perm = r.tolist()
    for i, draw in enumerate(draws):
        z = i + draw % (n - i)
        perm[i], perm[z] = perm[z], perm[i]
    return np.asarray(perm, dtype=np.int64)


def kt_random_mask(num_layers: int, num_experts: int, budget: int, seed: int = 42) -> np.ndarray:
    """sglang-kt's ``random``: the first N of ``torch.randperm(L * E)`` seeded ``seed`` (42, as the
    engine fixes it), over the MoE positions in layer-major order."""
    _check_budget(num_layers, num_experts, budget)
    total = num_layers * num_experts
    flat = np.zeros(total, dtype=bool)
    flat[torch_randperm(total, seed)[: min(int(budget), total)]] = True
    return flat.reshape(num_layers, num_experts)


def kt_frequency_mask(freq: np.ndarray, budget: int) -> np.ndarray:
    """kt-kernel's ``generate_gpu_experts_masks``: the global top-N of ``freq`` (L, E); among equal
    values at the N-th place the lower (layer, expert) (torch.topk's choice there is its own)."""
    freq = np.asarray(freq)
    if freq.ndim != 2:
        raise ValueError(f"activation frequencies must be (layers, experts), got shape {freq.shape}")
    _check_budget(freq.shape[0], freq.shape[1], budget)
    return _top(freq.astype(np.float64), budget)


def _top(score: np.ndarray, budget: int) -> np.ndarray:
    """(L, E) bool: the ``budget`` largest scores, ties to the lower flat index."""
    flat = score.ravel()
    order = np.lexsort((np.arange(flat.shape[0]), -flat))
    mask = np.zeros(flat.shape[0], dtype=bool)
    mask[order[: min(int(budget), flat.shape[0])]] = True
    return mask.reshape(score.shape)


# --- windows and scores -----------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Per layer, a window's (P, K) ids and its serving step of each pass (steps of B passes)."""

    ids: list[np.ndarray]
    steps: list[np.ndarray]
    batch: int

    @property
    def passes(self) -> list[int]:
        return [int(a.shape[0]) for a in self.ids]


def _window(ids: np.ndarray, seq: Optional[tuple[np.ndarray, np.ndarray]], batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` and each pass's step as ``batch_counts`` forms them (-1: in a tail left out)."""
    passes = ids.shape[0]
    if seq is None:
        whole = passes // batch
        steps = np.where(np.arange(passes) < whole * batch, np.arange(passes) // batch, -1)
    else:
        steps = serving_iterations(seq[0], seq[1], batch) if passes else np.zeros(0, dtype=np.int64)
    return ids, steps.astype(np.int64)


def windows(capture: Capture, fit: Optional[Union[float, Fraction, str]], batch: int = 1
            ) -> tuple[Window, Optional[Window], Optional[list[str]]]:
    """The fit window and the test window (None without ``fit``) of ``capture``'s trace, split as
    ``place --fit`` splits it, and how each layer was split (None without ``fit``).

    Raises ``ValueError`` without a trace, for ``fit`` outside (0, 1) or ``batch`` < 1.
    """
    if capture.trace is None:
        raise ValueError(NO_TRACE)
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be a whole number >= 1, got {batch!r}")
    exact = None
    if fit is not None:
        exact = exact_fraction(fit)
        if not 0 < exact < 1:
            raise ValueError(f"--fit must be strictly between 0 and 1, got {fit}")
    fit_ids: list[np.ndarray] = []
    fit_steps: list[np.ndarray] = []
    test_ids: list[np.ndarray] = []
    test_steps: list[np.ndarray] = []
    kinds: list[str] = []
    for layer in range(capture.num_layers):
        ids = np.ascontiguousarray(capture.trace[layer], dtype=np.int64)
        seq = None
        if capture.seq is not None and capture.phase is not None:
            seq = (np.asarray(capture.seq[layer]), np.asarray(capture.phase[layer]))
        keep = np.ones(ids.shape[0], dtype=bool)
        if exact is not None:
            keep, kind = fit_mask(capture, layer, exact)
            kinds.append(kind)
        for pick, out_ids, out_steps in ((keep, fit_ids, fit_steps), (~keep, test_ids, test_steps)):
            a, s = _window(ids[pick], None if seq is None else (seq[0][pick], seq[1][pick]), batch)
            out_ids.append(a)
            out_steps.append(s)
    fit_window = Window(fit_ids, fit_steps, batch)
    test_window = Window(test_ids, test_steps, batch) if exact is not None else None
    return fit_window, test_window, (kinds if exact is not None else None)


def _distinct(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """(P, E) bool: which experts each pass uses."""
    used = np.zeros((ids.shape[0], num_experts), dtype=bool)
    if ids.size:
        used[np.repeat(np.arange(ids.shape[0]), ids.shape[1]), ids.ravel()] = True
    return used


def _step_sets(ids: np.ndarray, steps: np.ndarray, num_experts: int) -> np.ndarray:
    """(steps, E) bool: which experts each kept step uses."""
    kept = steps >= 0
    count = int(steps.max(initial=-1)) + 1
    used = np.zeros((count, num_experts), dtype=bool)
    if kept.any():
        rows = np.repeat(steps[kept], ids.shape[1])
        used[rows, ids[kept].ravel()] = True
    return used


def score(mask: np.ndarray, window: Window) -> dict[str, Any]:
    """The figures of GPU set ``mask`` (L, E) on ``window`` (module docstring), model-wide and per layer.

    Returns {"cpu_experts_per_token", "cpu_union_per_step", "gpu_share", "cpu_free_steps",
    "layers": [{"layer", "gpu_experts", "passes", "steps", "cpu_experts_per_token",
    "cpu_union_per_step"}]}; a layer without passes (steps) has None in its figures and adds
    nothing to the sums; a model figure is None when no layer has any.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.shape[0] != len(window.ids):
        raise ValueError(f"mask has {mask.shape[0]} layers, the window {len(window.ids)}")
    num_experts = mask.shape[1]
    per_token, per_step, layers = [], [], []
    gpu = lookups = free = steps_total = 0
    for layer, (ids, steps) in enumerate(zip(window.ids, window.steps)):
        used = _distinct(ids, num_experts)
        cpu = (used & ~mask[layer]).sum(axis=1)
        sets = _step_sets(ids, steps, num_experts)
        cpu_steps = (sets & ~mask[layer]).sum(axis=1)
        lookups += int(used.sum())
        gpu += int((used & mask[layer]).sum())
        free += int((cpu_steps == 0).sum())
        steps_total += int(sets.shape[0])
        a = int(cpu.sum()) / ids.shape[0] if ids.shape[0] else None
        b = int(cpu_steps.sum()) / sets.shape[0] if sets.shape[0] else None
        if a is not None:
            per_token.append(a)
        if b is not None:
            per_step.append(b)
        layers.append({"layer": layer, "gpu_experts": int(mask[layer].sum()), "passes": int(ids.shape[0]),
                       "steps": int(sets.shape[0]), "cpu_experts_per_token": a, "cpu_union_per_step": b})
    return {
        "cpu_experts_per_token": math.fsum(per_token) if per_token else None,
        "cpu_union_per_step": math.fsum(per_step) if per_step else None,
        "gpu_share": gpu / lookups if lookups else None,
        "cpu_free_steps": free / steps_total if steps_total else None,
        "layers": layers,
    }


# --- choosing ---------------------------------------------------------------------------------


def choose(strategy: str, window: Window, num_experts: int, budget: int) -> np.ndarray:
    """The (L, E) bool GPU set ``strategy`` picks for ``budget`` experts from ``window`` (the fit
    passes). Raises ``ValueError`` for an unknown strategy or a budget outside 0..L*E."""
    name = parse_strategies([strategy])[0]
    num_layers = len(window.ids)
    _check_budget(num_layers, num_experts, budget)
    if budget > num_layers * num_experts:
        raise ValueError(f"GPU expert budget {budget} exceeds the model's {num_layers} x {num_experts} "
                         f"= {num_layers * num_experts} experts")
    if name == "uniform":
        return kt_uniform_mask(num_layers, num_experts, budget)
    if name == "front-loading":
        return kt_front_loading_mask(num_layers, num_experts, budget)
    if name == "random":
        return kt_random_mask(num_layers, num_experts, budget)
    counts = np.stack([np.bincount(ids.ravel(), minlength=num_experts) for ids in window.ids])
    if name == "frequency":
        return kt_frequency_mask(counts, budget)
    if name == "layer-aware":
        used = np.stack([_distinct(ids, num_experts).sum(axis=0) for ids in window.ids]).astype(np.float64)
        passes = np.maximum(np.asarray(window.passes, dtype=np.float64), 1.0)
        return _top(used / passes[:, None], budget)
    occupancy = _occupancy(window, num_experts)
    if name == "batch-aware":
        return _top(occupancy, budget)
    return _coactivation(window, num_experts, budget, occupancy)


def _occupancy(window: Window, num_experts: int) -> np.ndarray:
    """(L, E): the share of each layer's steps each expert appears in (0 for a layer without steps)."""
    rows = []
    for ids, steps in zip(window.ids, window.steps):
        sets = _step_sets(ids, steps, num_experts)
        rows.append(sets.sum(axis=0) / sets.shape[0] if sets.shape[0] else np.zeros(num_experts))
    return np.stack(rows).astype(np.float64)


def _coactivation(window: Window, num_experts: int, budget: int, occupancy: np.ndarray) -> np.ndarray:
    """Greedy: the step set with the most uncovered steps per still-needed expert, while it fits."""
    num_layers = len(window.ids)
    mask = np.zeros((num_layers, num_experts), dtype=bool)
    patterns, weights, owners = [], [], []
    for layer, (ids, steps) in enumerate(zip(window.ids, window.steps)):
        sets = _step_sets(ids, steps, num_experts)
        if not sets.shape[0]:
            continue
        unique, count = np.unique(sets, axis=0, return_counts=True)
        patterns.append(unique)
        weights.append(count)
        owners.append(np.full(unique.shape[0], layer))
    left = int(budget)
    if patterns:
        sets_all = np.concatenate(patterns)
        count_all = np.concatenate(weights).astype(np.float64)
        layer_of = np.concatenate(owners)
        open_ = np.ones(sets_all.shape[0], dtype=bool)
        while left > 0:
            need = (sets_all & ~mask[layer_of]).sum(axis=1)
            open_ &= need > 0
            fits = open_ & (need <= left)
            if not fits.any():
                break
            # Gain per expert: every open step set this one would complete, counted by its steps.
            ratio = np.where(fits, count_all / np.maximum(need, 1), -1.0)
            best = int(np.lexsort((np.arange(ratio.shape[0]), -ratio))[0])
            layer = int(layer_of[best])
            added = sets_all[best] & ~mask[layer]
            mask[layer] |= sets_all[best]
            left -= int(added.sum())
    if left > 0:
        rest = np.where(mask, -np.inf, occupancy)
        mask |= _top(rest, left)
    return mask


# --- the report -------------------------------------------------------------------------------


def gpu_experts_report(capture: Capture, budget: int, strategies: Sequence[str] = STRATEGIES, *,
                       batch: int = 1, fit: Optional[Union[float, Fraction, str]] = None,
                       expert_bytes: Optional[int] = None) -> dict[str, Any]:
    """The ``turbospark offload --gpu-experts`` document (docs/offload.md) as plain Python values.

    ``budget``: GPU experts N over all MoE layers; ``strategies``: names from
    ``STRATEGIES``; ``batch``: rows per serving step for ``cpu_union_per_step``;
    ``fit``: choose from that fraction of each layer's passes, judge on the rest
    (None: choose and judge on everything, in sample only); ``expert_bytes``:
    reported as given (with N, the bytes the set takes). Raises ``ValueError``
    without a trace, for an unknown strategy, a budget outside 0..L*E, a bad
    ``fit`` or ``batch``.
    """
    names = parse_strategies(list(strategies))
    fit_window, test_window, kinds = windows(capture, fit, batch)
    e = capture.num_experts
    results: dict[str, Any] = {}
    for name in names:
        mask = choose(name, fit_window, e, budget)
        results[name] = {
            "per_layer": mask.sum(axis=1).astype(int).tolist(),
            "experts": [np.flatnonzero(row).tolist() for row in mask],
            "fit": score(mask, fit_window),
            "test": score(mask, test_window) if test_window is not None else None,
        }
    none = np.zeros((capture.num_layers, e), dtype=bool)
    return {
        "num_layers": capture.num_layers,
        "num_experts": e,
        "top_k": capture.top_k,
        "gpu_experts": int(budget),
        "expert_bytes": expert_bytes,
        "gpu_bytes": int(budget) * expert_bytes if expert_bytes is not None else None,
        "batch": int(batch),
        "batches": None if batch == 1 else ("concurrent sequences" if capture.seq is not None
                                            else "consecutive passes"),
        "fit": None if fit is None else str(exact_fraction(fit)),
        "split": kinds,
        "fit_passes": fit_window.passes,
        "test_passes": test_window.passes if test_window is not None else None,
        "strategies": names,
        "all_cpu": {"fit": _model_only(score(none, fit_window)),
                    "test": _model_only(score(none, test_window)) if test_window is not None else None},
        "results": results,
    }


def _model_only(figures: dict[str, Any]) -> dict[str, Any]:
    """The model-wide figures (the all-CPU baseline's per-layer rows say nothing new)."""
    return {key: value for key, value in figures.items() if key != "layers"}
