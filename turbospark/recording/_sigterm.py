"""Opt-in SIGTERM handling: write open captures, then die as SIGTERM would have.

Off unless ``TURBOSPARK_ROUTER_HIST_SIGTERM=1`` (as coverage.py's ``sigterm``
setting): a library must not take over a process's signals uninvited. The
handler chains to whatever was installed before it, so a runtime's own
SIGTERM handling still runs, after the capture is safe.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

from ._atomic import remove_temporaries
from ._warn import warn_caller

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


def install(close_all: Callable[[], None], write_all: Callable[[], None]) -> None:
    """Install the handler once per process (main thread only); later calls do nothing.

    ``close_all`` writes and closes every open capture (before the process
    dies); ``write_all`` writes them and leaves them open (before chaining to
    a handler that may let the process go on recording).
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
            if callable(previous):
                write_all()
                previous(signum, frame)
                return
            close_all()
            # Dying now skips the cleanup of a write this signal interrupted.
            remove_temporaries()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
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

