"""Periodic checkpoints: a recorder's capture rewritten atomically every N seconds while it records.

A serving process can die without running any exit code (``vllm serve``
SIGKILLs its workers on SIGTERM with its default shutdown timeout, an OOM
killer never asks): a capture written only at the end is then lost whole.
A checkpoint thread rewrites it at a fixed interval, through the same
``write`` every other output uses, so such a death loses at most the last
interval, and the file on disk is always a whole capture (``write_atomic``).

The thread holds its recorder weakly: dropping the recorder still writes it
at once (``__del__``) and ends the thread. Checkpoints never raise into the
program; a failing one is reported on stderr once per distinct message.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

from . import _lifecycle
from ..._atomic import describe_os_error


def interval(value: Any) -> Optional[float]:
    """A ``checkpoint=`` argument as seconds (a positive finite number) or None; raises TypeError/ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"checkpoint must be None or a number of seconds, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not (seconds > 0 and seconds != float("inf")):
        raise ValueError(f"checkpoint must be a positive, finite number of seconds, got {value!r}")
    return seconds


class Checkpointer:
    """Calls ``recorder._write_checkpoint()`` every ``seconds`` from a daemon thread until stopped."""

    def __init__(self, recorder: Any, seconds: float) -> None:
        self.seconds = seconds
        self._recorder = weakref.ref(recorder)
        self._stop = threading.Event()
        self._failures: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="turbospark-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            recorder = self._recorder()
            if recorder is None or recorder.closed:
                return
            try:
                recorder._write_checkpoint()
            except Exception as exc:  # noqa: BLE001 -- a checkpoint must never stop the program; reported
                message = f"[router-hist] FAILED checkpoint of {recorder.path}: {describe_os_error(exc)}"
                if message not in self._failures:
                    self._failures.add(message)
                    _lifecycle.report(message)
            finally:
                del recorder  # the thread must not keep the recorder alive between checkpoints

    def stop(self) -> None:
        """Stop the thread; never waits for it.

        Waiting could deadlock (a SIGTERM handler stopping it while the
        thread waits for a lock the interrupted main thread holds). It need
        not wait: a checkpoint writes under the recorder's write lock and
        skips once the recorder is closed, so a final write always lands
        last.
        """
        self._stop.set()
