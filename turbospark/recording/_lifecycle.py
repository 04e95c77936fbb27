"""The recorders' lifecycle: which captures are open or mid-write, exit, and the one fork hook.

A recorder is registered in ``_live`` from construction until ``close()`` or
``discard()``; ``_writing`` holds those whose write is in progress and
``_interrupted`` those whose write Ctrl-C cut short, so that interpreter exit
(``close_all``) can retry them. The opt-in SIGTERM handler (``_sigterm``)
calls ``close_all`` or ``write_all``. ``_after_fork_in_child`` is the
package's one ``os.register_at_fork`` hook: a forked child forgets the
parent's temporary files, gives SIGTERM back its earlier disposition and
renews every lock another thread may have held at the fork.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any

from . import _atomic, _sigterm

# Every open recorder, so that interpreter exit can write the ones still open,
# and the closed ones whose write was interrupted, so that exit retries them.
_live: "weakref.WeakSet[Any]" = weakref.WeakSet()
_interrupted: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Recorders whose write is in progress: a SIGTERM handler that ends the
# process from inside one of those writes must redo it first.
_writing: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Re-entrant: a garbage collection inside the lock may run __del__ -> close().
_live_lock = threading.RLock()


def report(line: str) -> None:
    """Print a [router-hist] line on stderr; never raises (stderr may be gone at exit)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 -- stderr may be gone at interpreter exit
        pass


@atexit.register
def close_all() -> None:
    """Write every recorder still open at interpreter exit, as the reference writes on drop."""
    with _live_lock:
        recorders = list(_live)
        retries = list(_interrupted) + [recorder for recorder in _writing if recorder not in _interrupted]
        _interrupted.clear()
    for recorder in retries:
        if os.getpid() == recorder._owner_pid:
            recorder._write_and_report()
    interrupted = []
    for recorder in recorders:
        try:
            recorder.close()
        except BaseException:  # noqa: BLE001 -- one interrupted write must not cost the others
            interrupted.append(recorder)
    for recorder in interrupted:
        try:
            recorder._write_and_report()
        except BaseException:  # noqa: BLE001
            report(f"[router-hist] FAILED writing {recorder._path}: interrupted")


def write_all() -> None:
    """Write every open capture of this process, leaving the recorders open."""
    with _live_lock:
        recorders = list(_live)
    for recorder in recorders:
        if os.getpid() == recorder._owner_pid:
            recorder._write_and_report()


def _after_fork_in_child() -> None:
    """Locks another thread held at fork() time stay held in the child: make new ones.

    In the order the three hooks this replaces were registered: temporary
    files, SIGTERM, then the recorders.
    """
    global _live_lock
    _atomic._forget_in_child()
    _sigterm._restore_in_child()
    _live_lock = threading.RLock()
    for recorder in list(_live):
        recorder._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
