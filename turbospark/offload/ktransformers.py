"""KTransformers' GPU expert file: a GPU set as the SGLang expert-distribution dump sglang-kt loads.

sglang-kt (``sglang/srt/layers/moe/kt_ep_wrapper.py``, ``_init_kt_gpu_experts_masks``)
has no flag that takes a mask. With ``--kt-expert-placement-strategy
frequency --init-expert-location FILE.pt`` it ``torch.load``s FILE (the name
must end in ``.pt``, or it silently falls back to equal frequencies), takes
its ``logical_count`` (a dict key: SGLang's dump format), a tensor
``[n_passes, num_hidden_layers, num_experts]`` that must match the model's
``num_hidden_layers`` and expert count, sums dim 0, and hands the result to
kt-kernel's ``generate_gpu_experts_masks``: the global top-N, N =
``int(total * --kt-gpu-experts-ratio)`` or ``--kt-num-gpu-experts x
MoE layers``, where total = MoE layers x experts (dense layers are counted
in the file's rows but not in ``total``; their rows are then set all-True).

So a mask (MoE layers x E) encodes exactly as ``logical_count = mask x 1000``
of shape ``[1, num_hidden_layers, E]``, zeros in the dense rows, with ratio
``(N + 0.5) / (MoE layers x E)``: the top-N of N values 1000 among zeros is
the mask, whatever ``topk``'s order, and ``int`` of the product is N.
turbospark's capture layers are the model's MoE layers; ``first_moe_layer``
(DeepSeek-V3's ``first_k_dense_replace``: 3) places them in the file, MoE
layers consecutive from there (sglang-kt's ``moe_layer_freq`` = 1). The
engine takes every layer from there to ``num_hidden_layers`` as MoE: rows
past the capture's layers count in its total (the ratio's denominator) and,
with zero counts, get no GPU expert.
Writing the file needs torch (``pip install 'turbospark[torch]'``).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

__all__ = ["COUNT", "kt_counts", "kt_flags", "kt_ratio", "write_kt_file"]

COUNT = 1000  # any positive count works; 1000 reads as "chosen" in a dump
NO_TORCH = ("writing KTransformers' .pt file needs torch, which is not installed: "
            "pip install 'turbospark[torch]' (or torch itself)")


def kt_ratio(budget: int, moe_layers: int, num_experts: int) -> float:
    """The ``--kt-gpu-experts-ratio`` for which sglang-kt's ``int(total * ratio)`` is ``budget``.

    Raises ``ValueError`` when ``budget`` is outside 0..total (checked against
    the engine's own arithmetic, so the printed ratio is the float it parses).
    """
    total = moe_layers * num_experts
    if not 0 <= budget <= total:
        raise ValueError(f"GPU expert budget {budget} is outside 0..{total} (MoE layers x experts)")
    ratio = (budget + 0.5) / total
    if int(total * float(repr(ratio))) != budget:  # the engine reads the printed decimal
        raise ValueError(f"no ratio reproduces {budget} of {total} experts")  # pragma: no cover
    return ratio


def kt_counts(mask: np.ndarray, first_moe_layer: int = 0, num_hidden_layers: Optional[int] = None) -> np.ndarray:
    """(1, H, E) int32: ``mask`` (MoE layers x E) x 1000 at rows D..D+L-1, zeros elsewhere.

    ``first_moe_layer`` D: decoder index of MoE layer 0; ``num_hidden_layers`` H: the model's
    (default D + L). Raises ``ValueError`` for D < 0 or H < D + L.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2 or mask.shape[0] < 1 or mask.shape[1] < 1:
        raise ValueError(f"mask must be (MoE layers, experts), got shape {mask.shape}")
    layers = mask.shape[0]
    if first_moe_layer < 0:
        raise ValueError(f"first MoE layer must be >= 0, got {first_moe_layer}")
    hidden = first_moe_layer + layers if num_hidden_layers is None else num_hidden_layers
    if hidden < first_moe_layer + layers:
        raise ValueError(f"num_hidden_layers {hidden} is below first MoE layer {first_moe_layer} + "
                         f"{layers} MoE layers")
    out = np.zeros((1, hidden, mask.shape[1]), dtype=np.int32)
    out[0, first_moe_layer:first_moe_layer + layers] = mask.astype(np.int32) * COUNT
    return out


def kt_flags(path: str, budget: int, moe_layers: int, num_experts: int) -> list[str]:
    """The sglang-kt flags that make it load ``path`` and keep exactly ``budget`` GPU experts: the
    ratio form, and (when ``budget`` is a whole number per MoE layer) the per-layer form.
    ``moe_layers``: the layers the engine counts as MoE (num_hidden_layers - first_k_dense_replace)."""
    flags = [f"--kt-expert-placement-strategy frequency --init-expert-location {path} "
             f"--kt-gpu-experts-ratio {kt_ratio(budget, moe_layers, num_experts)!r}"]
    if budget % moe_layers == 0:
        flags.append(f"--kt-expert-placement-strategy frequency --init-expert-location {path} "
                     f"--kt-num-gpu-experts {budget // moe_layers}")
    return flags


def write_kt_file(path: str, mask: np.ndarray, *, first_moe_layer: int = 0,
                  num_hidden_layers: Optional[int] = None) -> list[str]:
    """Write ``mask`` as KTransformers' ``{"logical_count": int32 [1, H, E]}`` file at ``path``
    (atomically) and return ``kt_flags`` for it.

    Raises ``ValueError`` when ``path`` does not end in ``.pt`` (sglang-kt would
    ignore it) or for a bad mask or layer geometry, ``RuntimeError`` without
    torch, ``OSError`` when the file cannot be written.
    """
    if not str(path).endswith(".pt"):
        raise ValueError(f"KTransformers' file must end in .pt, got {path!r}: sglang-kt reads "
                         "--init-expert-location as activation counts only then")
    counts = kt_counts(mask, first_moe_layer, num_hidden_layers)
    try:
        import torch
    except ImportError:
        raise RuntimeError(NO_TORCH) from None
    budget = int(np.asarray(mask, dtype=bool).sum())
    # The engine counts every layer from first_k_dense_replace on as MoE (moe_layer_freq 1): rows past
    # the capture's layers are MoE layers to it, in its total, with zero counts (no GPU experts).
    flags = kt_flags(str(path), budget, counts.shape[1] - first_moe_layer, counts.shape[2])
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save({"logical_count": torch.from_numpy(counts)}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return flags

