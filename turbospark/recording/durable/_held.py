"""Signal deferral: stretches of code that a signal handler's write (or a Ctrl-C) must not cut in half.

One mechanism for every hand-over of rows: the streamed trace's take from
the core into the writer's queue and its flush (``recorder._hand_over``,
``_stream.StreamWriter``), and the vLLM plugin's step hand-over and staged
flush (``vllm/_handover.py``). Signal handlers run on the main thread only,
so only the main thread's ``HELD`` is ever consulted; another thread's
stretches count on a ``Held`` no handler reads (``held_here``).

Around such a stretch: ``held.depth += 1``, then in a ``finally``
``held.depth -= 1`` and, when ``held.pending`` and the depth is back to 0,
``held.run_pending()``. Attribute updates, not a signal mask: the vLLM path
pays them once per step, where two syscalls would cost more than the
hand-over. The handlers that consult ``HELD`` (the opt-in SIGTERM handler,
the vLLM plugin's SIGINT/SIGTERM wrappers) carry ``HELD_AWARE``; a handler
that fires mid-stretch is queued and runs, in order, as the stretch ends.

Python's own SIGINT handler (``KeyboardInterrupt``) consults nothing. A
``Stretch(interrupts=True)`` (the streamed hand-over, once per chunk of
1 M ids, where a few microseconds are free) therefore puts a deferring
handler in front of the main thread's SIGINT handler for its length and
gives the original back as it ends, so a Ctrl-C there lands as the rows
are queued, never between the take and the queue.
"""

from __future__ import annotations

import importlib
import signal
import threading
from typing import Any, Callable, Optional

# The C functions under signal.getsignal/signal.signal, without their enum wrapping (a few us a call).
# typeshed has no stub for the _signal module: their types are stated here, as signal's own.
_c_signal = importlib.import_module("_signal")
_getsignal: Callable[[int], Any] = _c_signal.getsignal
_setsignal: Callable[[int, Any], Any] = _c_signal.signal

__all__ = ["HELD", "HELD_AWARE", "Held", "Stretch", "held_here", "mark_aware"]

#: The attribute a signal handler that consults ``HELD`` carries (set by ``mark_aware``).
HELD_AWARE = "_turbospark_held_aware"


class Held:
    """How deep a thread is in a hand-over, and the signals that fired meanwhile."""

    __slots__ = ("depth", "pending")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: list[tuple[Any, int, Any]] = []

    def run_pending(self) -> None:
        """Run the handlers that fired inside the stretch that just ended, in order."""
        pending, self.pending = self.pending, []
        for handler, number, frame in pending:
            handler(number, frame)


# The main thread's: only the main thread runs signal handlers, and the held-aware handlers consult this one.
HELD = Held()
_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)


def held_here() -> Held:
    """``HELD`` on the main thread; elsewhere a ``Held`` no handler consults (a signal cannot cut that thread)."""
    return HELD if threading.current_thread() is _MAIN else Held()


def mark_aware(handler: Any) -> Any:
    """Mark ``handler`` as one that defers itself while ``HELD.depth`` (so a stretch leaves it in place)."""
    setattr(handler, HELD_AWARE, True)
    return handler


def _deferring(previous: Any) -> Any:
    def on_sigint(number: int, frame: Any) -> None:
        if HELD.depth:
            HELD.pending.append((previous, number, frame))
            return
        # The stretch is over (its end raced this signal): give the original back first, then let it act.
        if _getsignal(signal.SIGINT) is on_sigint:
            _setsignal(signal.SIGINT, previous)
        previous(number, frame)

    return mark_aware(on_sigint)


class Stretch:
    """``with Stretch():`` a stretch no held-aware signal handler cuts; ``interrupts=True``: nor a Ctrl-C.

    Not re-entrant as an object (make one per use); nested stretches nest
    through ``HELD.depth``, and the pending handlers run as the outermost
    ends. The deferring SIGINT handler is installed before the depth rises
    and removed after it falls, and removes itself when a signal finds the
    depth at 0: a Ctrl-C at any instant of ``__enter__`` or ``__exit__``
    leaves neither a depth nor a handler behind.
    """

    __slots__ = ("_held", "_interrupts", "_installed", "_previous")

    def __init__(self, *, interrupts: bool = False) -> None:
        self._interrupts = interrupts
        self._installed: Optional[Any] = None
        self._previous: Any = None

    def __enter__(self) -> Held:
        held = self._held = held_here()
        if self._interrupts and held is HELD:
            try:
                previous = _getsignal(_SIGINT)
                if callable(previous) and not getattr(previous, HELD_AWARE, False):
                    installed = _deferring(previous)
                    _setsignal(_SIGINT, installed)
                    self._previous, self._installed = previous, installed
            except ValueError:  # not the main interpreter: Python runs no handler here anyway
                pass
        held.depth += 1
        return held

    def __exit__(self, *exc_info: Any) -> None:
        held = self._held
        held.depth -= 1
        installed, self._installed = self._installed, None
        # Only if nothing replaced it meanwhile (a pending handler runs after this, never before).
        if installed is not None and _getsignal(_SIGINT) is installed:
            _setsignal(_SIGINT, self._previous)
        if held.pending and not held.depth:
            held.run_pending()
