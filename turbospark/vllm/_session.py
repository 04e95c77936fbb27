"""One worker's recording: the refusals, the routers bound to the static buffer, the hand-over after each step.

``attach(worker)`` runs right after ``Worker.load_model``, before vLLM
profiles, compiles or captures anything, so every graph it builds writes
the ids into the static buffer. ``Session.after_step`` runs after
``Worker.execute_model``, outside every compiled region: it reads the rows
the step wrote, tags them from the step's ``SchedulerOutput`` and the
runner's request order, and records them with ``record_batch``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref
from typing import Any, NoReturn, Optional

import torch

from turbospark.recording import _env

from . import _checks, _data_parallel, _signals
from ._buffer import NOT_CALLED, StaticBuffer
from ._recorder import VllmRecorder
from ._requests import RequestTable, StepTags

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
    env = _env.config_from_env(num_layers)
    assert env is not None  # register() installed the hooks only with TURBOSPARK_ROUTER_HIST set
    given: frozenset[str] = frozenset()
    if env.pilot is not None:
        _warn_pilot()
        env = dataclasses.replace(env, pilot=None)
    if env.checkpoint is None:
        env = dataclasses.replace(env, checkpoint=DEFAULT_CHECKPOINT)
    recorder = VllmRecorder.from_config(env, num_layers, num_experts, top_k, given=given)
    scheduler = config.scheduler_config
    dp = int(getattr(config.parallel_config, "data_parallel_size", 1))
    capacity = int(scheduler.max_num_batched_tokens) * max(dp, 1)
    device = torch.device(worker.device) if getattr(worker, "device", None) is not None else torch.device("cpu")
    buffer = StaticBuffer(len(layers), capacity, top_k, device)
    for slot, (_, module) in enumerate(layers):
        module.router.set_capture_fn(buffer.capture_fn(slot))
    _signals.write_before_exit(recorder)
    return Session(recorder, buffer, [index for index, _ in layers], worker, dp)


class Session:
    """A worker's recorder, static buffer and request table; ``after_step`` is its one per-step call."""

    def __init__(self, recorder: VllmRecorder, buffer: StaticBuffer, layers: list[int], worker: Any, dp: int) -> None:
        self.recorder = recorder
        self.buffer = buffer
        self.layers = layers
        self.table = RequestTable()
        recorder.request_entries = self.table.entries
        # The runner is fixed for the worker's life; its input_batch is read every step (it can be rebuilt).
        self._runner = worker.model_runner
        if buffer.ids.device.type != "cpu":
            # The CUDA path (device staging without a host sync per step) is not built yet: refuse rather
            # than sync every step silently.
            raise _checks.Refused(
                f"turbospark: the vLLM plugin records on the CPU backend only for now (this worker runs on "
                f"{buffer.ids.device}); unset {_env.HIST}"
            )
        ids = buffer.ids.numpy()
        # The routed layers' row counts, and what resets them before a step (memoryviews: the cheapest
        # reads and writes from Python).
        self._rows = memoryview(buffer.rows.numpy())
        self._reset = memoryview(buffer.rows.numpy().copy())
        # Data-parallel ranks: where this rank's rows start among those the routers wrote (_data_parallel).
        self._dp: Optional[_data_parallel.RankRows] = None
        if dp > 1:
            rank = int(worker.vllm_config.parallel_config.data_parallel_rank)
            self._dp = _data_parallel.RankRows(self._runner, rank, self._rows, self._reset)
        self._offset = 0
        # Per routed layer: its slot of the static buffer (views: valid for the buffer's life).
        self._blocks = [(layer, ids[slot]) for slot, layer in enumerate(layers)]
        self._tags: Optional[StepTags] = None
        self._calls: list[tuple[int, Any, Any, str]] = []
        self._last_step = 0.0
        self._dirty = False
        threading.Thread(target=_idle_writer, args=(weakref.ref(self),), name="turbospark-vllm-idle",
                         daemon=True).start()

    def after_step(self, scheduler_output: Any) -> None:
        """Record the rows of the step that just ran; raises RuntimeError when a routed layer wrote none.

        Per step: the tags (``RequestTable.step``), one ``min`` over the routed
        layers' row counts against the step's token count (on a data-parallel
        rank a ``min`` and a ``max`` against the step's per-rank token counts,
        which place this rank's rows: ``_data_parallel``), and one ``record_batch``
        per layer and phase run, whose arguments (views of the static buffer,
        the run's sequence ids) are built once per distinct layout and reused
        while steps repeat it.
        """
        total = scheduler_output.total_num_scheduled_tokens
        if not total or self.recorder.closed:
            return
        tags = self.table.step(scheduler_output, self._runner.input_batch.req_ids)
        rows = self._rows
        if self._dp is None:
            offset: Optional[int] = 0 if min(rows) >= total else None
        else:
            offset = self._dp.offset(rows, total)
        if offset is None:
            self._refuse_rows(rows.tolist(), int(total))
        rows[:] = self._reset
        if tags is not self._tags or offset != self._offset:
            self._tags = tags
            self._offset = offset
            self._calls = [(layer, block[offset + start:offset + stop], seq, phase)
                           for layer, block in self._blocks for start, stop, phase, seq in tags.pieces]
        record = self.recorder.record_batch
        for layer, block, seq, phase in self._calls:
            record(layer, block, seq=seq, phase=phase)
        self._last_step = time.monotonic()
        self._dirty = True

    def _refuse_rows(self, seen: list[int], total: int) -> NoReturn:
        for layer, n in zip(self.layers, seen):
            if n == NOT_CALLED:
                raise RuntimeError(
                    f"turbospark: the router of MoE layer {layer} never called capture_fn in this step; "
                    "the capture would be silently incomplete"
                )
        if self._dp is not None:
            raise RuntimeError(self._dp.refusal(seen, total))
        layer, n = min(zip(self.layers, seen), key=lambda pair: pair[1])
        raise RuntimeError(
            f"turbospark: the router of MoE layer {layer} routed {n} rows for a step of {total} tokens; "
            "this dispatch layout is not supported"
        )

    def _write_if_idle(self) -> bool:
        """Write the capture when rows arrived and no step ran for IDLE_WRITE seconds; False once closed."""
        if self.recorder.closed:
            return False
        if self._dirty and time.monotonic() - self._last_step >= IDLE_WRITE:
            self._dirty = False
            try:
                self.recorder._write_checkpoint()
            except Exception:  # noqa: BLE001 -- reported by the next checkpoint or the final write
                self._dirty = True
        return True


def _idle_writer(session: "weakref.ref[Session]") -> None:
    while True:
        time.sleep(IDLE_WRITE / 2)
        alive = session()
        if alive is None or not alive._write_if_idle():
            return
        del alive
