"""llama.cpp layer plans: which layers' expert tensors stay on the GPU for a VRAM budget.

llama.cpp has no per-expert placement: a layer's gate, up and down experts
are each one 3-D tensor (``blk.N.ffn_{gate,up,down}_exps``, or a fused
``ffn_gate_up_exps``), so the unit ``-ot/--override-tensor REGEX=CPU``
moves is a layer's expert tensors. A plan keeps some layers' expert
tensors in VRAM (within ``budget`` bytes) and sends the others to the CPU.
Two costs decide how fast that runs, and both are computed here:

* **decode**: each token computes its top-k experts of every CPU layer on
  the CPU, reading their weights from RAM: ``cpu_experts_per_token`` =
  sum over CPU layers of the mean experts a pass picks there (top_k for a
  routed layer), and ``cpu_bytes_per_token`` the same weighted by each
  layer's bytes per expert. At layer granularity every routed layer costs
  the same per token (only its bytes differ), so the capture matters for
  decode only through which layers route at all and their sizes.
* **prompt processing**: for a ubatch of at least ``min_offload_batch``
  tokens (ggml-cuda's ``GGML_OP_OFFLOAD_MIN_BATCH``, default 32), llama.cpp
  runs a CPU layer's expert matmul on the GPU, copying only the experts the
  ubatch uses (``ggml_backend_sched_compute_splits``: the used ids' expert
  slices of each weight tensor). ``copy_experts_per_ubatch`` = sum over CPU
  layers of the mean number of distinct experts per ubatch, from the
  capture's prompt passes cut into ubatches of ``ubatch`` consecutive
  tokens of one sequence (the capture's ``seq``/``phase`` tags; an untagged
  trace counts as one prompt), and ``copy_bytes_per_ubatch`` the same
  weighted by bytes per expert. Layers whose ubatches use few distinct
  experts are the cheap ones to leave on the CPU.

``plan`` picks, exactly, the GPU set minimising the decode bytes first and
the prompt copy bytes second (or the other way round with
``prefer="prompt"``), among all sets whose tensors fit the budget: a 0/1
knapsack solved by a dynamic programme over layers that keeps, per total
size, only the best plan (the Pareto frontier of size against cost), with
exact rational costs. ``n_cpu_moe_plan`` is llama.cpp's own
``--n-cpu-moe N`` for the same budget (the first N layers on the CPU, the
smallest N that fits), the comparison a plan is judged against.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Optional, Sequence, Union

import numpy as np

from turbospark.capture.reader import Capture
from turbospark.metrics.layers import pass_bitsets

__all__ = [
    "EXPS_REGEX",
    "LayerCosts",
    "LlamaPlan",
    "expert_tensor_bytes",
    "layer_costs",
    "n_cpu_moe_plan",
    "plan",
]

# common/common.h LLM_FFN_EXPS_REGEX, after blk\.N: the tensors --cpu-moe / --n-cpu-moe move.
EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
_LAYER = re.compile(r"blk\.(\d+)" + EXPS_REGEX)
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class LayerCosts:
    """Per layer: the bytes of its expert tensors and what each costs when the layer sits on the CPU.

    ``tensor_bytes[l]``: all of layer l's expert tensors (0: no experts, a
    dense layer); ``expert_bytes[l]``: one expert's share (tensor_bytes / E);
    ``decode_experts[l]``: mean experts a pass picks in l (top_k where it
    routed, 0 where it never did); ``ubatch_distinct[l]``: mean distinct
    experts per prompt ubatch of at least ``min_offload_batch`` tokens
    (None: no such ubatch in the capture, or no trace); ``ubatches[l]``: how
    many ubatches that mean is over.
    """

    num_experts: int
    tensor_bytes: tuple[int, ...]
    expert_bytes: tuple[Fraction, ...]
    decode_experts: tuple[Fraction, ...]
    ubatch_distinct: tuple[Optional[Fraction], ...]
    ubatches: tuple[int, ...]
    ubatch: int
    min_offload_batch: int

    @property
    def expert_layers(self) -> tuple[int, ...]:
        """The layers with expert tensors, ascending."""
        return tuple(layer for layer, size in enumerate(self.tensor_bytes) if size > 0)


@dataclasses.dataclass(frozen=True)
class LlamaPlan:
    """A GPU/CPU split of the expert layers and its costs (see the module docstring)."""

    budget: int
    gpu_layers: tuple[int, ...]
    cpu_layers: tuple[int, ...]
    gpu_bytes: int
    cpu_experts_per_token: Fraction
    cpu_bytes_per_token: Fraction
    copy_experts_per_ubatch: Optional[Fraction]
    copy_bytes_per_ubatch: Optional[Fraction]

    @property
    def override_regex(self) -> Optional[str]:
        """The ``-ot`` pattern naming exactly the CPU layers' expert tensors; None when none go to the CPU."""
        if not self.cpu_layers:
            return None
        return r"blk\.(" + "|".join(str(layer) for layer in self.cpu_layers) + r")" + EXPS_REGEX

    @property
    def override_argument(self) -> Optional[str]:
        """``REGEX=CPU``, the value of llama.cpp's ``-ot`` / ``--override-tensor``; None when nothing moves."""
        regex = self.override_regex
        return None if regex is None else f"{regex}=CPU"

    def n_cpu_moe(self, expert_layers: Sequence[int]) -> Optional[int]:
        """N when ``--n-cpu-moe N`` moves exactly these CPU layers (the expert layers below N); else None."""
        if not self.cpu_layers:
            return 0
        n = self.cpu_layers[-1] + 1
        return n if tuple(layer for layer in expert_layers if layer < n) == self.cpu_layers else None

    def to_dict(self, expert_layers: Sequence[int]) -> dict[str, object]:
        """A JSON-ready dict (costs as floats, exact fractions as "p/q" strings beside them)."""
        def both(value: Optional[Fraction]) -> object:
            return None if value is None else {"value": float(value), "exact": str(value)}

        return {
            "budget": self.budget, "gpu_layers": list(self.gpu_layers), "cpu_layers": list(self.cpu_layers),
            "gpu_bytes": self.gpu_bytes, "override_tensor": self.override_argument,
            "n_cpu_moe": self.n_cpu_moe(expert_layers),
            "cpu_experts_per_token": both(self.cpu_experts_per_token),
            "cpu_bytes_per_token": both(self.cpu_bytes_per_token),
            "copy_experts_per_ubatch": both(self.copy_experts_per_ubatch),
            "copy_bytes_per_ubatch": both(self.copy_bytes_per_ubatch),
        }


def expert_tensor_bytes(gguf_path: str, num_layers: Optional[int] = None) -> tuple[int, ...]:
    """Per layer, the bytes of the tensors llama.cpp's ``--n-cpu-moe`` regex names, read from a GGUF.

    Needs the ``gguf`` package. Returns one entry per block (``<arch>.block_count``,
    or ``num_layers`` when given and the file has no such key). Raises
    ``ImportError`` without ``gguf``, ``ValueError`` for a file with no expert
    tensors or a block count that differs from ``num_layers``.
    """
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ImportError("reading expert tensor sizes from a GGUF needs the gguf package (pip install gguf); "
                          "or give the sizes with --expert-bytes") from exc
    reader = GGUFReader(gguf_path)
    blocks = _block_count(reader)
    if num_layers is not None and blocks is not None and blocks != num_layers:
        raise ValueError(f"{gguf_path} has {blocks} blocks; the capture has {num_layers} layers")
    count = blocks if blocks is not None else num_layers
    sizes: dict[int, int] = {}
    for tensor in reader.tensors:
        match = _LAYER.search(tensor.name)
        if match:
            layer = int(match.group(1))
            sizes[layer] = sizes.get(layer, 0) + int(tensor.n_bytes)
    if not sizes:
        raise ValueError(f"{gguf_path} holds no expert tensors (no name matches blk.N{EXPS_REGEX})")
    if count is None:
        count = max(sizes) + 1
    return tuple(sizes.get(layer, 0) for layer in range(count))


def _block_count(reader: object) -> Optional[int]:
    fields = getattr(reader, "fields")
    arch_field = fields.get("general.architecture")
    if arch_field is None:
        return None
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    field = fields.get(f"{arch}.block_count")
    return None if field is None else int(field.parts[field.data[0]][0])


def layer_costs(
    capture: Capture,
    tensor_bytes: Sequence[int],
    *,
    ubatch: int = 512,
    min_offload_batch: int = 32,
) -> LayerCosts:
    """The per-layer sizes and costs a plan adds up, from a capture and each layer's expert tensor bytes.

    ``tensor_bytes``: one entry per capture layer (``expert_tensor_bytes``, or
    E x bytes per expert); ``ubatch``: llama.cpp's ``-ub`` (default 512);
    ``min_offload_batch``: the smallest ubatch llama.cpp runs on the GPU
    (32). Raises ``ValueError`` for a length mismatch, a negative size, a
    layer with expert tensors whose size is not a multiple of E (neither a
    GGUF's nor ``--expert-bytes``'), or ``ubatch`` / ``min_offload_batch``
    below 1.
    """
    if len(tensor_bytes) != capture.num_layers:
        raise ValueError(f"{len(tensor_bytes)} layer sizes for a capture of {capture.num_layers} layers")
    if ubatch < 1 or min_offload_batch < 1:
        raise ValueError(f"ubatch and min_offload_batch must be at least 1, got {ubatch} and {min_offload_batch}")
    experts = capture.num_experts
    sizes = tuple(int(size) for size in tensor_bytes)
    for layer, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"layer {layer}: expert tensor bytes must not be negative, got {size}")
    totals = capture.counts.sum(axis=1)
    # Mean experts per pass: counts / passes, passes = totals / top_k (each pass picks top_k distinct).
    decode = tuple(Fraction(capture.top_k) if int(totals[l]) > 0 else Fraction(0) for l in range(capture.num_layers))
    distinct: list[Optional[Fraction]] = []
    counted: list[int] = []
    for layer in range(capture.num_layers):
        mean, number = _ubatch_distinct(capture, layer, ubatch, min_offload_batch)
        distinct.append(mean)
        counted.append(number)
    return LayerCosts(experts, sizes, tuple(Fraction(size, experts) for size in sizes), decode, tuple(distinct),
                      tuple(counted), ubatch, min_offload_batch)


def _ubatch_distinct(capture: Capture, layer: int, ubatch: int, min_batch: int) -> tuple[Optional[Fraction], int]:
    """Mean distinct experts over the layer's prompt ubatches of >= min_batch tokens, and their number."""
    if capture.trace is None:
        return None, 0
    ids = np.asarray(capture.trace[layer], dtype=np.int64)
    if ids.shape[0] == 0:
        return None, 0
    if capture.seq is not None and capture.phase is not None:
        seq = np.asarray(capture.seq[layer], dtype=np.int64)
        prompt = np.asarray(capture.phase[layer]) == 0
        rows = np.flatnonzero(prompt)
        ids, seq = ids[rows], seq[rows]
        # Runs of one sequence's prompt tokens, consecutive in the trace.
        breaks = np.flatnonzero(np.diff(seq) != 0) + 1 if seq.shape[0] else np.zeros(0, dtype=np.int64)
        starts = np.concatenate([[0], breaks]).astype(np.int64) if seq.shape[0] else np.zeros(0, dtype=np.int64)
        ends = np.concatenate([breaks, [seq.shape[0]]]).astype(np.int64) if seq.shape[0] else np.zeros(0, dtype=np.int64)
    else:
        starts, ends = np.array([0]), np.array([ids.shape[0]])
    bits = pass_bitsets(ids, capture.num_experts) if ids.shape[0] else None
    total, number = 0, 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        for a in range(start, end, ubatch):
            b = min(a + ubatch, end)
            if b - a < min_batch:
                continue
            assert bits is not None
            union = np.bitwise_or.reduce(bits[a:b], axis=0)
            total += int(_POPCOUNT[union.view(np.uint8)].sum())
            number += 1
    return (Fraction(total, number) if number else None), number


def _evaluate(costs: LayerCosts, gpu: Sequence[int], budget: int) -> LlamaPlan:
    layers = costs.expert_layers
    gpu_set = set(gpu)
    cpu = tuple(layer for layer in layers if layer not in gpu_set)
    experts = sum((costs.decode_experts[l] for l in cpu), Fraction(0))
    bytes_ = sum((costs.decode_experts[l] * costs.expert_bytes[l] for l in cpu), Fraction(0))
    known = all(costs.ubatch_distinct[l] is not None for l in cpu)
    copy = sum((costs.ubatch_distinct[l] or 0 for l in cpu), Fraction(0)) if known else None
    copy_bytes = (sum(((costs.ubatch_distinct[l] or 0) * costs.expert_bytes[l] for l in cpu), Fraction(0))
                  if known else None)
    return LlamaPlan(budget, tuple(sorted(gpu_set)), cpu, sum(costs.tensor_bytes[l] for l in gpu_set),
                     experts, bytes_, copy, copy_bytes)


def plan(costs: LayerCosts, budget: int, *, prefer: str = "decode") -> LlamaPlan:
    """The best GPU set for ``budget`` bytes of expert tensors (module docstring: exact, lexicographic).

    ``prefer``: ``"decode"`` (decode bytes first, prompt copy bytes to break
    ties) or ``"prompt"`` (the reverse). A layer without a prompt-ubatch
    figure counts 0 copy bytes saved. Among equal plans the one with fewer
    GPU bytes, then the lower layers on the GPU, wins (deterministic).
    Raises ``ValueError`` for a negative budget or an unknown ``prefer``.
    """
    if budget < 0:
        raise ValueError(f"budget must be at least 0 bytes, got {budget}")
    if prefer not in ("decode", "prompt"):
        raise ValueError(f"prefer must be 'decode' or 'prompt', got {prefer!r}")
    # Per layer, what keeping it on the GPU saves: (decode bytes, copy bytes), ordered by preference.
    saved: dict[int, tuple[Fraction, Fraction]] = {}
    for layer in costs.expert_layers:
        decode = costs.decode_experts[layer] * costs.expert_bytes[layer]
        copy = (costs.ubatch_distinct[layer] or Fraction(0)) * costs.expert_bytes[layer]
        saved[layer] = (decode, copy) if prefer == "decode" else (copy, decode)
    # Frontier: size -> (value, layers); a state survives only if no smaller-or-equal size has a value >= it.
    frontier: list[tuple[int, tuple[Fraction, Fraction], tuple[int, ...]]] = [(0, (Fraction(0), Fraction(0)), ())]
    for layer in costs.expert_layers:
        size = costs.tensor_bytes[layer]
        grown = [(used + size, (value[0] + saved[layer][0], value[1] + saved[layer][1]), chosen + (layer,))
                 for used, value, chosen in frontier if used + size <= budget]
        frontier = _pareto(frontier + grown)
    best = max(frontier, key=lambda state: (state[1], -state[0], tuple(-l for l in state[2])))
    return _evaluate(costs, best[2], budget)


def _pareto(states: list[tuple[int, tuple[Fraction, Fraction], tuple[int, ...]]]) -> list[
        tuple[int, tuple[Fraction, Fraction], tuple[int, ...]]]:
    # Smaller size first; at equal size the better value (then lower layers) first.
    states.sort(key=lambda s: (s[0], (-s[1][0], -s[1][1]), s[2]))
    kept: list[tuple[int, tuple[Fraction, Fraction], tuple[int, ...]]] = []
    for state in states:
        if not kept or state[1] > kept[-1][1]:
            kept.append(state)
    return kept


def n_cpu_moe_plan(costs: LayerCosts, budget: int) -> LlamaPlan:
    """llama.cpp's ``--n-cpu-moe N`` for ``budget``: the first N expert layers on the CPU, the smallest N that fits."""
    if budget < 0:
        raise ValueError(f"budget must be at least 0 bytes, got {budget}")
    layers = costs.expert_layers
    for n in range(len(layers) + 1):
        gpu = layers[n:]
        if sum(costs.tensor_bytes[l] for l in gpu) <= budget:
            return _evaluate(costs, gpu, budget)
    raise AssertionError("unreachable: the empty GPU set always fits")


def parse_bytes(text: Union[str, int]) -> int:
    """``12G``, ``800M``, ``64K`` (powers of 1024; ``GB``/``GiB`` the same) or a plain integer, as bytes; ValueError otherwise."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"expected a size in bytes such as 12G, 800M or 123456, got {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[match.group(2).upper()]
    value = Fraction(match.group(1)) * scale
    if value.denominator != 1:
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)
