"""SGLang 0.5.23's whole EPLB loop from its wheel, rank by rank, on CPU (not a test module).

``load(wheel, directory)`` imports, besides ``sglang_harness``'s two modules, the wheel's
``eplb_algorithms`` package (the rebalance algorithms), ``expert_distribution.py`` (the
recorder and its circular buffer) and ``eplb_manager.py`` (the loop), with stubs for
what they import besides torch: the runtime context, the environment switches
(all off), ``einops`` and the metrics collector (used only when balancedness is
reported, off by default), the forward batch (a placeholder: nothing of it is
read on CUDA-less, non-ROCm hosts), the elastic-EP manager (none), the LPLB
solvers (static dispatch has none) and the expert-location updater: its
``update`` is the wheel's lines 61-76 without moving weights (the metadata's own
``update`` does the rest). ``Withable`` is compiled from the wheel's
``utils/common.py`` by its source. torch's ``distributed.get_rank`` answers the
rank being driven, ``distributed.all_reduce`` leaves a tensor as it is (each
rank's recorder is given every rank's ids: the sum the all-reduce would make),
and ``torch.cpu.empty_cache`` is a no-op (CUDA's, called at the first dump).

``Loop.run`` drives G ranks as G server processes run, a step at a time: each rank
maps its tokens through its own static dispatch (``ExpertLocationDispatchInfo``,
``topk_ids_logical_to_physical``), each rank's recorder records the step
(``with_forward_pass``, ``with_current_layer``, ``on_select_experts`` with every
rank's physical ids), then each rank's ``EPLBManager.on_forward_pass_end`` runs,
which at its schedule dumps the recorder, runs ``init_by_eplb`` and updates the
metadata. Nothing of turbospark's is used.
"""

from __future__ import annotations

import ast
import contextlib
import math
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Generic, Optional, TypeVar

import numpy as np

import sglang_harness

MODULES = ("expert_location", "expert_location_dispatch", "eplb_algorithms", "expert_distribution", "eplb_manager")
COMMON = "sglang/srt/utils/common.py"


class _Switches:
    """``envs``: every environment switch reads False."""

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(get=lambda: False)


class _Updater:
    """``ExpertLocationUpdater.update`` without moving weights; records each update as (step, map)."""

    def __init__(self, loop: "Loop") -> None:
        self._loop = loop

    def update(self, routed_experts_weights_of_layer: Any, new_expert_location_metadata: Any,
               update_layer_ids: list[int], nnodes: int, rank: int, use_flat_topology: bool = False) -> dict:
        location = self._loop.modules["expert_location"]
        old = location.get_global_expert_location_metadata()
        old.update(new_expert_location_metadata, update_layer_ids=update_layer_ids)
        self._loop.updates.append((self._loop.step, rank, new_expert_location_metadata.physical_to_logical_map.tolist()))
        return {}


def _extend(wheel: str) -> Any:
    def extend(stubs: dict[str, ModuleType], config: SimpleNamespace) -> None:
        for name in ("sglang.srt.model_executor", "sglang.srt.observability", "sglang.srt.layers",
                     "sglang.srt.model_executor.model_runner_components"):
            stubs[name] = ModuleType(name)
            stubs[name].__path__ = []
        context = stubs["sglang.srt.runtime_context"]
        context.get_platform = lambda: SimpleNamespace(is_hip=False)
        context.get_schedule = lambda: SimpleNamespace(chunked_prefill_size=8192)
        context.logs_expert_balancedness_to_server_log = lambda: False
        context.reports_expert_balancedness = lambda: False
        context.get_model = lambda: None
        stubs["einops"] = ModuleType("einops")
        environ = stubs["sglang.srt.environ"] = ModuleType("sglang.srt.environ")
        environ.envs = _Switches()
        batch = stubs["sglang.srt.model_executor.forward_batch_info"] = ModuleType("forward_batch_info")
        batch.ForwardBatch = SimpleNamespace
        batch.ForwardMode = SimpleNamespace(EXTEND="extend", SPLIT_PREFILL="split_prefill")
        metrics = stubs["sglang.srt.observability.metrics_collector"] = ModuleType("metrics_collector")
        metrics.STAT_LOGGER_ROLE_EXPERT_DISPATCH = "expert_dispatch"
        metrics.ExpertDispatchCollector = object
        metrics.resolve_collector_class = lambda role, default: default
        utils = stubs["sglang.srt.utils"] = ModuleType("sglang.srt.utils")
        utils.Withable = _withable(wheel)
        utils.get_device = lambda: "cpu"
        utils.get_int_env_var = lambda name, default=0: default
        stubs["sglang.srt.layers.moe"] = ModuleType("sglang.srt.layers.moe")
        stubs["sglang.srt.layers.moe"].get_moe_a2a_backend = lambda: SimpleNamespace(is_megamoe=lambda: False)
        stubs["sglang.srt.elastic_ep.elastic_ep"].ElasticEPStateManager = SimpleNamespace(instance=lambda: None)
        updater = stubs["sglang.srt.eplb.expert_location_updater"] = ModuleType("expert_location_updater")
        updater.ExpertLocationUpdater = _Updater
        setup = stubs["sglang.srt.model_executor.model_runner_components.moe_ep_setup"] = ModuleType("moe_ep_setup")
        setup.init_lplb_solvers = lambda **kwargs: None
        config.moe.__dict__.update(expert_distribution_recorder_mode="stat", deepep_mode="normal",
                                   eplb_rebalance_layers_per_chunk=None, eplb_min_rebalancing_utilization_threshold=1.0,
                                   elastic_ep_backend=None, expert_balancedness_report_mode="off")
        config.parallel.tp_rank = 0

    return extend


def _withable(wheel: str) -> Any:
    """The wheel's ``Withable``, compiled from its source."""
    with zipfile.ZipFile(wheel) as archive:
        tree = ast.parse(archive.read(COMMON).decode())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Withable"]
    namespace: dict[str, Any] = {"Generic": Generic, "T": TypeVar("T"), "Optional": Optional,
                                 "contextmanager": contextlib.contextmanager}
    exec(compile(ast.Module(body=[node], type_ignores=[]), COMMON, "exec"), namespace)
    return namespace["Withable"]


class Loop:
    """The loaded modules, and G ranks driven through SGLang's EPLB loop (module docstring)."""

    def __init__(self, wheel: str, directory: Path) -> None:
        import torch

        self.engine, self.modules = sglang_harness.load_modules(wheel, directory, MODULES, _extend(wheel))
        self.updates: list[tuple[int, int, list[list[int]]]] = []
        self.step = -1
        self._rank = 0
        self._torch = torch
        self._patched = [(torch.distributed, "get_rank", getattr(torch.distributed, "get_rank")),
                         (torch.distributed, "all_reduce", getattr(torch.distributed, "all_reduce")),
                         (torch.cpu, "empty_cache", getattr(torch.cpu, "empty_cache", None))]
        torch.distributed.get_rank = lambda *args, **kwargs: self._rank
        torch.distributed.all_reduce = lambda tensor, *args, **kwargs: None
        torch.cpu.empty_cache = lambda: None

    def close(self) -> None:
        """Put torch and ``sys.modules`` back as they were."""
        for owner, name, value in self._patched:
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self.engine.close()

    def _become(self, rank: int, resources: SimpleNamespace) -> None:
        self._rank = rank
        self.engine.config.resources = resources
        self.engine.config.parallel.tp_rank = rank

    def run(self, flags: str, passes: list[np.ndarray], batch: int, dense: int, num_experts: int,
            groups: Optional[int] = None) -> tuple[list[Optional[float]], list[tuple[int, list[list[int]]]]]:
        """Serve ``flags`` (SGLang's command line) for a model of ``dense`` dense layers, then one per
        entry of ``passes`` ((P, K) logical ids), ``groups`` expert groups; every rank routes the same
        ``batch`` passes a step. Returns per step (sum over MoE layers of the busiest GPU's tokens - of
        the mean) / of the mean, None without tokens, and each rearrangement as (step, MoE rows of the
        map), every rank having installed the same map."""
        torch = self._torch
        location, dispatch = self.modules["expert_location"], self.modules["expert_location_dispatch"]
        recording, managing = self.modules["expert_distribution"], self.modules["eplb_manager"]
        layers = len(passes)
        self.engine.serve(flags, dense + layers, num_experts)
        config = self.engine.config
        config.hf.num_groups = groups
        assert config.moe.enable_eplb
        gpus = config.parallel.ep_size
        model_config = SimpleNamespace(hf_config=config.hf)
        model = SimpleNamespace(routed_experts_weights_of_layer={dense + layer: [] for layer in range(layers)})
        ranks = []
        self.updates, self.step = [], -1
        for rank in range(gpus):
            resources = SimpleNamespace(expert_location_metadata=None, expert_distribution_recorder=None)
            self._become(rank, resources)
            metadata = location.compute_initial_expert_location_metadata(model_config, moe_ep_rank=rank)
            location.set_global_expert_location_metadata(metadata)
            recording.set_global_expert_distribution_recorder(
                recording.ExpertDistributionRecorder.init_new(metadata, rank))
            updater = _Updater(self)
            manager = managing.EPLBManager(
                model_config=model_config, get_model=lambda: model, get_expert_location_updater=lambda u=updater: u,
                get_expert_backup_client=lambda: None,
                get_weight_updater=lambda: SimpleNamespace(update_weights_from_disk=None))
            ranks.append((resources, manager))
        per_gpu = (num_experts + config.moe.ep_num_redundant_experts) // gpus
        width = [p.shape[1] for p in passes]
        series: list[Optional[float]] = []
        for step in range(math.ceil(max(p.shape[0] for p in passes) / batch)):
            self.step = step
            rows = [torch.tensor(p[step * batch:(step + 1) * batch], dtype=torch.int64).view(-1, w)
                    for p, w in zip(passes, width)]
            physical = []
            for rank, (resources, _) in enumerate(ranks):
                self._become(rank, resources)
                physical.append([dispatch.topk_ids_logical_to_physical(
                    ids, dispatch.ExpertLocationDispatchInfo.init_new(dense + layer)) for layer, ids in enumerate(rows)])
            busiest = mean = 0.0
            for layer in range(layers):
                sent = torch.cat([physical[rank][layer].flatten() for rank in range(gpus)]).numpy()
                loads = np.bincount(sent // per_gpu, minlength=gpus)
                busiest += float(loads.max())
                mean += float(loads.sum()) / gpus
            series.append(None if mean == 0 else (busiest - mean) / mean)
            for rank, (resources, manager) in enumerate(ranks):
                self._become(rank, resources)
                recorder = recording.get_global_expert_distribution_recorder()
                with recorder.with_forward_pass(step, SimpleNamespace()):
                    for layer in range(layers):
                        with recorder.with_current_layer(dense + layer):
                            for source in range(gpus):
                                recorder.on_select_experts(topk_ids=physical[source][layer])
                manager.on_forward_pass_end()
        done: list[tuple[int, list[list[int]]]] = []
        for step, rank, phy2log in self.updates:
            if rank == 0:
                done.append((step, phy2log[dense:]))
            else:
                assert (step, phy2log[dense:]) == done[-1], "the ranks installed different maps"
        assert len(self.updates) == gpus * len(done)
        return series, done
