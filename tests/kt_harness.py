"""KTransformers' own GPU-expert code, run on CPU from its wheels (not a test module).

``load(directory, workdir)`` finds ``kt_kernel-0.7.2-*.whl`` and
``sglang_kt-0.7.2-*.whl`` in ``directory`` (``pip download --no-deps
kt-kernel==0.7.2 sglang-kt==0.7.2``), extracts kt-kernel's
``kt_kernel/experts_base.py`` (``generate_gpu_experts_masks``) and
sglang-kt's ``sglang/srt/layers/moe/kt_ep_wrapper.py`` (the strategies and
``_init_kt_gpu_experts_masks``, which reads ``--init-expert-location``) into
``workdir`` and imports them under their own names, with stub modules for
what they import besides torch: kt-kernel's compiled extension and MoE
wrapper class, and sglang's tensor-parallel layout (rank 0 of 1), config
constants, quantisation base class, marlin helper, utils and the
quant-method registry. Nothing of turbospark's is used: ``Engine.masks``
runs what a server runs at start-up from its command-line flags.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from wheel_harness import flag_values, restore_modules

KT_KERNEL = "kt_kernel/experts_base.py"
SGLANG_KT = "sglang/srt/layers/moe/kt_ep_wrapper.py"
_STUBBED = ("kt_kernel", "kt_kernel.kt_kernel_ext", "kt_kernel.experts_base", "sglang", "sglang.srt",
            "sglang.srt.configs", "sglang.srt.configs.glm5_next", "sglang.srt.distributed", "sglang.srt.layers",
            "sglang.srt.layers.quantization", "sglang.srt.layers.quantization.base_config",
            "sglang.srt.layers.quantization.marlin_utils", "sglang.srt.utils", "sglang.srt.layers.moe",
            "sglang.srt.layers.moe.quant_method_registry", "sglang.srt.layers.moe.kt_ep_wrapper")


def wheels(directory: str) -> tuple[Path, Path]:
    """The kt-kernel and sglang-kt 0.7.2 wheels in ``directory``; raises ``FileNotFoundError``."""
    found = []
    for pattern in ("kt_kernel-0.7.2-*.whl", "sglang_kt-0.7.2-*.whl"):
        hits = sorted(Path(directory).glob(pattern))
        if not hits:
            raise FileNotFoundError(f"no {pattern} in {directory}")
        found.append(hits[0])
    return found[0], found[1]


class Engine:
    """The two engine modules, imported with stubs."""

    def __init__(self, experts_base: ModuleType, wrapper: ModuleType, saved: dict[str, Any]) -> None:
        self.experts_base, self.wrapper, self._saved = experts_base, wrapper, saved

    def close(self) -> None:
        """Put ``sys.modules`` back as it was."""
        restore_modules(self._saved)

    def masks(self, flags: str, num_hidden_layers: int, num_experts: int, first_k_dense_replace: int = 0) -> Any:
        """sglang-kt's ``_init_kt_gpu_experts_masks`` for a model of that geometry, started with
        the command-line ``flags`` (the ones turbospark prints): the (H, E) bool tensor it keeps."""
        given = flag_values(flags)
        hf = SimpleNamespace(num_hidden_layers=num_hidden_layers, num_experts=num_experts,
                             first_k_dense_replace=first_k_dense_replace, moe_layer_freq=1)
        args = SimpleNamespace(
            get_hf_config=lambda: hf,
            kt_gpu_experts_ratio=float(given.pop("kt_gpu_experts_ratio")) if "kt_gpu_experts_ratio" in given else None,
            kt_num_gpu_experts=int(given.pop("kt_num_gpu_experts")) if "kt_num_gpu_experts" in given else None,
            kt_expert_placement_strategy=given.pop("kt_expert_placement_strategy", "uniform"),
            init_expert_location=given.pop("init_expert_location", None),
        )
        if given:
            raise ValueError(f"flags this harness does not model: {sorted(given)}")
        self.wrapper._KT_GPU_EXPERTS_MASKS = None  # the engine caches the first answer per process
        return self.wrapper._init_kt_gpu_experts_masks(args)


def _module(name: str, **attrs: Any) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # every stub may be a package: its submodules resolve from sys.modules
    return module


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(directory: str, workdir: Path) -> Engine:
    """Import the engine modules from the wheels in ``directory``, extracted under ``workdir``."""
    kt_wheel, sglang_wheel = wheels(directory)
    paths = {}
    for wheel, member in ((kt_wheel, KT_KERNEL), (sglang_wheel, SGLANG_KT)):
        with zipfile.ZipFile(wheel) as archive:
            target = workdir / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
            paths[member] = target
    saved = {name: sys.modules.get(name) for name in _STUBBED}
    try:
        kt = _module("kt_kernel")
        sys.modules["kt_kernel"] = kt
        sys.modules["kt_kernel.kt_kernel_ext"] = kt.kt_kernel_ext = _module("kt_kernel.kt_kernel_ext")
        experts_base = _import("kt_kernel.experts_base", paths[KT_KERNEL])
        kt.generate_gpu_experts_masks = experts_base.generate_gpu_experts_masks
        kt.KTMoEWrapper = type("KTMoEWrapper", (), {})
        stubs = {
            "sglang": {}, "sglang.srt": {}, "sglang.srt.configs": {},
            "sglang.srt.configs.glm5_next": {"GLM5_NEXT_SUPPORTED_TP_SIZES": (1,)},
            "sglang.srt.distributed": {"get_tensor_model_parallel_rank": lambda: 0,
                                       "get_tensor_model_parallel_world_size": lambda: 1,
                                       "get_tp_group": lambda: None},
            "sglang.srt.layers": {}, "sglang.srt.layers.quantization": {},
            "sglang.srt.layers.quantization.base_config": {"FusedMoEMethodBase": type("FusedMoEMethodBase", (), {})},
            "sglang.srt.layers.quantization.marlin_utils": {"marlin_permute_scales": lambda *a, **k: None},
            "sglang.srt.utils": {"get_compiler_backend": lambda: "eager", "is_cuda": lambda: False},
            "sglang.srt.layers.moe": {},
            "sglang.srt.layers.moe.quant_method_registry": {"register_moe_quant_wrapper": lambda *a, **k: None},
        }
        for name, attrs in stubs.items():
            sys.modules[name] = _module(name, **attrs)
        wrapper = _import("sglang.srt.layers.moe.kt_ep_wrapper", paths[SGLANG_KT])
    except BaseException:
        Engine(None, None, saved).close()  # type: ignore[arg-type]
        raise
    return Engine(experts_base, wrapper, saved)

