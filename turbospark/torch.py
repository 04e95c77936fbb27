"""Recording router top-k ids that live on a device, without a host sync per layer.

``DeviceRecorder`` wraps a ``RouterHistogram``. Its per-layer calls take device
tensors and only enqueue device work: the ids are copied into a preallocated
device staging buffer (static addresses, so the calls can be captured in a CUDA
graph), with a per-row keep flag (from a mask and/or a valid-row count that may
itself be a device tensor) and a per-row sequence id. Nothing is read on the
host until a flush, which copies the staged rows to pinned host memory on a
side stream, waits for that copy (the one sync), and hands the rows to the
recorder in call order. A flush happens when the staging buffer is full, when
``flush()`` is called, and before every write of the recorder (``close()``,
``with`` exit, drop, interpreter exit, the SIGTERM path): nothing staged is
lost or written twice.

With the recorder's trace and probe off, the device path is counts-only: each
call adds to an (L, E) device count matrix with ``index_add_``, and only those
counts and the per-layer pass totals cross to the host.

This module imports torch; ``import turbospark`` never imports it.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Optional, Union

import numpy as np
import torch

from .recording import _errors, _sequences
from .recording._convert import check_layer

__all__ = ["COUNTS_ONLY_CAPACITY", "DEFAULT_CAPACITY", "DeviceRecorder", "GraphRegion", "staging_bytes"]

# Rows of top_k ids staged before a flush: for top-8, 5.1 MiB on the device
# and 4.6 MiB of pinned host memory (see staging_bytes).
DEFAULT_CAPACITY = 65536
# Counts-only: rows counted per chunk of a call (scratch space, not a limit).
COUNTS_ONLY_CAPACITY = 4096

_SELECTION, _PREDICTION = 0, 1
# A staged call with no sequence information.
_NO_PHASE = -1


def staging_bytes(capacity: int, top_k: int) -> tuple[int, int]:
    """(device bytes, host bytes) of a staging buffer of ``capacity`` rows of ``top_k`` ids.

    A row is top_k int64 ids, one int64 sequence id and one bool keep flag,
    on the device and again in (pinned) host memory; the device also holds an
    int64 row index per row.
    """
    row = 8 * top_k + 8 + 1
    return capacity * (row + 8), capacity * row


class _Call(NamedTuple):
    """One staged per-layer call, as the host knows it (no device values)."""

    kind: int
    layer: int
    start: int
    rows: int
    phase: int


class _Host(NamedTuple):
    """One staged call's rows, copied to the host, ready to hand to the recorder."""

    call: _Call
    ids: np.ndarray
    keep: np.ndarray
    seq: np.ndarray


class _Buffers:
    """Ids, keep flags and sequence ids of ``capacity`` rows on one device."""

    def __init__(self, capacity: int, top_k: int, device: torch.device, pin: bool) -> None:
        self.ids = torch.zeros((capacity, top_k), dtype=torch.int64, device=device, pin_memory=pin)
        self.keep = torch.zeros(capacity, dtype=torch.bool, device=device, pin_memory=pin)
        self.seq = torch.zeros(capacity, dtype=torch.int64, device=device, pin_memory=pin)

    def copy_rows(self, source: "_Buffers", start: int, rows: int, at: int = 0) -> None:
        for mine, theirs in ((self.ids, source.ids), (self.keep, source.keep), (self.seq, source.seq)):
            mine[at : at + rows].copy_(theirs[start : start + rows], non_blocking=True)


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
            capacity = COUNTS_ONLY_CAPACITY if counts_only else DEFAULT_CAPACITY
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
            # Columns E and E + 1 collect dropped rows and out-of-range ids.
            self._counts = torch.zeros((self._num_layers, self._num_experts + 2), dtype=torch.int64, device=dev)
            self._passes = torch.zeros(self._num_layers, dtype=torch.int64, device=dev)
            self._block = torch.zeros((capacity, self._top_k), dtype=torch.int64, device=dev)
            self._keep = torch.zeros(capacity, dtype=torch.bool, device=dev)
            self._flags = torch.zeros((capacity, self._top_k), dtype=torch.bool, device=dev)
            self._dropped = torch.zeros(capacity, dtype=torch.bool, device=dev)
            self._ones = torch.ones(1, dtype=torch.int64, device=dev).expand(capacity * self._top_k)
            self._host_counts = torch.zeros(self._counts.shape, dtype=torch.int64, pin_memory=self._cuda)
            self._host_passes = torch.zeros(self._num_layers, dtype=torch.int64, pin_memory=self._cuda)
        else:
            self._staged = _Buffers(capacity, self._top_k, dev, False)
            self._host = _Buffers(capacity, self._top_k, torch.device("cpu"), self._cuda)
        self._released = False

    def _release(self) -> None:
        """Free the staging buffers once the recorder is closed and drained: nothing can join it now."""
        if self._released:
            return
        self._released = True
        for name in ("_arange", "_counts", "_passes", "_block", "_keep", "_flags", "_dropped", "_ones",
                     "_host_counts", "_host_passes", "_staged", "_host"):
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
            from .recording.durable import _lifecycle

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
            device = [self._counts, self._passes, self._block, self._keep, self._flags, self._dropped,
                      self._arange, self._ones[:1]]
            host = [self._host_counts, self._host_passes]
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
            ids = self._check_ids(ids)
            rows = ids.shape[0]
            self._check_rows("mask", mask, rows, torch.bool)
            self._check_valid(valid)
            code = self._check_seq(seq, phase, rows)
            if self._counts_only:
                if kind == _SELECTION:
                    for start in range(0, rows, self._capacity):
                        self._count(index, ids, start, min(rows, start + self._capacity), valid, mask)
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

    def _check_ids(self, ids: Any) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor on {self._device}, got {type(ids).__name__}")
        if ids.device != self._device:
            raise TypeError(f"ids are on device {str(ids.device)!r}, this recorder stages on {str(self._device)!r}")
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"ids must have an integer dtype, got {ids.dtype}")
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[1] != self._top_k:
            raise ValueError(f"ids must be (n, {self._top_k}) or ({self._top_k},), got shape {tuple(ids.shape)}")
        return ids

    def _check_rows(self, name: str, value: Any, rows: int, dtype: Optional[torch.dtype]) -> None:
        if value is None:
            return
        if not isinstance(value, torch.Tensor) or value.device != self._device:
            where = str(value.device) if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(f"{name} must be a tensor on {str(self._device)!r}, got {where}")
        if dtype is not None and value.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {value.dtype}")
        if dtype is None and (value.dtype == torch.bool or value.is_floating_point() or value.is_complex()):
            raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
        if tuple(value.shape) != (rows,):
            raise ValueError(f"{name} must have shape ({rows},), got {tuple(value.shape)}")

    def _check_valid(self, valid: Any) -> None:
        if valid is None:
            return
        if isinstance(valid, torch.Tensor):
            if valid.device != self._device or valid.numel() != 1:
                raise TypeError(f"valid must be an int or a one-element tensor on {str(self._device)!r}")
            if valid.dtype == torch.bool or valid.is_floating_point() or valid.is_complex():
                raise TypeError(f"valid must have an integer dtype, got {valid.dtype}")
            return
        if isinstance(valid, bool) or not isinstance(valid, int) or valid < 0:
            raise TypeError(f"valid must be a non-negative int or a device tensor, got {valid!r}")

    def _check_seq(self, seq: Any, phase: Any, rows: int) -> int:
        if seq is None and phase is None:
            return _NO_PHASE
        if seq is None or phase is None:
            raise ValueError("seq and phase come together: give both or neither")
        code = _sequences.phase_code(phase)
        if self._counts_only:
            raise ValueError(
                "sequence ids need per-pass data, which counts-only recording does not move to the host: "
                "create the DeviceRecorder with counts_only=False"
            )
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq < 0:
                raise ValueError(f"seq holds a negative sequence id {seq}")
            return code
        self._check_rows("seq", seq, rows, None)
        return code

    # ------------------------------------------------------------ counts-only

    def _count(self, index: int, ids: torch.Tensor, start: int, stop: int, valid: Any, mask: Any) -> None:
        """Count rows start..stop of one call into the device counts."""
        rows, e = stop - start, self._num_experts
        block = self._block[:rows]
        block.copy_(ids[start:stop])
        keep = self._keep[:rows]
        # Row start + i is kept when start + i < valid: compare i with valid - start.
        shifted = valid if valid is None or start == 0 else valid - start
        _keep_rows(keep, self._arange, rows, shifted, None if mask is None else mask[start:stop])
        flags = self._flags[:rows]
        # Out-of-range ids go to column E + 1, dropped rows to column E.
        torch.lt(block, 0, out=flags)
        block.masked_fill_(flags, e + 1)
        torch.ge(block, e, out=flags)
        block.masked_fill_(flags, e + 1)
        dropped = self._dropped[:rows]
        torch.logical_not(keep, out=dropped)
        block.masked_fill_(dropped.unsqueeze(1), e)
        self._counts[index].index_add_(0, block.view(-1), self._ones[: rows * self._top_k])
        self._passes[index : index + 1].add_(keep.sum())

    def _flush_counts(self) -> None:
        if self._hist.closed:
            return  # drained before closing; nothing can join a closed recorder
        _to_host(self._side, [(self._host_counts, self._counts), (self._host_passes, self._passes)])
        self._counts.zero_()
        self._passes.zero_()
        counts = self._host_counts.numpy().copy()
        passes = self._host_passes.numpy().copy()
        bad = counts[:, self._num_experts + 1]
        good = bad == 0
        e = self._num_experts
        if good.any():
            self._hist._add_counts(np.where(good[:, None], counts[:, :e], 0), np.where(good, passes, 0), self._top_k)
        if not good.all():
            layers = np.nonzero(~good)[0].tolist()
            raise ValueError(
                f"expert ids outside [0, {e}) in kept rows of layer(s) {layers} "
                f"({int(bad.sum())} ids): those layers' passes since the last flush were not recorded"
            )

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
                self._flush_counts()
                return
            if self._calls:
                n = self._pos
                _to_host(self._side, [(self._host.ids[:n], self._staged.ids[:n]),
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


# ---------------------------------------------------------------- helpers


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _keep_rows(keep: torch.Tensor, arange: torch.Tensor, rows: int, valid: Any, mask: Any) -> None:
    """keep[i] = i < valid and mask[i], on the device."""
    if valid is None:
        keep.fill_(True)
    else:
        torch.lt(arange[:rows], valid, out=keep)
    if mask is not None:
        keep.logical_and_(mask)


def _write_rows(buffers: _Buffers, arange: torch.Tensor, call: _Call, ids: torch.Tensor, valid: Any, mask: Any, seq: Any) -> None:
    part = slice(call.start, call.start + call.rows)
    buffers.ids[part].copy_(ids)
    _keep_rows(buffers.keep[part], arange, call.rows, valid, mask)
    if isinstance(seq, torch.Tensor):
        buffers.seq[part].copy_(seq)
    else:
        buffers.seq[part].fill_(0 if seq is None else seq)


def _to_host(side: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]], ready: Any = None) -> None:
    """Copy device tensors into (pinned) host tensors on the side stream and wait for them.

    ``ready``: an event recorded after the work that writes the sources (the
    vLLM plugin's flush, which may run on another thread than that work);
    default: what the calling thread's current stream has enqueued so far.
    """
    if side is None:
        for host, dev in pairs:
            host.copy_(dev)
        return
    # The host waits for this copy only, and the buffers are reused after it.
    if ready is None:
        side.wait_stream(torch.cuda.current_stream(side.device))
    else:
        side.wait_event(ready)
    with torch.cuda.stream(side):
        for host, dev in pairs:
            host.copy_(dev, non_blocking=True)
    done = torch.cuda.Event()
    done.record(side)
    done.synchronize()


def _hand_over(hist: Any, item: _Host) -> None:
    # The recorder applies the keep mask itself: it validates only the kept
    # rows, and an error names the row as the call numbered it.
    call = item.call
    if call.kind == _PREDICTION:
        hist.record_prediction_many(call.layer, item.ids, mask=item.keep)
    elif call.phase != _NO_PHASE:
        hist.record_batch(call.layer, item.ids, seq=item.seq, phase=_sequences.PHASE_NAMES[call.phase], mask=item.keep)
    else:
        hist.record_many(call.layer, item.ids, mask=item.keep)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while staged calls are handed over, so a handler never sees one half-moved."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
