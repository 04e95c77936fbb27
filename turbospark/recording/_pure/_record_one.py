"""``record`` and ``record_prediction``: one pass of ids, validated into a private copy, then committed.

Twin of ``csrc/_record_one.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
``_add_selection`` and ``_add_predictions`` are the commits every recording
method ends in (``_commit_selection``/``_commit_prediction`` there).
"""

from __future__ import annotations

from array import array
from typing import Any, Optional, SupportsIndex

import numpy as np

from .. import _convert, _errors
from .._types import SelectedIds
from . import _tags
from ._buffers import append
from ._core import Core


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


class RecordOne(Core):
    """One pass (or prediction) at a time, and the commits of every recording method."""

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
                append(self._trace[index], trace_len, ids[: keep * width])
                trace_len += keep * width
            tag_len = layer.tag_len
            if tags is not None:
                # Untagged passes before these read as the defaults; then this block's tags.
                seq, phase = self._seq[index], self._phase[index]
                # Tag positions count from the passes already taken out (trace="stream").
                first -= layer.taken
                pad = first - tag_len
                append(seq, tag_len, array("q", [_tags.DEFAULT_SEQ] * pad))
                seq.frombytes(tags[0][:keep].astype(np.int64, copy=False).tobytes())
                append(phase, tag_len, array("B", [_tags.DEFAULT_PHASE] * pad + [tags[1]] * keep))
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

    def record_prediction(self, layer: SupportsIndex, predicted: SelectedIds) -> None:
        with self._lock:
            index, state = self._begin(layer)
            expected = state.top_k or state.pred_k
            ids = _selection(predicted, expected, self._num_experts)
            self._add_predictions(index, ids)
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
            append(self._pred[index], current.pred_len, ids[: keep * width])
            pred_k = width if expected == 0 else state.pred_k
            if self._commit(state, index, current._replace(pred_len=current.pred_len + keep * width), state.top_k,
                            pred_k):
                break
        self._unspilled += len(ids)
