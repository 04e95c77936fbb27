"""The streamed capture's part of ``RouterHistogram`` (trace="stream"): hand-overs and the summary JSON.

``Streaming`` is the lowest of the facade's mixins (``recorder.py`` composes
them): it moves the core's committed rows into the stream writer's queue
(``_hand_over``, the one path of every hand-over) and builds the JSON of a
streamed capture, whose trace lives in the sidecar ``path + ".trace"``
(``_streamed_document``). The sidecar's format is ``_stream_format``'s; the
writer thread is ``_stream.StreamWriter``.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Optional

from .durable import _held, _lifecycle, _stream
from ..capture import _stream_format
from .._atomic import describe_os_error
from ._backend import CoreBase
from ..capture._f32display import logits_member
from ..capture._steps import StepMarks
from ._types import Taken


class Streaming(CoreBase):
    """A streamed recorder's hand-over of rows to its writer, and the JSON that counts the rows on disk."""

    _path: str
    _owner_pid: int
    _stream: Optional[_stream.StreamWriter]
    # The serial of the summary this thread's last _streamed_document built (see recorder._Writes).
    _serial_here: threading.local
    _step_marks: Optional[StepMarks] = None  # set by the first mark_step (capture/_steps.py)

    @property
    def streamed(self) -> bool:
        """True for trace="stream": the trace goes to the sidecar ``path + ".trace"``, the JSON holds the rest."""
        return getattr(self, "_stream", None) is not None

    def _spill(self) -> None:
        # The core's call once it holds CHUNK_IDS untaken ids (trace="stream"): queue them for the writer.
        self._hand_over()

    def _hand_over(self) -> Taken:
        """Take every committed row out of the core into the writer's queue, in one step; every hand-over's path.

        The core appends the rows to the queue in the step that empties it
        (``_take_chunk(into)``), so no other thread's write, no signal
        handler and no Ctrl-C ever finds them in neither place; and the main
        thread's hand-over is a ``_held.Stretch``: a held-aware handler (the
        opt-in SIGTERM one, the vLLM plugin's) and a Ctrl-C landing in it run
        as it ends. The wait for room in the queue (the disk is behind) comes
        first, before anything is taken.
        """
        stream = self._stream
        if stream is None or os.getpid() != self._owner_pid:
            # A forked child's copy drops them: it never writes its parent's files, and stays bounded.
            taken = self._take_chunk(None)
            self._hand_over_steps(taken, None)
            return taken
        stream.wait_for_room()
        with _held.Stretch(interrupts=True):
            taken = self._take_chunk(stream.inbox)
            self._hand_over_steps(taken, stream.inbox)
        stream.notify()
        return taken

    def _hand_over_steps(self, taken: Taken, inbox: Optional[list[Any]]) -> None:
        """The marked steps the taken rows complete, after them into ``inbox`` (None: dropped)."""
        marks = self._step_marks
        if marks is not None:
            width, rows = taken[1], taken[2]
            marks.take_into([first + _stream.rows_in(trace, width) for first, trace, *_ in rows], inbox)

    def _streamed_document(self) -> tuple[bytes, int]:
        """A streamed capture's JSON, every row so far written to the sidecar and made durable first; and its serial.

        The summary (sizes, counts, ``"stream"``, the logit row) and the rows
        are taken in one step, so the counts it states are exactly those of
        the passes on disk (and of those said lost to failed writes). The
        serial orders the summaries of takes by several threads: a later
        take's is never replaced by an earlier one's (``write``).
        """
        assert self._stream is not None
        if os.getpid() != self._owner_pid:
            raise RuntimeError(f"a forked child cannot write the streamed capture {self._path!r} of its parent")
        head, width, rows, logits, serial = self._hand_over()
        # Every step handed over by now (this take's, and any a later take by another thread handed
        # over) is in the queue: the flush writes it.
        steps = self._step_marks.handed if self._step_marks is not None else 0
        # Every chunk queued before this one is written first (the queue is in take order).
        written = self._stream.flush()
        # What the counts in ``head`` cover: every row taken up to now. Another thread's chunk
        # taken after this one may already be on disk too; the reader recovers it.
        passes = [first + _stream.rows_in(trace, width) for first, trace, _, _, _, _ in rows]
        predictions = [first + _stream.rows_in(pred, width) for _, _, pred, _, _, first in rows]
        stream = (f',"stream":{{"format":{_stream_format.VERSION},"run":"{self._stream.run.hex()}",'
                  f'"file":"{_json_name(self._stream.path)}",'
                  f'"bytes":{written.size},"passes":{_ints(passes)}')
        if self.pilot_enabled():
            stream += f',"predictions":{_ints(predictions)}'
        # The flush also waited for chunks other threads took after this take; the rows those lost are
        # beyond the passes this summary counts: a later summary says them, this one must not.
        lost_rows = [_within(ranges, stop) for ranges, stop in zip(written.lost_rows, passes)]
        lost_preds = [_within(ranges, stop) for ranges, stop in zip(written.lost_prediction_rows, predictions)]
        lost_passes, lost_predictions = _sizes(lost_rows), _sizes(lost_preds)
        if any(lost_passes) or any(lost_predictions):
            stream += f',"lost_passes":{_ints(lost_passes)},"lost_predictions":{_ints(lost_predictions)}'
            stream += f',"lost_rows":{_ranges(lost_rows)},"lost_prediction_rows":{_ranges(lost_preds)}'
        if self._step_marks is not None:
            # The marked steps are in the sidecar (kind 2 frames), as the rows are; the JSON says how many.
            stream += f',"steps":{steps}'
            lost_steps = _within(written.lost_steps, steps)
            if lost_steps:
                stream += ',"lost_steps":[' + ",".join(f"[{a},{b}]" for a, b in lost_steps) + "]"
        self._serial_here.value = serial
        return head + stream.encode("ascii") + b"}" + logits_tail(logits) + b"}", serial

    def _refuse_streamed(self, what: str) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            raise ValueError(f"{what}(): the trace is streamed to {stream.path!r} (trace='stream'); "
                             "write() the capture and read it with turbospark.load")

    def _close_stream(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None and os.getpid() == self._owner_pid:
            try:
                stream.close()
            except OSError as exc:
                _lifecycle.report(f"[router-hist] FAILED closing {stream.path}: {describe_os_error(exc)}")


def logits_tail(capture: Any) -> bytes:
    """The ``router_logits`` member (values through ``_f32display``, Rust's f32 ``Display``), or nothing."""
    if capture is None:
        return b""
    return logits_member(*capture).encode("ascii")


def _ints(values: list[int]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


def _within(ranges: list[tuple[int, int]], stop: int) -> list[tuple[int, int]]:
    """The parts of the ``[first, stop)`` ``ranges`` before row ``stop``."""
    return [(first, min(end, stop)) for first, end in ranges if first < stop]


def _sizes(per_layer: list[list[tuple[int, int]]]) -> list[int]:
    return [sum(end - first for first, end in ranges) for ranges in per_layer]


def _ranges(per_layer: list[list[tuple[int, int]]]) -> str:
    """Per layer, its ``[first, stop)`` row ranges as JSON: ``[[[a,b],...],...]``."""
    return "[" + ",".join("[" + ",".join(f"[{a},{b}]" for a, b in ranges) + "]" for ranges in per_layer) + "]"


def _json_name(path: str) -> str:
    """The sidecar's name as the JSON states it: relative to the capture's directory, escaped for a JSON string."""
    return json.dumps(os.path.basename(path))[1:-1]


