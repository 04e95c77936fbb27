"""Which model families of the installed transformers ``capture`` supports, computed, not listed by hand.

For every family whose modeling module declares ``router_logits`` in a
``_can_record_outputs`` table, the router class is built from the family's
default config on the ``meta`` device (no memory, no weights) and called
once on a meta tensor; its outputs are classified exactly as ``capture``
classifies a real router's (``classify_output``).
"""

from __future__ import annotations

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
    """One model family: its module name, router class, and why it is unsupported ("" when supported)."""

    name: str
    router: str
    problem: str

    @property
    def supported(self) -> bool:
        return not self.problem


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
        found.append(Family(module_name, router, problem))
    return found


def format_families(found: list[Family]) -> str:
    """The ``--list`` text: supported families, then the others with the reason."""
    supported = [f for f in found if f.supported]
    others = [f for f in found if not f.supported]
    lines = [f"supported ({len(supported)} families; transformers discovers the router, capture reads its ids):"]
    lines += [f"  {f.name:<24} {f.router}" for f in supported]
    lines.append(f"not supported ({len(others)}):")
    lines += [f"  {f.name:<24} {f.problem}" for f in others]
    return "\n".join(lines) + "\n"
