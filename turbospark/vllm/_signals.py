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

One pair of handlers per process writes every recorder still recording
(``watch``), held weakly: in one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
an engine deleted, or whose worker shut down (``forget``), is closed and
written by its own end, and a signal never writes it again over a later
engine's capture.
"""

from __future__ import annotations

import signal
import threading
import weakref
from typing import Any

# One deferral mechanism for every hand-over (the streamed trace's too): see recording/durable/_held.py.
from ..recording.durable._held import HELD, Held, held_here, mark_aware

__all__ = ["HELD", "Held", "forget", "held_here", "install", "watch", "watched", "write_before_exit"]


def write_before_exit(recorder: Any) -> None:
    """Write ``recorder`` when the process's SIGINT or SIGTERM handling begins (``install`` then ``watch``)."""
    install()
    watch(recorder)


def watch(recorder: Any) -> None:
    """Add ``recorder`` (once) to what the handlers write, after the recorders already watched; any thread.

    Held weakly: a recorder whose engine is gone is closed (and written) by
    its own end, never by a later signal. Oldest first: two live recorders of
    one path leave the newer one's capture on disk.
    """
    kept = [ref for ref in _watched if ref() is not None]
    if all(ref() is not recorder for ref in kept):
        kept.append(weakref.ref(recorder))
    _watched[:] = kept


def forget(recorder: Any) -> None:
    """Stop writing ``recorder`` on a signal (its worker shut down); any thread."""
    _watched[:] = [ref for ref in _watched if ref() is not None and ref() is not recorder]


def watched() -> list[Any]:
    """The live recorders a signal writes, in the order it writes them."""
    return [recorder for recorder in (ref() for ref in _watched) if recorder is not None]


def install() -> None:
    """Chain the write of every watched recorder in front of the process's SIGINT and SIGTERM handlers.

    Main thread only (elsewhere a no-op: ``signal.signal`` refuses there);
    once per handler: a handler of ours already in place is not wrapped
    again, so one signal writes each recorder once.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if previous in (signal.SIG_IGN, None) or getattr(previous, _MARK, False):
            continue
        signal.signal(signum, _handler(signum, previous))


_MARK = "_turbospark_writes_first"
# Weak references, oldest first; replaced whole (one store) by watch and forget, so a handler that
# interrupts either reads the old list or the new one.
_watched: list["weakref.ref[Any]"] = []


def _write_watched() -> None:
    for recorder in watched():
        if not recorder.closed:
            recorder._finish(close=False)


def _handler(signum: int, previous: Any) -> Any:
    def on_signal(number: int, frame: Any) -> None:
        if HELD.depth:
            # Mid-hand-over: the write and vLLM's handler run when the stretch ends (Held.run_pending).
            HELD.pending.append((on_signal, number, frame))
            return
        _write_watched()
        if callable(previous):
            previous(number, frame)
        else:
            # SIG_DFL: die as the signal would have.
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    setattr(on_signal, _MARK, True)
    return mark_aware(on_signal)
