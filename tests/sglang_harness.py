"""SGLang 0.5.23's own static dispatch, run on placement files (not a test module).

``load(wheel, directory)`` extracts ``sglang/srt/eplb/expert_location.py`` and
``expert_location_dispatch.py`` from the wheel into ``directory`` and imports
them under their own names, with stub modules for what they import besides
torch: the runtime context (server arguments, parallel layout, device), the
elastic-EP switch and the model loader. ``_a2a_ep_size`` (the rule that sets
ep_size under DeepEP) is taken from the wheel's ``arg_groups/overrides.py``
by its source, as are the two names it uses. Nothing of turbospark's is used:
``Engine.rank_maps`` runs, once per source rank, what each server rank runs at
start-up (``compute_initial_expert_location_metadata``, then per layer
``ExpertLocationDispatchInfo.init_new`` and ``topk_ids_logical_to_physical``).
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
import sys
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np

from wheel_harness import flag_values, restore_modules

EPLB = "sglang/srt/eplb/"
MODULES = ("expert_location", "expert_location_dispatch")
OVERRIDES = "sglang/srt/arg_groups/overrides.py"
SWITCHES = ("--enable-eplb",)  # flags without a value


class Engine:
    """The two eplb modules imported with stubs; ``config`` is what the stubs answer."""

    def __init__(self, modules: dict[str, ModuleType], config: SimpleNamespace, ep_size_rule: Any,
                 saved: dict[str, Any]) -> None:
        self.location, self.dispatch = modules["expert_location"], modules["expert_location_dispatch"]
        self.config, self.ep_size_rule, self._saved = config, ep_size_rule, saved

    def close(self) -> None:
        """Put ``sys.modules`` back as it was."""
        restore_modules(self._saved)

    def serve(self, flags: str, num_layers: int, num_experts: int) -> None:
        """Set the server arguments from SGLang command-line ``flags`` (the ones turbospark prints),
        ep_size then adjusted by SGLang's own rule for the all-to-all backend."""
        words = shlex.split(flags)
        switches = {w[2:].replace("-", "_") for w in words if w in SWITCHES}
        given = flag_values(" ".join(w for w in words if w not in SWITCHES))
        moe, parallel = self.config.moe, self.config.parallel
        moe.enable_eplb = "enable_eplb" in switches
        moe.ep_dispatch_algorithm = given.pop("ep_dispatch_algorithm", "static")
        moe.eplb_rebalance_num_iterations = int(given.pop("eplb_rebalance_num_iterations", 1000))
        # Unset, SGLang takes the rebalance interval (arg_groups/parallel_hook.py, 805-811).
        moe.expert_distribution_recorder_buffer_size = int(given.pop("expert_distribution_recorder_buffer_size",
                                                                     moe.eplb_rebalance_num_iterations))
        parallel.tp_size = int(given.pop("tp_size", None) or given.pop("tp", 1))  # --tp: argparse's abbreviation
        parallel.ep_size = int(given.pop("ep_size", 1))
        parallel.nnodes = int(given.pop("nnodes", 1))
        moe.moe_a2a_backend = given.pop("moe_a2a_backend", "none")
        moe.ep_num_redundant_experts = int(given.pop("ep_num_redundant_experts", 0))
        moe.init_expert_location = given.pop("init_expert_location", "trivial")
        if given:
            raise ValueError(f"flags this harness does not model: {sorted(given)}")
        view = SimpleNamespace(moe_a2a_backend=moe.moe_a2a_backend, ep_size=parallel.ep_size, tp_size=parallel.tp_size)
        parallel.ep_size = self.ep_size_rule(view).get("ep_size", parallel.ep_size)
        self.config.hf = SimpleNamespace(num_layers=num_layers, num_experts=num_experts)

    def rank_maps(self) -> np.ndarray:
        """(ranks, layers, E): the physical slot each source rank's static dispatch sends each
        logical expert to, every rank computing its own metadata from the file as it starts."""
        model_config = SimpleNamespace(hf_config=self.config.hf)
        torch = sys.modules["torch"]
        experts = self.config.hf.num_experts
        out = []
        for rank in range(self.config.parallel.ep_size):
            self.config.resources.expert_location_metadata = None
            metadata = self.location.compute_initial_expert_location_metadata(model_config, moe_ep_rank=rank)
            self.location.set_global_expert_location_metadata(metadata)
            rows = []
            for layer in range(self.config.hf.num_layers):
                info = self.dispatch.ExpertLocationDispatchInfo.init_new(layer)
                ids = torch.arange(experts, dtype=torch.int64).view(-1, 1)
                rows.append(self.dispatch.topk_ids_logical_to_physical(ids, info).view(-1).tolist())
            out.append(rows)
        return np.array(out, dtype=np.int64)


def gpu_loads(maps: np.ndarray, sent: np.ndarray, slots: int) -> np.ndarray:
    """(layers, G) tokens per GPU: rank g sends ``sent[g, layer, e]`` to the GPU of ``maps[g, layer, e]``."""
    ranks, layers, _ = maps.shape
    per_gpu = slots // ranks
    loads = np.zeros((layers, ranks))
    for g in range(ranks):
        for layer in range(layers):
            np.add.at(loads[layer], maps[g, layer] // per_gpu, sent[g, layer])
    return loads


def load(wheel: str, directory: Path) -> Engine:
    """Extract and import the wheel's eplb modules with stubs (module docstring)."""
    return load_modules(wheel, directory, MODULES)[0]


def load_modules(wheel: str, directory: Path, modules: tuple[str, ...],
                 extend: Optional[Callable[[dict[str, ModuleType], SimpleNamespace], None]] = None
                 ) -> tuple[Engine, dict[str, ModuleType]]:
    """``load`` of ``modules`` (under ``sglang.srt.eplb``; a package by its name, its files extracted
    beside it, listed before the modules that import it): ``extend(stubs, config)`` adds stubs before
    they are imported. Returns the engine and every module imported, by name."""
    tops = {m.split(".")[0] for m in modules}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            relative = name[len(EPLB):]
            if name.startswith(EPLB) and name.endswith(".py") and relative.split("/")[0].removesuffix(".py") in tops:
                target = directory / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
        overrides = archive.read(OVERRIDES).decode()
    config = SimpleNamespace(
        moe=SimpleNamespace(ep_dispatch_algorithm="static", moe_a2a_backend="none", ep_join_mode="none",
                            ep_num_redundant_experts=0, init_expert_location="trivial", eplb_algorithm="auto"),
        parallel=SimpleNamespace(ep_size=1, tp_size=1, nnodes=1, elastic_ep_initial_size=None, ep_join_rank_offset=0),
        device=SimpleNamespace(device="cpu"),
        resources=SimpleNamespace(expert_location_metadata=None),
        hf=None,
    )
    stubs: dict[str, ModuleType] = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.eplb", "sglang.srt.elastic_ep"):
        stubs[name] = ModuleType(name)
        stubs[name].__path__ = []  # a package: submodules come from sys.modules
    context = stubs["sglang.srt.runtime_context"] = ModuleType("sglang.srt.runtime_context")
    context.get_exec = lambda: SimpleNamespace(moe=config.moe)
    context.get_parallel = lambda: config.parallel
    context.get_device = lambda: config.device
    context.get_resources = lambda: config.resources
    elastic = stubs["sglang.srt.elastic_ep.elastic_ep"] = ModuleType("sglang.srt.elastic_ep.elastic_ep")
    elastic.elastic_expanded_world_enabled = lambda: False
    loader = stubs["sglang.srt.model_loader"] = ModuleType("sglang.srt.model_loader")

    class Architecture:
        @staticmethod
        def get_model_config_for_expert_location(hf: Any) -> Any:
            location = sys.modules["sglang.srt.eplb.expert_location"]
            return location.ModelConfigForExpertLocation(num_layers=hf.num_layers, num_logical_experts=hf.num_experts,
                                                         num_groups=getattr(hf, "num_groups", None))

    loader.get_model_architecture = lambda model_config: (Architecture, "Architecture")
    if extend is not None:
        extend(stubs, config)
    names = list(stubs) + [f"sglang.srt.eplb.{name}" for name in modules]
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(stubs)
    imported = {}
    for name in modules:
        path = directory / (name.replace(".", "/") + ".py")
        package = not path.is_file()
        path = directory / name.replace(".", "/") / "__init__.py" if package else path
        spec = importlib.util.spec_from_file_location(f"sglang.srt.eplb.{name}", path,
                                                      submodule_search_locations=[str(path.parent)] if package else None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        imported[name] = module
    saved.update({name: None for name in sys.modules if name.startswith("sglang.") and name not in saved})
    return Engine(imported, config, _ep_size_rule(overrides), saved), imported


def _ep_size_rule(source: str) -> Any:
    """SGLang's ``_a2a_ep_size`` and the set of backends it reads, compiled from their own source."""
    tree = ast.parse(source)
    wanted = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "_a2a_ep_size":
            node.decorator_list = []
            wanted.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_A2A_EP_SPANNING_BACKENDS"
                                                  for t in node.targets):
            wanted.append(node)
    if len(wanted) != 2:
        raise RuntimeError(f"{OVERRIDES}: _a2a_ep_size or _A2A_EP_SPANNING_BACKENDS not found")
    namespace: dict[str, Any] = {"Any": Any, "logger": SimpleNamespace(info=lambda *a, **k: None)}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), OVERRIDES, "exec"), namespace)
    return namespace["_a2a_ep_size"]
