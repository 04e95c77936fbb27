"""Write the capture when vLLM's own SIGINT/SIGTERM handling begins, before anything can kill the worker.

vLLM's worker processes install handlers that raise ``SystemExit`` on
SIGINT and SIGTERM (the engine core's only flag a shutdown), and on Ctrl-C
the whole process group gets the signal at once. So the worker's handlers
are wrapped (main thread, at model load, after vLLM installed them): the
capture is written first, synchronously, then vLLM's handler runs as
before; every step the worker finished is in it. The write lands because
``_shutdown`` keeps vLLM's process manager from SIGKILLing the engine and
its workers in the same moment. A signal that fires while the worker hands a
step over (``hold``/``release``) is handled as that stretch ends, so the
write never holds half a step. A signal that would not end the process (ignored) is left alone;
the write is atomic, and the recorder stays open, so a later exit path
writes again with whatever came after.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["hold", "release", "write_before_exit"]

class _Held:
    """How deep the main thread is in the plugin's hand-over, and the signals that arrived meanwhile."""

    def __init__(self) -> None:
        # The thread that runs this process's wrapped handlers (set by write_before_exit); None: no handler.
        self.main: Any = None
        self.depth = 0
        self.pending: list[tuple[Any, int, Any]] = []


_HELD = _Held()


def hold() -> None:
    """Enter a stretch (a step's hand-over, a flush) that a signal handler's write must not cut in half.

    Only the main thread runs signal handlers, so only its stretches count.
    A handler that fires inside one is run when the outermost ``release()``
    comes (a flag and a list, not a signal mask: two syscalls per step would
    cost more than the hand-over itself): the write then holds whole steps,
    and the worker's own handler (vLLM's, which raises ``SystemExit``) runs
    right after it, as it would have.
    """
    if threading.get_ident() == _HELD.main:
        _HELD.depth += 1


def release() -> None:
    """Leave a ``hold()`` stretch; the outermost one runs the handlers that fired inside it, in order."""
    if threading.get_ident() != _HELD.main:
        return
    _HELD.depth -= 1
    if _HELD.depth == 0 and _HELD.pending:
        pending, _HELD.pending = _HELD.pending, []
        for handler, number, frame in pending:
            handler(number, frame)


def write_before_exit(recorder: Any) -> None:
    """Chain a write of ``recorder`` in front of the process's SIGINT and SIGTERM handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    _HELD.main = threading.get_ident()
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if previous in (signal.SIG_IGN, None):
            continue
        signal.signal(signum, _handler(recorder, signum, previous))


def _handler(recorder: Any, signum: int, previous: Any) -> Any:
    def on_signal(number: int, frame: Any) -> None:
        if _HELD.depth:
            # Mid-hand-over: the write and vLLM's handler run when the stretch ends (release()).
            _HELD.pending.append((on_signal, number, frame))
            return
        if not recorder.closed:
            recorder._finish(close=False)
        if callable(previous):
            previous(number, frame)
        else:
            # SIG_DFL: die as the signal would have.
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    return on_signal
