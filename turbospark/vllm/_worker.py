"""The three wrapped worker methods: where the plugin enters vLLM's own code path (and ``_data_parallel``).

``Worker.load_model`` (after it: bind the routers, before vLLM profiles,
compiles or captures graphs, so every compiled graph contains the hook) and
``Worker.execute_model`` (after it: the step's rows go to the recorder,
outside any compiled or captured region) and ``Worker.shutdown`` (before
it: the capture is written, ``Session.close``; an in-process engine's
``del llm`` reaches it through vLLM's finalizer). All are the worker's RPC
interface, which the engine calls by name on every worker; the CPU worker
and the GPU worker share them. Everything else the plugin reads is the
step's ``SchedulerOutput`` and the runner's ``input_batch.req_ids``; on a
data-parallel rank also each forward's per-rank token counts, read where
the runner decides its batch (``_data_parallel`` wraps that one runner
method, on the recording rank's runner only).
"""

from __future__ import annotations

import functools
from typing import Any

_MARK = "_turbospark_hooked"


def install() -> None:
    """Wrap ``Worker.load_model``, ``Worker.execute_model`` and ``Worker.shutdown`` once per process."""
    from vllm.v1.worker.gpu_worker import Worker

    if getattr(Worker, _MARK, False):
        return
    load_model = Worker.load_model
    execute_model = Worker.execute_model

    @functools.wraps(load_model)
    def load_model_and_bind(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = load_model(self, *args, **kwargs)
        from . import _session

        self._turbospark_session = _session.attach(self)
        return result

    @functools.wraps(execute_model)
    def execute_model_and_record(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        output = execute_model(self, scheduler_output, *args, **kwargs)
        session = getattr(self, "_turbospark_session", None)
        if session is not None:
            session.after_step(scheduler_output)
        return output

    shutdown = Worker.shutdown

    @functools.wraps(shutdown)
    def close_then_shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        # First: the device hand-over's last flush needs the worker's device as it was.
        session = getattr(self, "_turbospark_session", None)
        if session is not None:
            session.close()
        return shutdown(self, *args, **kwargs)

    Worker.load_model = load_model_and_bind
    Worker.execute_model = execute_model_and_record
    Worker.shutdown = close_then_shutdown
    setattr(Worker, _MARK, True)
