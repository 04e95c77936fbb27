"""Pure-Python recorder core: the reference the compiled core must match.

Every behaviour of ``csrc/_recorder.pyx`` is defined here first, in plain
Python, and the test suite runs unchanged against both. This module is also
the fallback when the extension cannot be imported, and is forced with
``TURBOSPARK_PUREPYTHON=1``.

Order of checks, identical in both cores (the first failing one raises, and
nothing is recorded): closed recorder, layer type, layer range, container
type or dtype, shape, empty selection, length against the known ``top_k``,
then each id in position order (type, then range).
"""

from __future__ import annotations

import threading
from array import array
from typing import Any, Optional

import numpy as np

from . import _convert, _errors


def _selection(selected: Any, expected: int, num_experts: int) -> array:
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


class RecorderCore:
    """Counts, trace and predictions of one capture; see ``RouterHistogram``."""

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        top_k: int,
        trace: bool,
        pilot: Optional[str],
        logits_layer: int,
        logits_pass: int,
    ) -> None:
        if hasattr(self, "_counts"):
            raise RuntimeError("a recorder core is initialised once")
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._top_k = top_k
        # Length of the first prediction made while top_k was still unknown,
        # so that every later selection and prediction agrees with it.
        self._pred_k = 0
        self._counts = [[0] * num_experts for _ in range(num_layers)]
        self._passes = [0] * num_layers
        self._trace = [array("I") for _ in range(num_layers)] if trace else None
        self._pred = [array("I") for _ in range(num_layers)] if pilot is not None else None
        self._self_test = pilot == "self"
        self._logits_layer = logits_layer
        self._logits_pass = logits_pass
        self._logits: Optional[array] = None
        self._closed = False
        # The compiled core is atomic per call under the GIL; this lock gives
        # the Python core the same guarantee.
        self._lock = threading.Lock()

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_experts(self) -> int:
        return self._num_experts

    @property
    def top_k(self) -> int:
        return self._top_k

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def trace_enabled(self) -> bool:
        return self._trace is not None

    def pilot_offset(self) -> int:
        return 0 if self._self_test else 1

    def pilot_enabled(self) -> bool:
        return self._pred is not None

    def _expected_k(self) -> int:
        return self._top_k or self._pred_k

    def record(self, layer: Any, selected: Any) -> None:
        with self._lock:
            if self._closed:
                raise _errors.closed()
            index = _convert.check_layer(layer, self._num_layers)
            ids = _selection(selected, self._expected_k(), self._num_experts)
            row = self._counts[index]
            for expert in ids:
                row[expert] += 1
            if self._top_k == 0:
                self._top_k = len(ids)
            if self._trace is not None:
                self._trace[index].extend(ids)
            self._passes[index] += 1

    def record_many(self, layer: Any, selected: Any) -> None:
        with self._lock:
            if self._closed:
                raise _errors.closed()
            index = _convert.check_layer(layer, self._num_layers)
            if not (
                isinstance(selected, (np.ndarray, list, tuple)) or _convert.is_array_like(selected)
            ):
                raise _errors.selection_type(selected)
            arr = _convert.as_array(selected, _convert.TWO_D)
            rows, width = arr.shape
            _convert.check_length(width, self._expected_k())
            ids = _convert.array_ids(arr, self._num_experts)
            if rows == 0:
                return
            row = self._counts[index]
            for expert, times in enumerate(np.bincount(ids.ravel(), minlength=self._num_experts).tolist()):
                row[expert] += times
            if self._top_k == 0:
                self._top_k = width
            if self._trace is not None:
                self._trace[index].frombytes(ids.tobytes())
            self._passes[index] += rows

    def record_prediction(self, layer: Any, predicted: Any) -> None:
        with self._lock:
            if self._closed:
                raise _errors.closed()
            index = _convert.check_layer(layer, self._num_layers)
            expected = self._expected_k()
            ids = _selection(predicted, expected, self._num_experts)
            if self._pred is None:
                return
            if expected == 0:
                self._pred_k = len(ids)
            self._pred[index].extend(ids)

    def record_router_logits(self, layer: Any, logits: Any) -> None:
        with self._lock:
            if self._closed:
                raise _errors.closed()
            index = _convert.check_layer(layer, self._num_layers)
            got = _convert.logits_length(logits)
            if got != self._num_experts:
                raise _errors.logits_length(got, self._num_experts)
            if (
                index != self._logits_layer
                or self._passes[index] != self._logits_pass
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

    def counts_array(self) -> np.ndarray:
        return np.array(self._counts, dtype=np.uint64).reshape(self._num_layers, self._num_experts)

    def passes_array(self) -> np.ndarray:
        return np.array(self._passes, dtype=np.uint64)

    def trace_array(self, layer: Any) -> Optional[np.ndarray]:
        index = _convert.check_layer(layer, self._num_layers)
        if self._trace is None:
            return None
        return _rows(self._trace[index], self._top_k)

    def predictions_array(self, layer: Any) -> Optional[np.ndarray]:
        index = _convert.check_layer(layer, self._num_layers)
        if self._pred is None:
            return None
        return _rows(self._pred[index], self._expected_k())

    def logits_capture(self) -> Optional[tuple[int, int, Optional[array]]]:
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def json_document(self, tail: bytes) -> bytes:
        """The JSON document up to ``router_logits``, followed by ``tail``."""
        with self._lock:
            num_experts = self._num_experts if self._num_layers else 0
            parts = [
                f'{{"num_layers":{self._num_layers},"num_experts":{num_experts},'
                f'"top_k":{self._top_k},"counts":[{_json_rows(self._counts)}]'
            ]
            if self._trace is not None:
                parts.append(f',"trace":[{_json_rows(self._trace)}]')
            if self._pred is not None:
                parts.append(f',"pred":[{_json_rows(self._pred)}]')
        return "".join(parts).encode("ascii") + tail


def _json_rows(rows: Any) -> str:
    return ",".join("[" + ",".join(map(str, row)) + "]" for row in rows)


def _rows(flat: array, width: int) -> np.ndarray:
    data = np.frombuffer(flat, dtype=np.uint32).copy() if len(flat) else np.zeros(0, dtype=np.uint32)
    return data.reshape(-1, width) if width else data.reshape(0, 0)
