"""What the plugin refuses, and why: each refusal names the setting that causes it and how to change it.

Every refusal happens when the worker loads the model, before the engine
serves a request: a capture must never be silently empty or partial.
"""

from __future__ import annotations

from typing import Any

from turbospark.recording import _env

__all__ = ["OFF", "Refused", "check_engine", "check_layer"]

OFF = f"or unset {_env.HIST} to run without recording"


class Refused(RuntimeError):
    """A vLLM setup the plugin cannot record exactly."""


def check_engine(worker: Any) -> None:
    """Raise ``Refused`` for a runner, decoding mode or parallel layout the plugin cannot record exactly."""
    config = worker.vllm_config
    if getattr(worker, "use_v2_model_runner", False):
        raise Refused(
            "turbospark: vLLM's V2 model runner is in use (VLLM_USE_V2_MODEL_RUNNER, the default on GPUs with "
            "Triton): the plugin reads each step's token order from the V1 runner, so it cannot tag the V2 "
            f"runner's rows; set VLLM_USE_V2_MODEL_RUNNER=0, {OFF}"
        )
    if getattr(config, "speculative_config", None) is not None:
        raise Refused(
            "turbospark: speculative decoding is on (speculative_config): the target model routes every draft "
            "token, accepted or not, so rejected drafts would be recorded as passes; run without "
            f"--speculative-config, {OFF}"
        )
    parallel = config.parallel_config
    pipeline = int(getattr(parallel, "pipeline_parallel_size", 1))
    if pipeline > 1:
        raise Refused(
            f"turbospark: pipeline_parallel_size={pipeline}: each stage routes only its own layers and the "
            f"plugin writes whole-model captures; use pipeline_parallel_size=1, {OFF}"
        )
    prefill = int(getattr(parallel, "prefill_context_parallel_size", 1))
    if prefill > 1:
        raise Refused(
            f"turbospark: prefill_context_parallel_size={prefill}: each prefill context-parallel rank routes its own "
            f"share of a prompt's tokens, while the plugin tags a step's rows from the whole step's requests; use "
            f"prefill_context_parallel_size=1 (--prefill-context-parallel-size), {OFF}"
        )
    data = int(getattr(parallel, "data_parallel_size", 1))
    if data > 1 and getattr(parallel, "use_sequence_parallel_moe", False):
        raise Refused(
            f"turbospark: sequence-parallel MoE is on (enable_expert_parallel with "
            f"tensor_parallel_size={parallel.tensor_parallel_size}, data_parallel_size={data} and "
            f"all2all_backend={parallel.all2all_backend!r}): each tensor-parallel rank routes its own share of the "
            f"step's tokens and only TP rank 0 records; use tensor_parallel_size=1 or drop --enable-expert-parallel, "
            f"{OFF}"
        )
    if data > 1 and getattr(parallel, "use_ubatching", False):
        raise Refused(
            f"turbospark: micro-batching is on (enable_dbo={parallel.enable_dbo}, ubatch_size={parallel.ubatch_size}) "
            f"with data_parallel_size={data}: each micro-batch routes its share of a step separately and writes the "
            f"same rows, which only the last one's would hold; run without --enable-dbo and --ubatch-size, {OFF}"
        )


def check_layer(module: Any, index: int) -> None:
    """Raise ``Refused`` for an MoE layer whose ids never reach ``BaseRouter.capture_fn``."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    if getattr(module, "is_monolithic", False):
        kernel = type(getattr(module.routed_experts, "quant_method", None)).__name__
        raise Refused(
            f"turbospark: MoE layer {index} runs a monolithic kernel ({kernel}: FlashInfer/TRT-LLM MoE on GPUs, "
            "zentorch or int4 CPU experts) that routes inside the kernel and never calls capture_fn; choose a "
            f"modular MoE backend (moe_backend / --moe-backend, or an unquantized checkpoint), {OFF}"
        )
    router = getattr(module, "router", None)
    if not isinstance(router, BaseRouter):
        raise Refused(
            f"turbospark: MoE layer {index} routes with {type(router).__name__}, which is not a BaseRouter "
            f"and offers no capture_fn; {OFF}"
        )
