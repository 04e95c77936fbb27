"""One worker's recording: the refusals, the routers bound to the static buffer, the hand-over after each step.

``attach(worker)`` runs right after ``Worker.load_model``, before vLLM
profiles, compiles or captures anything, so every graph it builds writes
the ids into the static buffer. ``Session.after_step`` runs after
``Worker.execute_model``, outside every compiled region: it tags the rows
the step wrote from the step's ``SchedulerOutput`` and the runner's request
order, and hands them to the recorder (``_handover``: read at once on a CPU
worker, staged on the device without a host sync on any other).

The recorder is made at the first step that schedules tokens: until then
nothing is written, so an engine that fails after ``load_model`` (too
little KV cache, a failed warm-up) or never steps leaves an existing
capture, and its streamed trace, as they were, and says so on stderr.
``Session.close`` (the worker's ``shutdown``: an in-process engine deleted,
a worker process ending) writes the capture then, not at some later
garbage collection, and takes it out of the signal handlers' writes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional

import torch

from turbospark.recording import _env, _paths
from turbospark.recording.durable import _lifecycle

from . import _checks, _data_parallel, _signals
from ._buffer import StaticBuffer
from ._handover import DeviceStaging, Direct, choose, unwritten_marker
from ._recorder import VllmRecorder
from ._requests import RequestTable

__all__ = ["COMPILE_FACTOR", "DEFAULT_CHECKPOINT", "Session", "attach"]

# Seconds between checkpoints when TURBOSPARK_ROUTER_HIST_CHECKPOINT is unset:
# `vllm serve` SIGKILLs its workers on SIGTERM (--shutdown-timeout 0), so a
# capture written only at exit would be lost whole.
DEFAULT_CHECKPOINT = 60.0
# The key the plugin adds to vLLM's additional_config, which vLLM hashes into
# its compile-cache directory: a graph compiled without the hook (which never
# writes the buffer) is never loaded with it, nor the reverse.
COMPILE_FACTOR = "turbospark_router_capture"
# Seconds without a step after which a capture holding new rows is written:
# an engine gone idle has a complete capture on disk, whatever kills it next
# (vLLM's Ctrl-C force-kills its workers moments after signalling them).
IDLE_WRITE = 0.5
_CAPTURE_VERSION = 1

_pilot_warned = False


def _warn_pilot() -> None:
    global _pilot_warned
    if not _pilot_warned:
        _pilot_warned = True
        warnings.warn(
            f"{_env.PILOT} is set, but the vLLM plugin does not run the pilot probe (vLLM fuses the pre-MoE norm "
            "with the residual add, so the probe cannot be run exactly there); recording without predictions",
            RuntimeWarning,
            stacklevel=2,
        )


def _moe_layers(model: Any) -> list[tuple[int, Any]]:
    """(decoder layer index, MoE runner module) for every routed layer of the model, in layer order."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import MoERunnerInterface

    found = [(int(m.layer_id), m) for m in model.modules() if isinstance(m, MoERunnerInterface)]
    return sorted(found, key=lambda pair: pair[0])


def _mark_compile_cache(config: Any) -> None:
    extra = config.additional_config
    if not isinstance(extra, dict):
        raise _checks.Refused(
            f"turbospark: additional_config is a {type(extra).__name__}, not a dict: the plugin keys vLLM's "
            f"compile cache through it (so a graph compiled without the capture hook is never reused with it); "
            f"pass additional_config as a dict, or unset {_env.HIST}"
        )
    extra[COMPILE_FACTOR] = _CAPTURE_VERSION


def attach(worker: Any) -> Optional["Session"]:
    """Start recording in this worker, or None when this rank does not record (or the model routes nothing).

    Raises ``_checks.Refused`` naming the setting for an engine the plugin cannot record exactly.
    """
    _checks.check_engine(worker)
    config = worker.vllm_config
    model_config = config.model_config
    num_layers = int(model_config.get_total_num_hidden_layers())
    num_experts = int(model_config.get_num_experts())
    top_k = int(model_config.get_num_experts_per_tok())
    if num_experts == 0:
        return None
    layers = _moe_layers(worker.model_runner.get_model())
    if not layers:
        raise _checks.Refused(
            f"turbospark: the model config declares {num_experts} experts, but the loaded model has no MoE layer "
            f"with a router vLLM exposes; unset {_env.HIST}"
        )
    for index, module in layers:
        _checks.check_layer(module, index)
    # Every rank keys its compile cache the same way, recording or not.
    _mark_compile_cache(config)
    from vllm.distributed import get_tensor_model_parallel_rank

    # Tensor-parallel ranks route the same tokens: the first one records.
    if get_tensor_model_parallel_rank() != 0:
        return None
    dp = int(getattr(config.parallel_config, "data_parallel_size", 1))
    device = torch.device(worker.device) if getattr(worker, "device", None) is not None else torch.device("cpu")
    # Refused before anything is written: a refused engine leaves no capture behind.
    staging = choose(device, os.environ)
    gathered = _gathered(layers) if staging == "device" and dp > 1 else False
    env = _env.config_from_env(num_layers)
    assert env is not None  # register() installed the hooks only with TURBOSPARK_ROUTER_HIST set
    given: frozenset[str] = frozenset()
    if env.pilot is not None:
        _warn_pilot()
        env = dataclasses.replace(env, pilot=None)
    if env.checkpoint is None:
        env = dataclasses.replace(env, checkpoint=DEFAULT_CHECKPOINT)
    step_tokens = int(config.scheduler_config.max_num_batched_tokens)
    buffer = StaticBuffer(len(layers), step_tokens * max(dp, 1), top_k, device, step_tokens)
    for slot, (_, module) in enumerate(layers):
        module.router.set_capture_fn(buffer.capture_fn(slot))
    # The handlers now, on the main thread (vLLM's are in place); the recorder joins them at the first step.
    _signals.install()
    # Made at the first step: an engine that fails after load_model (or never steps) leaves an existing
    # capture, and its streamed trace, as they were.
    start = functools.partial(VllmRecorder.from_config, env, num_layers, num_experts, top_k, given=given)
    return Session(start, _paths.per_process(env.path), buffer, [index for index, _ in layers], worker, dp, staging,
                   gathered)


def _gathered(layers: list[tuple[int, Any]]) -> bool:
    """Whether a data-parallel rank's routers see every rank's rows (naive dispatch before routing).

    The device hand-over places a step's rows before it can read their counts,
    so every layer must agree; raises ``_checks.Refused`` when they do not.
    """
    kinds = {index: bool(getattr(module, "do_naive_dispatch_combine", False)) for index, module in layers}
    if len(set(kinds.values())) > 1:
        gathering = [index for index, naive in kinds.items() if naive]
        raise _checks.Refused(
            f"turbospark: with data parallelism the MoE layers {gathering} gather every rank's tokens before routing "
            f"and the others route their own: the device hand-over places a step's rows before it reads their "
            f"counts, so it needs one layout for every layer; use one MoE kernel for all layers, {_checks.OFF}")
    return any(kinds.values())  # one layout for all (none: no layer gathers)


class Session:
    """A worker's static buffer and request table, and from its first step the recorder and hand-over;
    ``after_step`` is its one per-step call, ``close`` its end (the worker's shutdown).

    ``start()`` makes the recorder; ``path``: where it will write (for the
    report when no step ever ran).
    """

    def __init__(self, start: Callable[[], VllmRecorder], path: str, buffer: StaticBuffer, layers: list[int],
                 worker: Any, dp: int, staging: str = "direct", gathered: bool = False) -> None:
        self.recorder: Optional[VllmRecorder] = None
        self.handover: Any = None
        self.buffer = buffer
        self.layers = layers
        self.table = RequestTable()
        self._start = start
        self._staging = staging
        self._gathered = gathered
        self._closed = False
        # The runner is fixed for the worker's life; its input_batch is read every step (it can be rebuilt).
        self._runner = runner = worker.model_runner
        mark = unwritten_marker(buffer, staging)
        # Profiling, warm-up and graph capture run the model on dummy batches, whose row counts must never pass
        # for a step's (a router silent in the first step would read the warm-up's rows).
        dummy_run = getattr(runner, "_dummy_run", None)
        if dummy_run is not None:
            runner._dummy_run = _then(dummy_run, mark)  # an instance attribute: this runner only
        self._ranks: Optional[_data_parallel.RankRows] = None
        if dp > 1:
            # Where this rank's rows lie among those the routers wrote, step by step (_data_parallel).
            rank = int(worker.vllm_config.parallel_config.data_parallel_rank)
            self._ranks = _data_parallel.RankRows(runner, rank, mark)
        self._last_step = 0.0
        self._dirty = False
        # Said at the worker's end or the process's, unless a step started recording.
        self._unwritten = weakref.finalize(self, _lifecycle.report,
                                           f"[router-hist] not writing {path}: the engine ran no step (an existing "
                                           f"capture there is left as it was)")

    def _begin(self) -> VllmRecorder:
        """The first step's: the recorder, its hand-over, the signal write, the idle writer."""
        recorder = self._start()
        recorder.request_entries = self.table.entries
        if self._staging == "device":
            self.handover = DeviceStaging(recorder, self.buffer, self.layers, gathered=self._gathered)
        else:
            self.handover = Direct(recorder, self.buffer, self.layers)
        self.handover.ranks = self._ranks
        self.recorder = recorder
        self._unwritten.detach()
        _signals.watch(recorder)
        threading.Thread(target=_idle_writer, args=(weakref.ref(self),), name="turbospark-vllm-idle",
                         daemon=True).start()
        return recorder

    def after_step(self, scheduler_output: Any) -> None:
        """Hand the rows of the step that just ran to the recorder (``_handover``), tagged per request.

        Per step: the tags (``RequestTable.step``), then the hand-over's
        ``step``. Raises RuntimeError when a routed layer wrote too few rows
        (on the device path, from the flush that reads the count).
        """
        total = scheduler_output.total_num_scheduled_tokens
        if not total:
            return
        recorder = self.recorder
        if recorder is None:
            if self._closed:
                return
            recorder = self._begin()
        elif recorder.closed:
            return
        tags = self.table.step(scheduler_output, self._runner.input_batch.req_ids)
        now = time.monotonic()
        self.handover.step(total, tags, now)
        self._last_step = now
        self._dirty = True

    def close(self) -> None:
        """The worker shuts down: write the capture now (once) and stop the signals writing it; idempotent."""
        self._closed = True
        recorder = self.recorder
        if recorder is None:
            self._unwritten()
            return
        _signals.forget(recorder)
        recorder.close()

    def _write_if_idle(self) -> bool:
        """Write the capture when rows arrived and no step ran for IDLE_WRITE seconds; False once closed."""
        recorder = self.recorder
        if recorder is None or recorder.closed:
            return False
        if self._dirty and time.monotonic() - self._last_step >= IDLE_WRITE:
            self._dirty = False
            try:
                recorder._write_checkpoint()
            except Exception:  # noqa: BLE001 -- reported by the next checkpoint or the final write
                self._dirty = True
        return True


def _then(run: Callable[..., Any], after: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(run)
    def run_then(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        finally:
            after()

    return run_then


def _idle_writer(session: "weakref.ref[Session]") -> None:
    while True:
        time.sleep(IDLE_WRITE / 2)
        alive = session()
        if alive is None or not alive._write_if_idle():
            return
        del alive
