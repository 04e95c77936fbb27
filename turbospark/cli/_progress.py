"""A one-line progress counter for long command-line work, on a terminal only.

Shown only once the work has run for a couple of seconds (short runs stay
quiet) and only when the stream is a TTY (logs and pipes get no carriage
returns); it rewrites one line in place and erases it when done.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, TextIO


class Progress:
    """Call with the number of units done so far; the line is erased when all are done (or by ``finish()``)."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        label: str,
        *,
        delay: float = 2.0,
        interval: float = 0.25,
        clock: Optional[Callable[[], float]] = None,
    ) -> None:
        clock = clock or time.monotonic
        self._total = total
        self._stream = stream
        self._label = label
        self._interval = interval
        self._clock = clock
        self._next = clock() + delay
        self._width = 0

    def __call__(self, done: int) -> None:
        if done >= self._total:
            # Erased before whatever the finished work prints next.
            self.finish()
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        line = f"{self._label}: {done:,}/{self._total:,} ({done / self._total:.0%})"
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()
        self._width = max(self._width, len(line))

    def finish(self) -> None:
        if self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0


def progress_on(stream: TextIO, total: int, label: str) -> Optional[Progress]:
    """A ``Progress`` writing to ``stream`` when it is a terminal, else None."""
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # a closed or exotic stream
        interactive = False
    return Progress(total, stream, label) if interactive and total > 0 else None
