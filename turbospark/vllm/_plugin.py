"""The ``vllm.general_plugins`` entry point: install the worker hooks when recording is on."""

from __future__ import annotations

import os

from turbospark.recording import _env

__all__ = ["register"]


def register() -> None:
    """vLLM's plugin hook, called in every vLLM process; returns None.

    With ``TURBOSPARK_ROUTER_HIST`` unset or empty it does nothing (and costs
    one environment lookup). Otherwise it wraps the V1 worker's
    ``load_model`` (bind the routers' ``capture_fn`` before vLLM compiles the
    model) and ``execute_model`` (hand each step's rows to the recorder),
    and gives vLLM's process manager a grace period before it force-kills
    the engine (``_shutdown``: the workers' final write must land).
    Raises nothing itself; a refused setup raises when the worker loads the
    model (see ``_session``).
    """
    if not os.environ.get(_env.HIST):
        return
    from . import _shutdown, _worker

    _worker.install()
    _shutdown.install()
