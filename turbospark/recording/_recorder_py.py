"""Pure-Python recorder core: the reference the compiled core must match.

Every behaviour of ``csrc/_recorder.pyx`` is defined here first, in plain
Python, and the test suite runs unchanged against both. This module is also
the fallback when the extension cannot be imported, and is forced with
``TURBOSPARK_PUREPYTHON=1``.

Order of checks, identical in both cores (the first failing one raises, and
nothing is recorded): closed recorder, layer type, layer range, container
type or dtype, shape, empty selection, length against the known ``top_k``,
then each id in position order (type, then range).

With a ``trace_cap`` of N, each layer keeps its first N passes: the trace,
the predictions and record_batch's tags hold rows 0..N-1 only (so every kept
row stays aligned), while counts and passes go on counting every pass; the
JSON then says ``trace_cap`` and, per layer, how many passes it dropped.

The class is composed of mixins that mirror the compiled core's ``.pxi``
files module for file (``recording/_pure/``: ``_core.py`` for ``_core.pxi``,
``_record_one.py``, ``_record_block.py``, ``_record_tagged.py``, ``_tags.py``,
``_json.py``, ``_buffers.py``), so the twins read side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._pure._json import JsonWriter
from ._pure._record_tagged import RecordTagged


class RecorderCore(RecordTagged, JsonWriter):
    """Counts, trace and predictions of one capture; see ``RouterHistogram``.

    A call validates and prepares everything first, then commits with a single
    assignment of ``self._state`` (rebuilt first if code it ran, a signal
    handler recording or taking rows on this thread, moved the state since
    it was read: ``_commit``). Ids go to the append-only trace and
    prediction arrays beyond their committed lengths before that, so a signal
    handler or KeyboardInterrupt arriving anywhere in a call sees either the
    whole pass or none of it, as the compiled core guarantees by running no
    Python code while it commits. The lock is re-entrant so that a signal
    handler running in a thread that is mid-call can still write the capture.
    """


if TYPE_CHECKING:
    from ._types import RecorderCoreAPI

    def _conforms(core: RecorderCore) -> RecorderCoreAPI:
        """Fails type checking when this core drifts from the interface the facade relies on."""
        return core
