"""Opt-in SIGTERM handling: the signal becomes an orderly end, through the exit path.

Off unless ``TURBOSPARK_ROUTER_HIST_SIGTERM=1`` (as coverage.py's ``sigterm``
setting): a library must not take over a process's signals uninvited. The
handler writes nothing itself: it runs the exit path (``_lifecycle.finish_all``,
the one place that writes at the end) and then dies as SIGTERM would have, or
chains to whatever was installed before it, so a runtime's own SIGTERM
handling still runs, after the capture is safe.

Why not raise ``SystemExit`` and let ``atexit`` write: interpreter shutdown
waits for non-daemon threads (a data-loader thread would turn SIGTERM into a
hang), a bare ``except:`` in the caller would swallow it, and the process
would no longer end "killed by SIGTERM" for its supervisor.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

from ..._atomic import remove_temporaries
from ._held import HELD, mark_aware
from .._warn import warn_caller

VARIABLE = "TURBOSPARK_ROUTER_HIST_SIGTERM"
_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}

_lock = threading.Lock()
_installed = False
_previous: Any = None
_handler: Any = None


def requested(environ: Optional[dict[str, str]] = None) -> bool:
    """Whether the environment opts in; an unrecognised value warns and counts as off."""
    value = (os.environ if environ is None else environ).get(VARIABLE)
    if value is None or value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    warn_caller(f"ignoring {VARIABLE}={value!r}: expected 1 or 0; SIGTERM is left alone")
    return False


def install(finish_all: Callable[..., None]) -> None:
    """Install the handler once per process (main thread only); later calls do nothing.

    ``finish_all(close=True)`` writes and closes every pending capture (before
    the process dies); ``finish_all(close=False)`` writes them and leaves them
    open (before chaining to a handler that may let the process go on).
    """
    global _installed, _previous, _handler
    with _lock:
        if _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            warn_caller(
                f"{VARIABLE} is set but the first recorder was created outside the main thread, "
                "where Python cannot install signal handlers; SIGTERM is left alone"
            )
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:
            # SIGTERM would not end this process; writing on it would change that.
            _installed = True
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if HELD.depth:
                # Mid-hand-over (rows taken, not yet queued; a flush holding the queue's lock): the
                # write runs as that stretch ends, so it never counts rows it cannot find (_held).
                HELD.pending.append((on_sigterm, signum, frame))
                return
            if callable(previous):
                finish_all(close=False)
                previous(signum, frame)
                return
            finish_all(close=True)
            # A write this signal interrupted was redone by finish_all (its
            # capture was still pending); dying now skips its cleanup.
            remove_temporaries()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, mark_aware(on_sigterm))
        _handler = on_sigterm
        _previous = previous
        _installed = True


def _restore_in_child() -> None:
    """A forked child owns no capture: give SIGTERM back the disposition it had (run by _lifecycle's fork hook)."""
    global _installed, _lock
    _lock = threading.Lock()
    if _installed and _handler is not None and signal.getsignal(signal.SIGTERM) is _handler:
        signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
    _installed = False

