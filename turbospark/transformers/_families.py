"""Which model families of the installed transformers ``capture`` supports, computed, not listed by hand.

For every family whose modeling module declares ``router_logits`` in a
``_can_record_outputs`` table, the router class is built from the family's
default config on the ``meta`` device (no memory, no weights) and called
once on a meta tensor; its outputs are classified exactly as ``capture``
classifies a real router's (``classify_output``). Then the family's model is
built on the meta device and put through the checks ``capture`` makes
before it records: ``find_routing`` (decoder layers, one router per layer,
no looped layers) and the pilot probe's wiring (every routed layer's
pre-MoE norm). What only a real forward call can show (that each norm
produces exactly its router's input) ``capture`` checks on the first call;
the table names the layers it will refuse there (post-norm layers, which
have no norm before attention).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Optional

import torch

from turbospark.transformers._routers import classify_output

__all__ = ["Family", "families", "format_families"]


@dataclass(frozen=True)
class Family:
    """One model family: its module name, router class, and what ``capture`` records of it.

    ``problem``: why ``capture`` refuses the family ("" when it records the
    counts and the trace exactly). ``probe``: "" when the pilot probe's
    wiring passes every check made before a forward call, else why the
    probe is refused (or could not be checked). ``checked``: False when the
    default config builds no model, so only the router was checked.
    """

    name: str
    router: str
    problem: str
    probe: str = ""
    checked: bool = True

    @property
    def supported(self) -> bool:
        """Every set-up check of ``capture`` passed: counts and trace are recorded exactly (the probe: see ``probe``)."""
        return not self.problem and self.checked


def _module_names() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    return sorted({model_type_to_module_name(model_type) for model_type in CONFIG_MAPPING_NAMES})


def _declares_router(module_name: str) -> bool:
    # Reading the file first spares importing several hundred modules that
    # cannot declare a router.
    spec = importlib.util.find_spec(f"transformers.models.{module_name}.modeling_{module_name}")
    if spec is None or spec.origin is None:
        return False
    with open(spec.origin, encoding="utf-8") as handle:
        return '"router_logits"' in handle.read()


def _declaration(module: Any) -> Optional[tuple[type, Any]]:
    """(model class, router OutputRecorder) of the first class in ``module`` declaring one."""
    for value in vars(module).values():
        if inspect.isclass(value) and value.__module__ == module.__name__:
            table = value.__dict__.get("_can_record_outputs") or {}
            if "router_logits" in table and getattr(value, "config_class", None) is not None:
                return value, table["router_logits"]
    return None


def _probe(model_class: type, recorder: Any) -> tuple[str, str]:
    router_class = recorder.target_class
    name = getattr(router_class, "__name__", str(router_class))
    config_class = model_class.config_class
    if not isinstance(config_class, type):  # a union of configs: the first is the family's own
        config_class = typing.get_args(config_class)[0]
    errors = []
    try:
        config = config_class()
    except Exception as exc:  # noqa: BLE001
        return name, f"its default config cannot be built ({type(exc).__name__})"
    for candidate in (config, config.get_text_config() if hasattr(config, "get_text_config") else config):
        try:
            with torch.device("meta"):
                router = router_class(candidate)
                output = router.forward(torch.empty(1, int(candidate.hidden_size)))
        except Exception as exc:  # noqa: BLE001 -- any failure means "could not probe"
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        _, _, _, problem = classify_output(output, getattr(recorder, "index", 0), name, getattr(router, "top_k", None))
        return name, problem
    return name, f"router {name} could not be probed from the default config ({errors[-1][:120]})"


def _model_class(module: Any, declaring: type) -> type:
    """The family's model class to build: a causal LM, else a conditional-generation, text or base model."""
    classes = [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and value.__module__ == module.__name__ and issubclass(value, declaring)
        and value is not declaring
    ]
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "TextModel", "Model"):
        for value in classes:
            if value.__name__.endswith(suffix):
                return value
    return declaring


def _config_class(model_class: type) -> type:
    config_class = model_class.config_class
    if not isinstance(config_class, type):  # a union of configs: the first is the family's own
        config_class = typing.get_args(config_class)[0]
    return config_class


def _no_init_weights() -> Any:
    """transformers' own context that skips weight initialisation (a default config's model is built only
    to read its modules: initialising the weights of 61 layers x 256 experts, on the meta device too, is most
    of the time ``families`` takes); where this transformers has none, a context that does nothing."""
    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            return getattr(importlib.import_module(where), "no_init_weights")()
        except (ImportError, AttributeError):
            continue
    return contextlib.nullcontext()


def _model_checks(module: Any, declaring: type) -> tuple[str, str, bool]:
    """(problem, probe verdict, checked) from the family's model built on the meta device."""
    from turbospark.transformers._capture import _plan_probe
    from turbospark.transformers._routers import find_routing

    model_class = _model_class(module, declaring)
    try:
        with torch.device("meta"), _no_init_weights():
            model = model_class(_config_class(model_class)())
    except Exception as exc:  # noqa: BLE001 -- the default config is not always buildable
        return "", f"not checked (its default config builds no {model_class.__name__}: {type(exc).__name__})", False
    try:
        routing = find_routing(model)
    except (TypeError, ValueError) as exc:
        return str(exc), "", True
    try:
        _plan_probe(routing, "self")  # every routed layer's norm, as pilot="next" or "self" needs
    except ValueError as exc:
        return "", f"refused at set-up: {exc}", True
    # Olmo2-style post-norm layers (a post_feedforward_layernorm, no pre-feedforward or input norm): their
    # post_attention_layernorm normalises the attention output, and the MoE block gets the raw residual,
    # which the capture's first-call check refuses.
    post_norm = [
        site.layer
        for site in routing.sites
        if all(hasattr(routing.layers[site.layer], n) for n in ("post_attention_layernorm", "post_feedforward_layernorm"))
        and not any(hasattr(routing.layers[site.layer], n) for n in ("input_layernorm", "pre_feedforward_layernorm"))
    ]
    if post_norm:
        return "", (
            f"refused on the first forward call: decoder layer {post_norm[0]} is post-norm (post_attention_layernorm "
            "normalises the attention output; the MoE block gets the raw residual)"
        ), True
    return "", "", True


def families() -> list[Family]:
    """Every family of the installed transformers that declares a router, with its support verdict."""
    found = []
    for module_name in _module_names():
        if not _declares_router(module_name):
            continue
        try:
            module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        except Exception as exc:  # noqa: BLE001 -- an optional dependency of that family is missing
            found.append(Family(module_name, "?", f"its modeling module does not import ({type(exc).__name__})"))
            continue
        declared = _declaration(module)
        if declared is None:
            continue
        router, problem = _probe(*declared)
        if problem:
            found.append(Family(module_name, router, problem))
            continue
        found.append(Family(module_name, router, *_model_checks(module, declared[0])))
    return found


def format_families(found: list[Family]) -> str:
    """The ``--list`` text: what capture records exactly per family (counts and trace; the probe), then the rest.

    Three sections: families whose model passed every set-up check of
    ``capture`` (counts and trace recorded exactly; the probe's verdict on
    each line), families whose default config builds no model (only the
    router was checked), and the families ``capture`` refuses, with why.
    """
    supported = [f for f in found if f.supported]
    unchecked = [f for f in found if not f.problem and not f.checked]
    others = [f for f in found if f.problem]
    lines = [
        f"supported ({len(supported)} families): counts and trace recorded exactly; "
        "probe yes = pilot= records exactly, else why it is refused:"
    ]
    lines += [f"  {f.name:<24} {f.router:<32} probe: {f.probe or 'yes'}" for f in supported]
    lines.append(
        f"router checked only ({len(unchecked)} families): the router returns its ids, but the default config builds "
        "no model here, so capture() makes the other checks when it starts:"
    )
    lines += [f"  {f.name:<24} {f.router:<32} probe: {f.probe}" for f in unchecked]
    lines.append(f"not supported ({len(others)}):")
    # A refusal can name every router of the model: the line keeps its start.
    lines += [f"  {f.name:<24} {f.problem if len(f.problem) <= 300 else f.problem[:299] + '…'}" for f in others]
    return "\n".join(lines) + "\n"
