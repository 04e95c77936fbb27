"""Write the capture when vLLM's own SIGINT/SIGTERM handling begins, before anything can kill the worker.

vLLM's worker processes install handlers that raise ``SystemExit`` on
SIGINT and SIGTERM (the engine core's only flag a shutdown), and on Ctrl-C
the whole process group gets the signal at once. So the worker's handlers
are wrapped (main thread, at model load, after vLLM installed them): the
capture is written first, synchronously, then vLLM's handler runs as
before; every step the worker finished is in it. The write lands because
``_shutdown`` keeps vLLM's process manager from SIGKILLing the engine and
its workers in the same moment. A signal that fires while the worker hands a
step over (``Held``) is handled as that stretch ends, so the
write never holds half a step. A signal that would not end the process (ignored) is left alone;
the write is atomic, and the recorder stays open, so a later exit path
writes again with whatever came after.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

# One deferral mechanism for every hand-over (the streamed trace's too): see recording/_held.py.
from ..recording._held import HELD, Held, held_here, mark_aware

__all__ = ["HELD", "Held", "held_here", "write_before_exit"]


def write_before_exit(recorder: Any) -> None:
    """Chain a write of ``recorder`` in front of the process's SIGINT and SIGTERM handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if previous in (signal.SIG_IGN, None):
            continue
        signal.signal(signum, _handler(recorder, signum, previous))


def _handler(recorder: Any, signum: int, previous: Any) -> Any:
    def on_signal(number: int, frame: Any) -> None:
        if HELD.depth:
            # Mid-hand-over: the write and vLLM's handler run when the stretch ends (Held.run_pending).
            HELD.pending.append((on_signal, number, frame))
            return
        if not recorder.closed:
            recorder._finish(close=False)
        if callable(previous):
            previous(number, frame)
        else:
            # SIG_DFL: die as the signal would have.
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    return mark_aware(on_signal)
