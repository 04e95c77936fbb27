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
"""

from __future__ import annotations

import threading
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, SupportsIndex

import numpy as np

from . import _convert, _counts, _errors, _sequences
from ._types import Inbox, LogitRow, RowMask, SelectedBlock, SelectedIds, Taken, TakenRows


def _selection(selected: Any, expected: int, num_experts: int) -> array[int]:
    """Validate one pass's ids; return them as a uint32 array, or raise."""
    if isinstance(selected, (list, tuple)):
        items = selected
    elif isinstance(selected, np.ndarray) or _convert.is_array_like(selected):
        arr = _convert.as_array(selected, _convert.ONE_D)
        _convert.check_length(arr.shape[0], expected)
        return array("I", _convert.array_ids(arr, num_experts).tobytes())
    elif _convert.is_iterable_selection(selected):
        items = list(selected)
    else:
        raise _errors.selection_type(selected)
    _convert.check_length(len(items), expected)
    return array("I", _convert.sequence_ids(items, num_experts))


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


class RecorderCore:
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

    def _add_selection(self, index: int, ids: array[int], rows: int, added: Optional[list[int]],
                       tags: Optional[tuple[np.ndarray, int]] = None) -> None:
        """Append ``rows`` validated passes of ``ids`` (``added``: per expert, how many of them; None:
        count them here), with their (sequence ids, phase) ``tags`` when given, and commit them all at once."""
        width = len(ids) // rows
        while True:
            state = self._recheck(width)
            layer = state.layers[index]
            if added is None:
                counts = list(layer.counts)
                for expert in ids:
                    counts[expert] += 1
            else:
                counts = [old + new for old, new in zip(layer.counts, added)]
            # Under a cap only the rows before it are kept (the first N passes of the layer).
            first = self._kept(layer.passes)
            keep = self._kept(layer.passes + rows) - first
            trace_len = layer.trace_len
            if self._trace is not None:
                _append(self._trace[index], trace_len, ids[: keep * width])
                trace_len += keep * width
            tag_len = layer.tag_len
            if tags is not None:
                # Untagged passes before these read as the defaults; then this block's tags.
                seq, phase = self._seq[index], self._phase[index]
                # Tag positions count from the passes already taken out (trace="stream").
                first -= layer.taken
                pad = first - tag_len
                _append(seq, tag_len, array("q", [_sequences.DEFAULT_SEQ] * pad))
                seq.frombytes(tags[0][:keep].astype(np.int64, copy=False).tobytes())
                _append(phase, tag_len, array("B", [_sequences.DEFAULT_PHASE] * pad + [tags[1]] * keep))
                tag_len = first + keep
            top_k = state.top_k or width
            if self._commit(state, index, layer._replace(counts=tuple(counts), trace_len=trace_len,
                                                         passes=layer.passes + rows, tag_len=tag_len),
                            top_k, state.pred_k, tags is not None):
                break
        self._unspilled += rows * width

    def record(self, layer: SupportsIndex, selected: SelectedIds) -> None:
        with self._lock:
            index, state = self._begin(layer)
            ids = _selection(selected, state.top_k or state.pred_k, self._num_experts)
            self._add_selection(index, ids, 1, None)
        if self._unspilled >= self._spill_at:
            self._spill()

    def _block(self, layer: Any, selected: Any, mask: Any) -> tuple[int, _State, np.ndarray]:
        """Validate a block call: (layer index, state, the selected rows' ids as a private uint32 copy)."""
        index, state = self._begin(layer)
        if not (isinstance(selected, (np.ndarray, list, tuple)) or _convert.is_array_like(selected)):
            raise _errors.selection_type(selected)
        arr = _convert.as_array(selected, _convert.TWO_D)
        _convert.check_length(arr.shape[1], state.top_k or state.pred_k)
        return index, state, _convert.block_ids(arr, self._num_experts, mask)

    def record_many(self, layer: SupportsIndex, selected: SelectedBlock, mask: Optional[RowMask] = None) -> None:
        with self._lock:
            index, _, ids = self._block(layer, selected, mask)
            self._add_block(index, ids, None)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_batch(self, layer: SupportsIndex, ids_2d: SelectedBlock, *, seq: Any, phase: str,
                     mask: Optional[RowMask] = None) -> None:
        """Record a block of passes that belong to different sequences, in one phase.

        Takes ``ids_2d`` (n, top_k) integer ids (ndarray, nested list or CPU
        tensor), ``seq`` one non-negative sequence id per row (list, ndarray or
        CPU tensor), ``phase`` ``"prompt"`` or ``"decode"`` for every row, and
        an optional boolean ``mask`` of length n: only the rows it keeps are
        validated and recorded (the others may hold anything, e.g. -1 padding,
        except that a dropped row's ``seq`` entry must still be an integer,
        of any value: a str, float, bool or None there raises TypeError).
        Counts and trace are exactly those of ``record_many`` with the kept
        rows; the capture then also carries each pass's sequence id and phase,
        committed with the passes in one step (no write, signal handler or
        other thread sees a pass without its tag). Raises what ``record_many``
        raises, and TypeError/ValueError for a bad ``seq``, ``phase`` or
        ``mask``; a rejected call records nothing.

        Checks, in order: closed, layer, phase, the block's container and
        shape, mask, seq (one integer per row, non-negative int64 where
        kept), then the ids; each into a private copy. The passes and
        their tags commit together.
        """
        with self._lock:
            index, _ = self._begin(layer)
            code = _sequences.phase_code(phase)
            block = _sequences.block_copy(ids_2d)
            keep = _sequences.mask_copy(mask, block.shape[0])
            seq_ids = _sequences.seq_copy(seq, block.shape[0], keep)
            index, _, ids = self._block(index, block, keep)
            self._add_block(index, ids, (seq_ids, code))
        if self._unspilled >= self._spill_at:
            self._spill()

    def _add_block(self, index: int, ids: np.ndarray, tags: Optional[tuple[np.ndarray, int]]) -> None:
        rows = ids.shape[0]
        if rows == 0:
            return
        added = np.bincount(ids.ravel(), minlength=self._num_experts).tolist()
        self._add_selection(index, array("I", ids.tobytes()), rows, added, tags)

    def record_prediction(self, layer: SupportsIndex, predicted: SelectedIds) -> None:
        with self._lock:
            index, state = self._begin(layer)
            expected = state.top_k or state.pred_k
            ids = _selection(predicted, expected, self._num_experts)
            self._add_predictions(index, ids)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_prediction_many(
        self, layer: SupportsIndex, predicted: SelectedBlock, mask: Optional[RowMask] = None
    ) -> None:
        with self._lock:
            index, _, ids = self._block(layer, predicted, mask)
            if ids.shape[0]:
                self._add_predictions(index, array("I", ids.tobytes()), ids.shape[1])
        if self._unspilled >= self._spill_at:
            self._spill()

    def _add_predictions(self, index: int, ids: array[int], width: int = 0) -> None:
        """Append validated predictions (rows of ``width`` ids; one row when 0) and commit."""
        width = width or len(ids)
        while True:
            state = self._recheck(width)
            expected = state.top_k or state.pred_k
            if self._pred is None:
                return
            current = state.layers[index]
            # Under a cap a layer keeps its first N predictions, aligned with the first N passes.
            first = current.pred_len // width
            keep = self._kept(first + len(ids) // width) - first
            _append(self._pred[index], current.pred_len, ids[: keep * width])
            pred_k = width if expected == 0 else state.pred_k
            if self._commit(state, index, current._replace(pred_len=current.pred_len + keep * width), state.top_k,
                            pred_k):
                break
        self._unspilled += len(ids)

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
        return _rows(self._trace[index][: state.layers[index].trace_len], state.top_k)

    def _predictions_array(self, layer: Any) -> Optional[np.ndarray]:
        index = _convert.check_layer(layer, self._num_layers)
        state = self._state
        if self._pred is None:
            return None
        return _rows(self._pred[index][: state.layers[index].pred_len], state.top_k or state.pred_k)

    def _logits_capture(self) -> Optional[tuple[int, int, Optional[array[float]]]]:
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def _json_document(self, tail: bytes, summary: bool = False) -> bytes:
        """The JSON document up to ``router_logits``, followed by ``tail``.

        ``summary``: only the sizes and ``counts`` before ``tail`` (a streamed
        capture's JSON, whose trace, predictions and tags live in its sidecar).
        """
        state = self._state  # one consistent snapshot, whatever runs meanwhile
        num_experts = self._num_experts if self._num_layers else 0
        parts = [
            f'{{"num_layers":{self._num_layers},"num_experts":{num_experts},'
            f'"top_k":{state.top_k},"counts":[{_json_rows(layer.counts for layer in state.layers)}]'
        ]
        if summary:
            return "".join(parts).encode("ascii") + tail
        if self._trace is not None:
            rows = (flat[: layer.trace_len] for flat, layer in zip(self._trace, state.layers))
            parts.append(f',"trace":[{_json_rows(rows)}]')
            if self._cap is not None:
                dropped = [layer.passes - self._kept(layer.passes) for layer in state.layers]
                parts.append(f',"trace_cap":{self._cap},"trace_dropped":[{",".join(map(str, dropped))}]')
        if self._pred is not None:
            rows = (flat[: layer.pred_len] for flat, layer in zip(self._pred, state.layers))
            parts.append(f',"pred":[{_json_rows(rows)}]')
        head = "".join(parts).encode("ascii") + tail
        if not state.tagged:
            return head
        seq_rows = (_padded(flat, layer.tag_len, self._kept(layer.passes) - layer.taken, _sequences.DEFAULT_SEQ)
                    for flat, layer in zip(self._seq, state.layers))
        phase_rows = (_padded(flat, layer.tag_len, self._kept(layer.passes) - layer.taken, _sequences.DEFAULT_PHASE)
                      for flat, layer in zip(self._phase, state.layers))
        return head + f',"seq":[{_json_rows(seq_rows)}],"phase":[{_json_rows(phase_rows)}]'.encode("ascii")


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
                        seq = array("q", _padded(self._seq[index], layer.tag_len, passes,
                                                 _sequences.DEFAULT_SEQ)).tobytes()
                        phase = bytes(_padded(self._phase[index], layer.tag_len, passes, _sequences.DEFAULT_PHASE))
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


def _append(flat: array[int], committed: int, ids: array[int]) -> None:
    """Put ``ids`` after the ``committed`` ids of ``flat``, dropping an uncommitted tail first."""
    del flat[committed:]
    flat.extend(ids)


def _padded(column: Any, tagged: int, passes: int, default: int) -> list[int]:
    """A layer's committed tags, then the default for each pass recorded without one."""
    values = column[:tagged].tolist()
    values.extend([default] * (passes - tagged))
    return values


def _json_rows(rows: Any) -> str:
    return ",".join("[" + ",".join(map(str, row)) + "]" for row in rows)


def _rows(flat: array[int], width: int) -> np.ndarray:
    data = np.frombuffer(flat, dtype=np.uint32).copy() if len(flat) else np.zeros(0, dtype=np.uint32)
    return data.reshape(-1, width) if width else data.reshape(0, 0)


if TYPE_CHECKING:
    from ._types import RecorderCoreAPI

    def _conforms(core: RecorderCore) -> RecorderCoreAPI:
        """Fails type checking when this core drifts from the interface the facade relies on."""
        return core
