"""The instants where CPython runs pending signal handlers in Python code (a helper module, not a test).

Entering a Python function, after a call returns, and a loop's backward
jump: a signal handler (and so a Ctrl-C's KeyboardInterrupt) runs at one of
them. ``at_instant`` runs a call with an event landing at one chosen instant,
for the matrices that land a signal at every one (test_signals, test_handover).
"""

from __future__ import annotations

import dis
import sys
from typing import Any, Callable

#: The opcodes after which an instant comes (a call returned; a loop jumped back).
AFTER = ({op for name, op in dis.opmap.items() if name.startswith("CALL")}
         | {op for name, op in dis.opmap.items() if "JUMP_BACKWARD" in name and "NO_INTERRUPT" not in name})


def at_instant(call: Callable[[], Any], point: int, event: Callable[[], None], traced: Callable[[str], bool],
               ends: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``call`` with ``event()`` at its ``point``-th instant (0: none); return how many instants it had.

    Only frames whose file ``traced`` accepts count. An exception of a type in
    ``ends`` (the event's KeyboardInterrupt) ends the call quietly.
    """
    seen = 0
    previous: dict[int, int] = {}

    def tracer(frame: Any, kind: str, arg: Any) -> Any:
        nonlocal seen
        if not traced(frame.f_code.co_filename):
            return None
        frame.f_trace_opcodes = True
        if kind == "call":
            instant = True
        elif kind == "opcode":
            instant = previous.get(id(frame)) in AFTER
            previous[id(frame)] = frame.f_code.co_code[frame.f_lasti]
        else:
            instant = False
        if instant:
            seen += 1
            if seen == point:
                event()
        return tracer

    sys.settrace(tracer)
    try:
        call()
    except ends:
        pass
    finally:
        sys.settrace(None)
    return seen
