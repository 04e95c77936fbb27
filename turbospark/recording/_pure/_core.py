"""The core's state, construction and teardown, and the private helpers the facade builds on.

Twin of ``csrc/_core.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
The recording methods, which ``_core.pxi`` dispatches to ``_record_one.pxi`` and
``_record_block.pxi``, are the mixins' own here (``_record_one.py`` ...).
"""

from __future__ import annotations

import threading
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, SupportsIndex

import numpy as np

from .. import _convert, _counts, _errors
from .._types import Inbox, LogitRow, Taken, TakenRows
from . import _tags
from ._buffers import rows_array


class _Layer(NamedTuple):
    """One layer's committed state; replaced whole, never changed in place."""

    counts: tuple[int, ...]
    trace_len: int
    pred_len: int
    passes: int
    # Passes with a committed tag (record_batch), counted from ``taken``; later ones read as the defaults.
    tag_len: int = 0
    # trace="stream": passes (and predictions) already taken out by _take_chunk; the buffers hold only the later ones.
    taken: int = 0
    pred_taken: int = 0


class _State(NamedTuple):
    """Everything a call commits, swapped in by one assignment (see RecorderCore)."""

    top_k: int
    # Length of the first prediction made while top_k was still unknown,
    # so that every later selection and prediction agrees with it.
    pred_k: int
    layers: tuple[_Layer, ...]
    # True once a tagged pass was committed: the document then carries seq/phase.
    tagged: bool = False


class Core:
    """A core's state (``_State``, swapped whole) and what is not a recording method; see ``RecorderCore``."""

    if TYPE_CHECKING:
        # The mixins' and the facade's, declared for the methods here that call them.
        def _json_document(self, tail: bytes, summary: bool = False) -> bytes: ...  # _json.JsonWriter

        def _spill(self) -> None: ...  # RouterHistogram's (trace="stream"): hand the untaken rows over

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        top_k: int,
        trace: bool,
        pilot: Optional[str],
        logits_layer: int,
        logits_pass: int,
        trace_cap: Optional[int] = None,
    ) -> None:
        if hasattr(self, "_state"):
            raise RuntimeError("a recorder core is initialised once")
        num_layers, num_experts, top_k, logits_layer, logits_pass = _convert.core_arguments(
            num_layers, num_experts, top_k, pilot, logits_layer, logits_pass
        )
        self._cap = _convert.trace_cap(trace_cap, trace)
        self._num_layers = num_layers
        self._num_experts = num_experts
        layers = (_Layer((0,) * num_experts, 0, 0, 0),) * num_layers if num_layers else ()
        self._state = _State(top_k, 0, layers)
        self._trace = [array("I") for _ in range(num_layers)] if bool(trace) else None
        self._pred = [array("I") for _ in range(num_layers)] if pilot is not None else None
        # record_batch's tags, beyond each layer's tag_len uncommitted (like the trace's ids).
        self._seq = [array("q") for _ in range(num_layers)]
        self._phase = [array("B") for _ in range(num_layers)]
        self._self_test = pilot == "self"
        self._logits_layer = logits_layer
        self._logits_pass = logits_pass
        self._logits: Optional[array[float]] = None
        self._closed = False
        self._lock = threading.RLock()
        self._counts_cache: Optional[tuple[tuple[_Layer, ...], np.ndarray]] = None
        # trace="stream": ids committed since the last _take_chunk, and the count that asks the
        # facade to take them (never, until _stream_every).
        self._unspilled = 0
        self._spill_at: float = float("inf")
        self._takes = 0

    def _after_fork_in_child(self) -> None:
        # A lock another thread held at fork() time stays held in the child.
        self._lock = threading.RLock()

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_experts(self) -> int:
        return self._num_experts

    @property
    def top_k(self) -> int:
        return self._state.top_k

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def trace_enabled(self) -> bool:
        return self._trace is not None

    @property
    def trace_cap(self) -> Optional[int]:
        return self._cap

    def _kept(self, passes: int) -> int:
        """How many of a layer's first ``passes`` passes the trace (and its tags) keep."""
        return passes if self._cap is None else min(passes, self._cap)

    def pilot_offset(self) -> int:
        return 0 if self._self_test else 1

    def pilot_enabled(self) -> bool:
        return self._pred is not None

    def _begin(self, layer: Any) -> tuple[int, _State]:
        if self._closed:
            raise _errors.closed()
        return _convert.check_layer(layer, self._num_layers), self._state

    def _recheck(self, n: int) -> _State:
        # Converting ids may have run code (an __index__, a signal handler)
        # that recorded into this recorder: build on the state as it is now.
        if self._closed:
            raise _errors.closed()
        state = self._state
        expected = state.top_k or state.pred_k
        if expected and n != expected:
            raise _errors.length(n, expected)
        return state

    def _commit(self, state: _State, index: int, layer: _Layer, top_k: int, pred_k: int,
                tagged: bool = False) -> bool:
        """Swap in ``state`` with ``layer`` at ``index``, unless another commit (or a take) came first.

        False when ``self._state`` is no longer ``state``: code that ran
        since it was read (a signal handler recording or writing the capture
        on this thread) changed it, and the caller builds again on the state
        as it is now, as the compiled core, which runs no Python code between
        its read and its commit, always does. Between the check and the swap
        nothing is called, so nothing can run there.
        """
        layers = state.layers
        new = _State(top_k, pred_k, layers[:index] + (layer,) + layers[index + 1 :], state.tagged or tagged)
        if self._state is not state:
            return False
        self._state = new
        return True

    def record_router_logits(self, layer: SupportsIndex, logits: LogitRow) -> None:
        if self._logits_layer < 0:
            return  # no row requested: free, as the reference's call is
        with self._lock:
            index, state = self._begin(layer)
            got = _convert.logits_length(logits)
            if got != self._num_experts:
                raise _errors.logits_length(got, self._num_experts)
            if (
                index != self._logits_layer
                or state.layers[index].passes != self._logits_pass
                or self._logits is not None
            ):
                return
            self._logits = _convert.logit_row(logits, self._num_experts)

    def _mark_closed(self) -> bool:
        """Close for recording; True only for the call that did it."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open

    def _counts_snapshot(self) -> np.ndarray:
        """The counts as a read-only int64 array, rebuilt only when the state changed since the last one."""
        layers = self._state.layers
        cached = self._counts_cache
        if cached is not None and cached[0] is layers:
            return cached[1]
        counts = np.array([layer.counts for layer in layers], dtype=np.int64).reshape(
            self._num_layers, self._num_experts
        )
        counts.setflags(write=False)
        self._counts_cache = (layers, counts)
        return counts

    def _passes_array(self) -> np.ndarray:
        return np.array([layer.passes for layer in self._state.layers], dtype=np.int64)

    def _trace_array(self, layer: Any) -> Optional[np.ndarray]:
        index = _convert.check_layer(layer, self._num_layers)
        state = self._state
        if self._trace is None:
            return None
        return rows_array(self._trace[index][: state.layers[index].trace_len], state.top_k)

    def _predictions_array(self, layer: Any) -> Optional[np.ndarray]:
        index = _convert.check_layer(layer, self._num_layers)
        state = self._state
        if self._pred is None:
            return None
        return rows_array(self._pred[index][: state.layers[index].pred_len], state.top_k or state.pred_k)

    def _logits_capture(self) -> Optional[tuple[int, int, Optional[array[float]]]]:
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def _stream_every(self, ids: int) -> None:
        """Call ``self._spill()`` after any record call that leaves ``ids`` or more ids untaken (trace="stream")."""
        if self._trace is None or self._cap is not None:
            raise ValueError("a streamed trace needs the trace on and no trace_cap")
        self._spill_at = max(int(ids), 1)

    def _take_chunk(self, into: Optional[Inbox] = None) -> Taken:
        """Take every committed row out of the buffers, with the summary they complete.

        Returns ``(head, width, rows, logits, serial)``: the summary document's start
        (sizes and counts, ``_json_document(b"", summary=True)``), the row
        width (top_k, or the predictions' width before it is known), per layer
        ``(passes taken before, trace ids, predictions, seq, phase)`` as raw
        native-order bytes (uint32 ids, int64 sequence ids, uint8 phases; the
        tags padded with the defaults for untagged passes, None before any
        tagged pass), predictions taken before), the router-logit capture,
        all of one instant, and how many takes this core has made (this one
        included). The counts, passes and learned sizes stay.

        ``into`` (the stream's queue) gets ``(width, rows)`` appended in the
        same step that empties the core, so every row is at every instant in
        the core or in the queue, never in neither: no other thread, signal
        handler or Ctrl-C sees it in between. Here the step is the state's
        swap and the append, with no call between them (so no signal handler
        and no other thread can run there); a call that committed meanwhile
        (a handler recording mid-take) makes it start over from the state
        as it is then.
        """
        with self._lock:
            while True:
                state = self._state
                head = self._json_document(b"", summary=True)
                width = state.top_k or state.pred_k
                rows: list[TakenRows] = []
                layers = []
                for index, layer in enumerate(state.layers):
                    passes = layer.passes - layer.taken
                    trace = pred = seq = phase = None
                    if self._trace is not None:
                        trace = self._trace[index][: layer.trace_len].tobytes()
                    if self._pred is not None:
                        pred = self._pred[index][: layer.pred_len].tobytes()
                    if state.tagged:
                        seq = array("q", _tags.padded(self._seq[index], layer.tag_len, passes,
                                                 _tags.DEFAULT_SEQ)).tobytes()
                        phase = bytes(_tags.padded(self._phase[index], layer.tag_len, passes, _tags.DEFAULT_PHASE))
                    rows.append((layer.taken, trace, pred, seq, phase, layer.pred_taken))
                    more = layer.pred_len // width if width else 0
                    layers.append(layer._replace(trace_len=0, pred_len=0, tag_len=0, taken=layer.passes,
                                                 pred_taken=layer.pred_taken + more))
                taken = state._replace(layers=tuple(layers))
                chunk = (width, rows)
                serial = self._takes + 1
                if self._state is state:
                    # The step: nothing between these lines calls anything (see above).
                    self._state = taken
                    self._takes = serial
                    if into is not None:
                        into.append(chunk)
                    break
            self._unspilled = 0
            # The buffers' ids are beyond the committed lengths now: free them (the next call on a
            # layer would drop them anyway), unless a handler committed rows there meanwhile.
            for buffers in (self._trace, self._pred, self._seq, self._phase):
                for flat in buffers or ():
                    if self._state is taken:
                        del flat[:]
            return head, width, rows, self._logits_capture(), serial

    def _add_counts(self, counts: Any, passes: Any, top_k: int) -> None:
        """Add whole passes known by their counts only: ``counts`` (L, E) and ``passes`` (L,) int64.

        For the device path's counts-only mode; refused (ValueError) while the
        trace or the probe is on, or when a row does not sum to passes x top_k.
        Learns ``top_k`` when it was still 0 and passes were added.
        """
        with self._lock:
            if self._closed:
                raise _errors.closed()
            state = self._state
            added, more = _counts.added_counts(
                counts, passes, top_k, self._num_layers, self._num_experts,
                state.top_k or state.pred_k, self._trace is not None or self._pred is not None,
            )
            rows, extras = added.tolist(), more.tolist()
            while True:  # built again if a handler committed meanwhile (see _commit)
                layers = tuple(
                    layer._replace(counts=tuple(a + b for a, b in zip(layer.counts, row)), passes=layer.passes + extra)
                    for layer, row, extra in zip(state.layers, rows, extras)
                )
                top = state.top_k or (top_k if int(more.sum()) else 0)
                new = _State(top, state.pred_k, layers, state.tagged)
                if self._state is state:
                    self._state = new
                    break
                state = self._state
