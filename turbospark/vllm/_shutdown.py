"""A grace period before vLLM force-kills its engine process, so the workers' final write lands.

With its default ``--shutdown-timeout 0`` (abort in-flight requests at
once), vLLM's process manager sends SIGTERM to the engine-core process and
SIGKILLs it and its workers in the same moment: on Ctrl-C the worker's
write, started by the same SIGINT, is cut before its rename (observed: the
whole ``.tmp`` file on disk, no capture). vLLM decides how long to wait in
``vllm.v1.engine.utils.get_engine_process_shutdown_timeout``, whose stated
purpose is that window (it already gives ROCm 15 s). While recording, the
plugin makes that window at least ``TURBOSPARK_VLLM_SHUTDOWN_GRACE``
seconds (default ``DEFAULT_GRACE``) in abort mode. The manager waits only
while the engine process lives: an engine that aborts its requests, lets
its workers write and exits in 1 s costs 1 s; the grace bounds a teardown
that hangs. Requests are still aborted at once (the drain timeout is not
touched), and a ``--shutdown-timeout`` above 0 (drain mode) is left as vLLM
computes it. The DP supervisor (``vllm serve`` with data parallelism) asks
the same function, through its own name for it, how long to wait for its
servers: it gets the same answer.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Mapping, Optional

from turbospark.recording import _env
from turbospark.recording._warn import warn_caller

__all__ = ["DEFAULT_GRACE", "GRACE", "grace_seconds", "install"]

GRACE = "TURBOSPARK_VLLM_SHUTDOWN_GRACE"
DEFAULT_GRACE = 10.0
_MARK = "_turbospark_grace"
_NAME = "get_engine_process_shutdown_timeout"


def grace_seconds(environ: Optional[Mapping[str, str]] = None) -> float:
    """``TURBOSPARK_VLLM_SHUTDOWN_GRACE`` as seconds >= 0 (0: vLLM's own window); warns and uses the default
    for anything else."""
    raw = (os.environ if environ is None else environ).get(GRACE)
    if raw is None:
        return DEFAULT_GRACE
    value = _env.parse_seconds(raw)
    if not (0 <= value < float("inf")):
        warn_caller(f"ignoring {GRACE}={raw!r}: not a number of seconds >= 0; using {DEFAULT_GRACE:g}")
        return DEFAULT_GRACE
    return value


def install() -> None:
    """Wrap ``get_engine_process_shutdown_timeout`` once per process (only vLLM's process managers call it)."""
    from vllm.v1.engine import utils

    original = utils.get_engine_process_shutdown_timeout
    if getattr(original, _MARK, False):
        return
    grace = grace_seconds()

    @functools.wraps(original)
    def with_grace(request_timeout: Optional[float], process_timeout: Optional[float]) -> Any:
        timeout = original(request_timeout, process_timeout)
        # Abort mode only; None is vLLM's own best-effort default (5 s), kept.
        if request_timeout == 0 and timeout is not None and timeout < grace:
            return grace
        return timeout

    setattr(with_grace, _MARK, True)
    utils.get_engine_process_shutdown_timeout = with_grace
    # Modules that imported the function by name before the plugin loaded (`vllm serve` imports the DP
    # supervisor's launcher first) hold the original: rebind theirs too. Their dicts, not getattr: vLLM's lazy
    # modules import on attribute access.
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(module, "__dict__", {}).get(_NAME) is original:
            setattr(module, _NAME, with_grace)
