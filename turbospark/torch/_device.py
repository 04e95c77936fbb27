"""``DeviceRecorder``: per-layer calls on device tensors, staged with no host sync; and ``GraphRegion``.

The staging rows are ``_buffers``'; counts-only recording is ``_counts.DeviceCounts``;
the host-side checks of a call are ``_checks``'; the copies to the host and the
hand-over to the recorder are ``_transfer``'s (see the package's docstring).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Optional, Union

import torch

from ..recording import _errors
from ..recording._convert import check_layer
from . import _buffers, _transfer
from ._buffers import _SELECTION, _PREDICTION, _Buffers, _bytes, _Call, _Host, _write_rows
from ._checks import check_ids, check_rows, check_seq, check_valid
from ._counts import DeviceCounts
from ._transfer import _hand_over, _signals_held


class DeviceRecorder:
    """Per-layer recording of device tensors into a ``RouterHistogram``, with no host sync per call.

    ``DeviceRecorder(hist, *, device=None, top_k=None, capacity=None,
    counts_only=None)``: ``hist`` an open recorder; ``device`` where the ids
    live (default: the current CUDA device when CUDA is available, else the
    CPU); ``top_k`` needed when ``hist.top_k`` is still 0; ``counts_only``
    defaults to True exactly when the recorder's trace and probe are both off.
    ``capacity``: the staging rows (default ``DEFAULT_CAPACITY``; one call
    may not stage more; see ``staging_bytes``), or counts-only, the rows
    counted per chunk of a call (default ``COUNTS_ONLY_CAPACITY``; longer
    calls are counted in chunks). ``memory()`` gives the bytes allocated.

    Raises ValueError/TypeError for a closed recorder, an unknown or
    conflicting top_k, a capacity below 1, or counts-only with the trace or
    probe on.
    """

    def __init__(
        self,
        hist: Any,
        *,
        device: Union[torch.device, str, None] = None,
        top_k: Optional[int] = None,
        capacity: Optional[int] = None,
        counts_only: Optional[bool] = None,
    ) -> None:
        if hist.closed:
            raise _errors.closed()
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        if hist.top_k and top_k is not None and top_k != hist.top_k:
            raise ValueError(f"top_k={top_k} conflicts with the recorder's top_k={hist.top_k}")
        k = hist.top_k or top_k
        if not k:
            raise ValueError("top_k is unknown: the recorder has not learnt it yet, so pass top_k=")
        ids_kept = hist.trace_enabled or hist.pilot_enabled()
        if counts_only is None:
            counts_only = not ids_kept
        elif counts_only and ids_kept:
            raise ValueError("counts_only needs the recorder's trace and pilot probe off: they keep every id")
        if capacity is None:
            capacity = _buffers.COUNTS_ONLY_CAPACITY if counts_only else _buffers.DEFAULT_CAPACITY
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive number of rows, got {capacity!r}")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            # Tensors report cuda:N, never a bare "cuda": compare like with like.
            device = torch.device("cuda", torch.cuda.current_device())
        self._device = device
        self._cuda = self._device.type == "cuda"
        self._hist = hist
        self._top_k = int(k)
        self._capacity = capacity
        self._counts_only = bool(counts_only)
        self._num_layers = int(hist.num_layers)
        self._num_experts = int(hist.num_experts)
        self._lock = threading.RLock()
        self._calls: list[_Call] = []
        self._pending: deque[_Host] = deque()
        self._pos = 0
        self._region: Optional[GraphRegion] = None
        with torch.inference_mode(False):
            # Tensors made in inference mode may not be updated in place outside
            # it: a recorder built inside one must still flush after it ends.
            self._allocate(capacity)
        hist._add_drain(self.flush)

    def _allocate(self, capacity: int) -> None:
        dev = self._device
        self._arange = torch.arange(capacity, dtype=torch.int64, device=dev)
        self._side = torch.cuda.Stream(device=dev) if self._cuda else None
        if self._counts_only:
            self._tally = DeviceCounts(self._num_layers, self._num_experts, self._top_k, capacity, dev, self._arange,
                                       self._cuda)
        else:
            self._staged = _Buffers(capacity, self._top_k, dev, False)
            self._host = _Buffers(capacity, self._top_k, torch.device("cpu"), self._cuda)
        self._released = False

    def _release(self) -> None:
        """Free the staging buffers once the recorder is closed and drained: nothing can join it now."""
        if self._released:
            return
        self._released = True
        for name in ("_arange", "_tally", "_staged", "_host"):
            if hasattr(self, name):
                delattr(self, name)

    def _after_fork_in_child(self) -> None:
        # Another thread may have held the lock at fork(): it stays held in the child.
        self._lock = threading.RLock()

    def __del__(self) -> None:
        # The recorder holds this stager weakly: dropped first, it hands its rows over now.
        hist = getattr(self, "_hist", None)
        if hist is None or getattr(self, "_released", True) or hist.closed:
            return
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 -- a finalizer never raises
            from ..recording.durable import _lifecycle

            _lifecycle.report(f"[router-hist] FAILED recording staged ids for {hist.path}: {exc}")

    # ------------------------------------------------------------ properties

    @property
    def device(self) -> torch.device:
        """Where the staged ids live."""
        return self._device

    @property
    def top_k(self) -> int:
        return self._top_k

    @property
    def capacity(self) -> int:
        """Staging rows (one row = one pass of top_k ids)."""
        return self._capacity

    @property
    def counts_only(self) -> bool:
        """True when only (L, E) counts cross to the host (trace and probe off)."""
        return self._counts_only

    def memory(self) -> tuple[int, int]:
        """Bytes this recorder allocated: (on its device, in host memory, pinned when the device is CUDA);
        (0, 0) once the recorder is closed and the buffers freed."""
        if self._released:
            return 0, 0
        if self._counts_only:
            device, host = self._tally.tensors()
            device.append(self._arange)
        else:
            device = [self._staged.ids, self._staged.keep, self._staged.seq, self._arange]
            host = [self._host.ids, self._host.keep, self._host.seq]
        return _bytes(device), _bytes(host)

    @property
    def staged_rows(self) -> int:
        """Rows staged on the device and not yet handed to the recorder (a host-side number)."""
        return self._pos

    # ------------------------------------------------------------ per-layer calls

    def record(
        self,
        layer: int,
        ids: torch.Tensor,
        *,
        valid: Union[torch.Tensor, int, None] = None,
        mask: Optional[torch.Tensor] = None,
        seq: Union[torch.Tensor, int, None] = None,
        phase: Optional[str] = None,
    ) -> None:
        """Stage one layer's routed rows: ``ids`` (n, top_k) (or (top_k,) for one row) on the device.

        ``valid``: only the first ``valid`` rows count (an int, or a 0-d
        integer tensor on the device: the count of a CUDA-graph step);
        ``mask``: a (n,) bool device tensor, rows it drops are skipped (both
        may be given: a row counts when it is below ``valid`` and kept by
        ``mask``); ``seq``: each row's sequence id ((n,) integer device tensor,
        or an int for all rows) with ``phase`` ``"prompt"`` or ``"decode"``, as
        ``RouterHistogram.record_batch``. Enqueues device work only: no host
        sync and no host read of a device value, except the flush when the
        staging buffer is full. Raises (recording nothing) for what the host
        can see: a closed recorder, a bad layer, a tensor on another device,
        a wrong dtype or shape. Ids are validated when flushed: the recorder
        then refuses the calls holding a bad id (in kept rows) and ``flush``
        raises ValueError after recording the others.
        """
        self._stage(_SELECTION, layer, ids, valid, mask, seq, phase)

    def record_prediction(
        self,
        layer: int,
        ids: torch.Tensor,
        *,
        valid: Union[torch.Tensor, int, None] = None,
        mask: Optional[torch.Tensor] = None,
    ) -> None:
        """Stage the pilot's predictions for ``layer``, one row per pass; as ``record`` without sequences.

        Counts-only (the probe is off) drops them after the host-side checks.
        """
        self._stage(_PREDICTION, layer, ids, valid, mask, None, None)

    def _stage(self, kind: int, layer: Any, ids: Any, valid: Any, mask: Any, seq: Any, phase: Any) -> None:
        with self._lock:
            if self._hist.closed:
                raise _errors.closed()
            index = check_layer(layer, self._num_layers)
            ids = check_ids(ids, self._device, self._top_k)
            rows = ids.shape[0]
            check_rows("mask", mask, rows, torch.bool, self._device)
            check_valid(valid, self._device)
            code = check_seq(seq, phase, rows, self._device, self._counts_only)
            if self._counts_only:
                if kind == _SELECTION:
                    for start in range(0, rows, self._capacity):
                        self._tally.count(index, ids, start, min(rows, start + self._capacity), valid, mask)
                return
            if rows > self._capacity:
                raise ValueError(f"{rows} rows in one call exceed the staging capacity of {self._capacity} rows")
            region = self._region
            if region is not None:
                region._stage(_Call(kind, index, region._pos, rows, code), ids, valid, mask, seq)
                return
            refused = self._make_room(rows)
            call = _Call(kind, index, self._pos, rows, code)
            _write_rows(self._staged, self._arange, call, ids, valid, mask, seq)
            self._calls.append(call)
            self._pos += rows
            if refused is not None:
                raise refused

    def _make_room(self, rows: int) -> Optional[ValueError]:
        """Flush when ``rows`` more do not fit; returns (not raises) an earlier call's refusal.

        The flush has handed every staged call over by the time it reports a
        refused one, so the call that needed the room is staged before the
        error reaches its caller, never lost with it.
        """
        if self._pos + rows <= self._capacity:
            return None
        try:
            self.flush()
        except ValueError as exc:
            return exc
        return None

    # ------------------------------------------------------------ flushing

    def flush(self) -> None:
        """Hand every staged row to the recorder, in call order; the one host sync of the device path.

        Called automatically when the staging buffer is full and before every
        write of the recorder. Raises ValueError after recording every valid
        call when some staged call held a bad id (it records nothing), as the
        recorder's own calls do.
        """
        with self._lock, _signals_held():
            if self._released:
                return
            try:
                self._flush_staged()
            finally:
                if self._hist.closed:
                    self._release()

    def _flush_staged(self) -> None:
        with torch.inference_mode(False):
            if self._counts_only:
                if not self._hist.closed:  # drained before closing; nothing can join a closed recorder
                    self._tally.flush(self._hist, self._side)
                return
            if self._calls:
                n = self._pos
                _transfer._to_host(self._side, [(self._host.ids[:n], self._staged.ids[:n]),
                                      (self._host.keep[:n], self._staged.keep[:n]),
                                      (self._host.seq[:n], self._staged.seq[:n])])
                ids = self._host.ids[:n].numpy().copy()
                keep = self._host.keep[:n].numpy().copy()
                seq = self._host.seq[:n].numpy().copy()
                for call in self._calls:
                    part = slice(call.start, call.start + call.rows)
                    self._pending.append(_Host(call, ids[part], keep[part], seq[part]))
                self._calls = []
                self._pos = 0
            self._replay()

    def _replay(self) -> None:
        first_error: Optional[BaseException] = None
        while self._pending:
            item = self._pending[0]
            try:
                _hand_over(self._hist, item)
            except (ValueError, TypeError, IndexError) as exc:
                if first_error is None:
                    first_error = exc
            self._pending.popleft()
        if first_error is not None:
            raise ValueError(f"a staged call was refused and recorded nothing: {first_error}") from first_error

    # ------------------------------------------------------------ CUDA graphs

    def graph_region(self, rows: Optional[int] = None) -> "GraphRegion":
        """A region whose per-layer calls go to their own static rows, for capture in a CUDA graph.

        Make the calls of one step inside ``with region:`` while capturing;
        after every replay, call ``region.commit()`` outside the graph: it
        appends that step's rows to the staging buffer with device copies and
        remembers the step's calls on the host. ``rows`` (default the staging
        capacity) bounds the rows of one step. Not available counts-only,
        where the per-layer calls already update static device counts and can
        be captured directly.
        """
        if self._counts_only:
            raise ValueError("counts-only calls need no region: capture them directly")
        return GraphRegion(self, self._capacity if rows is None else rows)


class GraphRegion:
    """The static rows of one captured step; see ``DeviceRecorder.graph_region``."""

    def __init__(self, owner: DeviceRecorder, rows: int) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= owner._capacity:
            raise ValueError(f"rows must be between 1 and the staging capacity {owner._capacity}, got {rows!r}")
        self._owner = owner
        self._rows = rows
        with torch.inference_mode(False):
            self._buffers = _Buffers(rows, owner._top_k, owner._device, False)
        self._calls: list[_Call] = []
        self._pos = 0

    def __enter__(self) -> "GraphRegion":
        with self._owner._lock:
            if self._owner._region is not None:
                raise RuntimeError("another graph region is open on this DeviceRecorder")
            self._calls = []
            self._pos = 0
            self._owner._region = self
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._owner._region = None

    def _stage(self, call: _Call, ids: Any, valid: Any, mask: Any, seq: Any) -> None:
        if self._pos + call.rows > self._rows:
            raise ValueError(f"the graph region holds {self._rows} rows; this step needs more")
        _write_rows(self._buffers, self._owner._arange, call, ids, valid, mask, seq)
        self._calls.append(call)
        self._pos += call.rows

    def commit(self) -> None:
        """After a replay (outside the graph): stage the rows the step just wrote, in order."""
        owner = self._owner
        with owner._lock:
            if owner._hist.closed:
                raise _errors.closed()
            if not self._calls:
                return
            refused = owner._make_room(self._pos)
            base = owner._pos
            owner._staged.copy_rows(self._buffers, 0, self._pos, at=base)
            owner._calls.extend(call._replace(start=call.start + base) for call in self._calls)
            owner._pos += self._pos
            if refused is not None:
                raise refused
