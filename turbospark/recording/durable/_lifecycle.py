"""The recorders' lifecycle: one registry of captures still owed to disk, the exit writes, the one fork hook.

A recorder is *pending* from construction until its capture is settled: a
write after ``close()`` succeeded or failed with a reported error, or
``discard()`` dropped it. The flag lives on the recorder (``_owed``), so a
recorder dropped while its close() write was cut short still writes; the weak
set lets the exit path find the pending ones. A write cut short by Ctrl-C or by a signal leaves
it pending, so there is no separate "writing" or "interrupted" state: the exit
path (``finish_all``, run by ``atexit`` and by the opt-in SIGTERM handler)
writes whatever is still pending, and is the one place that writes at the end.

States of one recorder (``closed`` is the core's flag)::

    open, pending --close()/drop--> closed, pending --write ok / reported failure--> closed, settled
         |                                 ^   \\--Ctrl-C, signal--> (stays pending: the exit path writes it)
         +--exit, SIGTERM (finish_all)-----+
         +--discard()--> closed, settled (nothing written)
         +--fork: the child's copy never writes (owner pid); it may record

``_after_fork_in_child`` is the package's one ``os.register_at_fork`` hook: a
forked child owns no write in progress, gets SIGTERM back as it was, and
renews every lock another thread may have held at the fork.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any

from ... import _atomic
from . import _sigterm

_pending: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Re-entrant: a garbage collection inside it may run __del__ -> close(), and
# the SIGTERM handler may run while the main thread holds it.
_lock = threading.RLock()


def register(recorder: Any) -> None:
    """A new recorder owes its capture until it is settled."""
    with _lock:
        recorder._owed = True
        _pending.add(recorder)


def settle(recorder: Any) -> None:
    """The recorder's capture is written (or its failure reported, or it was discarded): nothing is owed."""
    with _lock:
        _pending.discard(recorder)
        recorder._owed = False


def pending_count() -> int:
    """How many recorders of this process still owe their capture."""
    with _lock:
        return len(_pending)


def report(line: str) -> None:
    """Print a [router-hist] line on stderr; never raises (stderr may be gone at exit)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 -- stderr may be gone at interpreter exit
        pass


def _owned() -> list[Any]:
    with _lock:
        recorders = list(_pending)
    pid = os.getpid()
    return [recorder for recorder in recorders if recorder._owner_pid == pid]


def finish_all(*, close: bool = True) -> None:
    """Write every capture still owed; with ``close`` also close its recorder and settle it.

    ``close=True`` is interpreter exit and a SIGTERM that ends the process;
    ``close=False`` writes and leaves the recorders open (a SIGTERM chained to
    a handler that may keep the process recording). Never raises: a Ctrl-C
    during one write costs no other capture, and the write it cut short is
    tried once more after the others, or reported.
    """
    interrupted = []
    for recorder in _owned():
        try:
            recorder._finish(close=close)
        except BaseException:  # noqa: BLE001 -- one interrupted write must not cost the others
            interrupted.append(recorder)
    for recorder in interrupted:
        try:
            recorder._finish(close=close)
        except BaseException:  # noqa: BLE001
            report(f"[router-hist] FAILED writing {recorder._path}: interrupted")


atexit.register(finish_all)


def _after_fork_in_child() -> None:
    """A forked child inherits copies of the parent's recorders, which it must never write.

    In the order the three hooks this replaces were registered: temporary
    files, SIGTERM, then the recorders (whose locks another thread may have
    held at the fork, so they are renewed before anything takes them).
    """
    global _lock
    _atomic._forget_in_child()
    _sigterm._restore_in_child()
    _lock = threading.RLock()
    # The parent's recorders stay registered: the child never writes them
    # (finish_all and close() check the owner pid), but it may record into
    # them and fork again, and a grandchild must renew their locks too.
    for recorder in list(_pending):
        recorder._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
