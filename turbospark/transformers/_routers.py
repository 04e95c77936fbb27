"""Find a transformers model's routers and decoder layers, and read the chosen ids from a router's output.

Discovery goes through transformers' own declarations: a model class lists
its router in ``_can_record_outputs["router_logits"]`` (an ``OutputRecorder``
on the router class, whose ``index`` points at the logits) and its decoder
layer class in ``_can_record_outputs["hidden_states"]``. What the router
returns beside the logits is read from one probe call: exactly one integer
tensor shaped (tokens, top_k) is the chosen ids. Routers that return no ids
but whose ids can be recomputed exactly from what they return are in
``OVERRIDES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

__all__ = ["OVERRIDES", "RouterSite", "Routing", "classify_output", "find_routing"]


def _llama4_ids(output: Any, router: nn.Module) -> torch.Tensor:
    # Llama4Router returns (scores, logits) and takes topk(logits, top_k, dim=1)
    # inside: the same call on the same logits gives the same ids.
    return torch.topk(output[1], router.top_k, dim=1)[1]


# Router class name -> how to get the (tokens, top_k) ids from its output,
# for routers that do not return them but whose ids can be recomputed exactly.
OVERRIDES: dict[str, Callable[[Any, nn.Module], torch.Tensor]] = {
    "Llama4Router": _llama4_ids,
}


@dataclass(frozen=True)
class RouterSite:
    """One router: the decoder layer it belongs to, the module, and how to read its ids."""

    layer: int
    name: str
    router: nn.Module
    ids_index: Optional[int]  # position of the ids in the router's output tuple; None: OVERRIDES
    top_k: int
    num_experts: int

    def ids(self, output: Any) -> torch.Tensor:
        """The (tokens, top_k) chosen ids from one output of this router."""
        if self.ids_index is None:
            ids = OVERRIDES[type(self.router).__name__](output, self.router)
        else:
            ids = output[self.ids_index]
        # Most routers already return (tokens, top_k): skip the reshape call then.
        return ids if ids.dim() == 2 else ids.reshape(-1, self.top_k)


@dataclass(frozen=True)
class Routing:
    """A model's decoder layers (in order) and its routers (in layer order)."""

    layers: tuple[nn.Module, ...]
    sites: tuple[RouterSite, ...]
    num_experts: int
    top_k: int

    @property
    def routed_layers(self) -> list[int]:
        """Indices of the decoder layers that hold a router."""
        return [site.layer for site in self.sites]


def classify_output(
    output: Any, logits_index: int, router_name: str, top_k: Optional[int] = None
) -> tuple[Optional[int], int, int, str]:
    """From one router output: (ids index or None, top_k, num_experts, problem).

    The ids are the one integer tensor whose last dimension is the router's
    ``top_k`` when it declares one, else narrower than the logits (a one-hot
    expert mask is not a list of ids). ``problem`` is "" when the ids were
    found (or an override applies), else a sentence saying what is missing.
    """
    items = output if isinstance(output, (tuple, list)) else (output,)
    if logits_index >= len(items) or not isinstance(items[logits_index], torch.Tensor):
        return None, 0, 0, f"output {logits_index} (its declared router_logits) is not a tensor"
    num_experts = int(items[logits_index].shape[-1])
    candidates = [
        (i, item)
        for i, item in enumerate(items)
        if isinstance(item, torch.Tensor)
        and not item.dtype.is_floating_point
        and item.dtype != torch.bool
        and item.dim() >= 1
        and (item.shape[-1] == top_k if isinstance(top_k, int) else item.shape[-1] < num_experts)
    ]
    if len(candidates) == 1:
        index, ids = candidates[0]
        return index, int(ids.shape[-1]), num_experts, ""
    if router_name in OVERRIDES:
        return None, 0, num_experts, ""
    shapes = ", ".join(
        f"{str(item.dtype).replace('torch.', '')} {tuple(item.shape)}" if isinstance(item, torch.Tensor) else type(item).__name__
        for item in items
    )
    found = "no integer (tokens, top_k) tensor" if not candidates else f"{len(candidates)} integer (tokens, top_k) tensors"
    return None, 0, num_experts, f"router {router_name} returns no top-k indices ({found} among its outputs: {shapes})"


def _declarations(model: nn.Module) -> list[tuple[Any, Any]]:
    """(router OutputRecorder, decoder-layer declaration) pairs declared by the model and its submodules."""
    found = []
    seen = set()
    for module in model.modules():
        table = getattr(type(module), "_can_record_outputs", None) or {}
        router = table.get("router_logits")
        if router is None or id(router) in seen:
            continue
        seen.add(id(router))
        found.append((router, table.get("hidden_states")))
    return found


def _classes(declaration: Any) -> tuple[type, ...]:
    """The module classes an ``_can_record_outputs`` entry names (a class, a list, or an OutputRecorder)."""
    if declaration is None:
        return ()
    if isinstance(declaration, (list, tuple)):
        return tuple(c for item in declaration for c in _classes(item))
    target = getattr(declaration, "target_class", declaration)
    if isinstance(target, (list, tuple)):
        return tuple(target)
    return (target,) if isinstance(target, type) else ()


def _probe_input(router: nn.Module, model: nn.Module) -> torch.Tensor:
    parameter = next(router.parameters(), None)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    hidden = getattr(config, "hidden_size", None)
    if hidden is None and parameter is not None:
        hidden = parameter.shape[-1]
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.dtype.is_floating_point else torch.float32
    return torch.zeros(1, int(hidden), device=device, dtype=dtype)


def _refuse_looped_layers(model: nn.Module, declarations: list[tuple[Any, Any]], found: int) -> None:
    """TypeError when the model declares more decoder-layer calls per forward than it has decoder layers.

    transformers says so through the hidden_states OutputRecorder's
    ``num_hidden_layers_key`` (Inkling2Loop: ``total_num_hidden_layers``):
    looped layers run, and route every token, several times per forward,
    and a capture holds one pass per token and layer.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for _, hidden in declarations:
        key = getattr(hidden, "num_hidden_layers_key", None)
        visits = getattr(config, key, None) if isinstance(key, str) else None
        if isinstance(visits, int) and not isinstance(visits, bool) and visits != found:
            raise TypeError(
                f"{type(model).__name__} is not supported: it runs {visits} decoder-layer calls per forward "
                f"(config.{key}) over its {found} decoder layers, so looped layers route every token more than "
                "once per forward, and a capture holds one pass per token and layer"
            )


def find_routing(model: nn.Module) -> Routing:
    """The routers and decoder layers of a transformers model.

    Returns a ``Routing``. Raises ``TypeError`` naming the model's class and
    what is missing when the model declares no router, its routers return no
    chosen ids, a router sits outside the decoder layers, or its decoder
    layers run more than once per forward (looped layers, declared by
    transformers' ``num_hidden_layers_key``); ``ValueError``
    when routers disagree on the number of experts or top_k.
    """
    name = type(model).__name__
    declarations = _declarations(model)
    if not declarations:
        raise TypeError(
            f"{name} is not a supported MoE model: it declares no router "
            "(no 'router_logits' in _can_record_outputs of the model or its submodules)"
        )
    modules = list(model.named_modules())
    layer_classes = tuple(c for _, hidden in declarations for c in _classes(hidden))
    layers = [(path, module) for path, module in modules if layer_classes and isinstance(module, layer_classes)]
    if not layers:
        raise TypeError(f"{name}: no decoder layers found (its hidden_states declaration names none)")
    _refuse_looped_layers(model, declarations, len(layers))
    sites: list[RouterSite] = []
    for recorder, _ in declarations:
        router_classes = _classes(recorder)
        suffix = getattr(recorder, "layer_name", None)
        for path, module in modules:
            if not isinstance(module, router_classes) or (suffix and not path.endswith(suffix)):
                continue
            owner = [i for i, (layer_path, _) in enumerate(layers) if path.startswith(layer_path + ".")]
            if not owner:
                raise TypeError(f"{name}: router {path} ({type(module).__name__}) is not inside a decoder layer")
            try:
                with torch.no_grad():
                    output = module.forward(_probe_input(module, model))
            except Exception as exc:  # noqa: BLE001 -- reported as what is missing
                raise TypeError(
                    f"{name} is not supported: router {type(module).__name__} cannot be called on hidden states alone "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            index, top_k, experts, problem = classify_output(
                output, getattr(recorder, "index", 0), type(module).__name__, getattr(module, "top_k", None)
            )
            if problem:
                raise TypeError(f"{name} is not supported: {problem}")
            if index is None:
                top_k = int(getattr(module, "top_k"))
            sites.append(RouterSite(owner[-1], path, module, index, top_k, experts))
    if not sites:
        raise TypeError(f"{name} has no router modules (declared: {', '.join(c.__name__ for r, _ in declarations for c in _classes(r))})")
    sites.sort(key=lambda site: site.layer)
    if len({site.layer for site in sites}) != len(sites):
        raise TypeError(f"{name}: more than one router in a decoder layer ({[site.name for site in sites]})")
    for field in ("num_experts", "top_k"):
        values = {getattr(site, field) for site in sites}
        if len(values) != 1:
            raise ValueError(f"{name}: routers disagree on {field}: {sorted(values)}")
    return Routing(tuple(module for _, module in layers), tuple(sites), sites[0].num_experts, sites[0].top_k)
