"""The recorder the plugin writes through: a ``RouterHistogram`` that appends the ``requests`` map.

``"requests":[{"seq":0,"request":"...","attempt":0,"start":0,"prompt":12},...]``
is the last key: entry i says what sequence id i of ``seq`` stands for (the
vLLM request id, the rerun after preemption, the first routed position and
the prompt length; ``turbospark.capture.reader.Request``). Everything
before it is the ordinary capture, so tools that ignore the key read the
file as they read any other.
"""

from __future__ import annotations

from typing import Any

from turbospark.capture import reader as capture
from turbospark.recording.recorder import RouterHistogram

__all__ = ["VllmRecorder", "requests_key"]


def requests_key(entries: list[Any]) -> bytes:
    """The ``,"requests":[...]`` JSON fragment for a list of ``Request`` entries."""
    return capture.requests_key(entries).encode("ascii")


class VllmRecorder(RouterHistogram):
    """``RouterHistogram`` plus the ``requests`` key (the session appends to ``request_entries``)."""

    request_entries: list[Any]

    def _document(self) -> bytes:
        document: bytes = super()._document()
        # Read after the core's document: the map may only be a superset of
        # the sequence ids it holds, since each entry is added before its passes.
        entries = list(getattr(self, "request_entries", ()))
        return document[:-1] + requests_key(entries) + b"}"
