"""After each step: the static buffer's rows to the recorder, read at once on the host or staged on the device.

Both hand-overs take ``step(total, tags, now)`` once per step, outside every
compiled or captured region, and record exactly the same calls in the same
order (the tests run the same engine both ways and compare the files). Each
closes the engine step with the recorder's ``mark_step`` right after that
step's rows are recorded (the capture's ``step_passes``: one step per
``execute_model`` that scheduled tokens), so a capture never holds a step's
rows without its mark, whenever the rows are recorded.

``Direct`` (CPU workers, the default there): the static buffer lives in host
memory, so the step's rows are read where they lie (numpy views) and
recorded at once.

``DeviceStaging`` (every non-CPU worker; on a CPU worker with
``TURBOSPARK_VLLM_STAGING=device``, which is how the tests run this path
without a GPU): reading a device buffer after each step would be a host sync
per step. So a step only enqueues device work on the stream it ran on: every
routed layer's rows of the step into a staging area (one copy), the layers'
row counts into a per-step log (one copy), the counts reset (one fill), and
an event. Its tags stay on the host. Nothing on the device is read until a
flush: when the staging area or the step log is full, at the first step
``FLUSH_EVERY`` seconds after the last flush, and before every write of the
recorder (its drain: checkpoints, the idle write, the signal and exit
writes). A flush copies the staged rows to pinned host memory on a side
stream that waits on the last step's event (so it may run from any thread),
waits for that copy (the one host sync, once per flush), and records the
steps in order, marking each step's end as it records it (a mark reads the
recorder's per-layer pass counts on the host, not the device). A router that
wrote too few rows is reported by the flush that reads its count.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, NoReturn, Optional

import numpy as np
import torch

from turbospark.recording import _env
from turbospark.torch import _to_host

from . import _checks, _signals
from ._data_parallel import RankRows, misplaced
from ._buffer import NOT_CALLED, StaticBuffer
from ._requests import StepTags

__all__ = ["FLUSH_EVERY", "MAX_STEPS", "STAGE_BYTES", "STAGING", "DeviceStaging", "Direct", "choose", "refuse_rows",
           "unwritten_marker"]

STAGING = "TURBOSPARK_VLLM_STAGING"
# Staged ids per flush at most (plus one step's worth when a step is larger):
# 32 MiB on the device and 32 MiB pinned on the host.
STAGE_BYTES = 32 << 20
# Staged steps per flush at most (the row-count log's length).
MAX_STEPS = 1024
# Seconds between flushes while steps run: the checkpoint thread and a SIGKILL
# see the device's rows at most this much (plus one step) late.
FLUSH_EVERY = 1.0


def refuse_rows(layers: list[int], seen: list[int], total: int, data_parallel: Optional[str] = None) -> NoReturn:
    """Raise RuntimeError for a step whose row counts ``seen`` (one per routed layer) cannot be recorded.

    ``data_parallel``: a data-parallel rank's reason (``_data_parallel.describe``),
    used unless a layer never called ``capture_fn`` at all.
    """
    for layer, n in zip(layers, seen):
        if n == NOT_CALLED:
            raise RuntimeError(
                f"turbospark: the router of MoE layer {layer} never called capture_fn in this step; "
                "the capture would be silently incomplete"
            )
    if data_parallel is not None:
        raise RuntimeError(data_parallel)
    layer, n = min(zip(layers, seen), key=lambda pair: pair[1])
    raise RuntimeError(
        f"turbospark: the router of MoE layer {layer} routed {n} rows for a step of {total} tokens; "
        "this dispatch layout is not supported"
    )


def choose(device: torch.device, environ: Any) -> str:
    """``"direct"`` or ``"device"`` for a worker on ``device``, from ``TURBOSPARK_VLLM_STAGING`` (empty: by device).

    Raises ``_checks.Refused`` for another value, or ``direct`` on a non-CPU
    worker (a host read of a device buffer would sync every step).
    """
    if device.type not in ("cpu", "cuda"):
        raise _checks.Refused(
            f"turbospark: the vLLM plugin records on CPU and CUDA workers; this worker runs on {device} (its "
            f"streams are not ordered by the device hand-over); unset {_env.HIST}")
    raw = environ.get(STAGING, "")
    default = "direct" if device.type == "cpu" else "device"
    choice = raw or default
    if choice not in ("direct", "device"):
        raise _checks.Refused(f"turbospark: {STAGING}={raw!r}: expected 'direct' or 'device' (or unset: {default!r} "
                              f"on this {device.type} worker); or unset {_env.HIST}")
    if choice == "direct" and device.type != "cpu":
        raise _checks.Refused(
            f"turbospark: {STAGING}=direct reads the static buffer on the host after every step, a host sync per "
            f"step on this {device} worker; unset {STAGING} (device staging), or unset {_env.HIST}")
    return choice


def unwritten_marker(buffer: StaticBuffer, staging: str) -> Callable[[], None]:
    """What marks every routed layer's row count unwritten for ``staging``: a host write (``direct``), a device
    fill without a sync (``device``)."""
    if staging == "device":
        def fill() -> None:
            buffer.rows.fill_(NOT_CALLED)

        return fill
    rows = memoryview(buffer.rows.numpy())
    unwritten = memoryview(np.full(buffer.rows.shape[0], NOT_CALLED, dtype=np.int64))

    def mark() -> None:
        rows[:] = unwritten

    return mark


class Direct:
    """The CPU hand-over: each step's rows recorded from views of the host buffer, at once.

    ``ranks``: a data-parallel rank's ``RankRows`` (set by the session), else None.
    """

    ranks: Optional[RankRows] = None

    def __init__(self, recorder: Any, buffer: StaticBuffer, layers: list[int]) -> None:
        self._recorder = recorder
        self._layers = layers
        ids = buffer.ids.numpy()
        # The routed layers' row counts, and what resets them before a step (memoryviews: the cheapest
        # reads and writes from Python).
        self._rows = memoryview(buffer.rows.numpy())
        self._reset = memoryview(np.full(len(layers), NOT_CALLED, dtype=np.int64))
        # Per routed layer: its slot of the static buffer (views: valid for the buffer's life).
        self._blocks = [(layer, ids[slot]) for slot, layer in enumerate(layers)]
        self._tags: Optional[StepTags] = None
        self._offset = 0
        self._calls: list[tuple[int, Any, Any, str]] = []
        # Built on the thread that runs the steps (the worker's).
        self._held = _signals.held_here()

    def mark_unwritten(self) -> None:
        """Mark every routed layer's rows unwritten (before a data-parallel rank's forward)."""
        self._rows[:] = self._reset

    def step(self, total: int, tags: StepTags, now: float) -> None:
        """One ``min`` over the row counts (a ``max`` too on a DP rank), then one ``record_batch`` per layer and
        run, then the step's ``mark_step``.

        The calls' arguments (views of the static buffer, the run's sequence
        ids) are built once per distinct layout and offset, and reused while
        steps repeat it.
        """
        rows = self._rows
        ranks = self.ranks
        if ranks is None:
            offset: Optional[int] = 0 if min(rows) >= total else None
        else:
            offset = ranks.offset(rows, total)
        if offset is None:
            seen = rows.tolist()
            refuse_rows(self._layers, seen, total, None if ranks is None else ranks.refusal(seen, total))
        rows[:] = self._reset
        if tags is not self._tags or offset != self._offset:
            self._tags = tags
            self._offset = offset
            self._calls = [(layer, block[offset + start:offset + stop], seq, phase)
                           for layer, block in self._blocks for start, stop, phase, seq in tags.pieces]
        record = self._recorder.record_batch
        # A signal's write waits for the whole step (_signals.Held): never some layers' rows without the others',
        # nor a step's rows without its mark.
        held = self._held
        held.depth += 1
        try:
            for layer, block, seq, phase in self._calls:
                record(layer, block, seq=seq, phase=phase)
            self._recorder.mark_step()
        finally:
            held.depth -= 1
            if held.pending and not held.depth:
                held.run_pending()


class DeviceStaging:
    """The device hand-over: steps staged with device copies only, recorded at each flush (see the module).

    ``rows``: staged rows per flush (default: ``STAGE_BYTES`` worth, at least
    one step); ``flush_every``: seconds between flushes while steps run;
    ``gathered``: on a data-parallel rank, whether the routers see every
    rank's rows (``_data_parallel``); ``ranks``: that rank's ``RankRows``
    (set by the session), else None.
    """

    ranks: Optional[RankRows] = None

    def __init__(self, recorder: Any, buffer: StaticBuffer, layers: list[int], *, rows: Optional[int] = None,
                 flush_every: float = FLUSH_EVERY, gathered: bool = False) -> None:
        slots, _, top_k = buffer.ids.shape
        # A step stages this rank's tokens only (a data-parallel rank's buffer holds every rank's).
        step_rows = buffer.step_tokens
        if rows is None:
            rows = max(step_rows, STAGE_BYTES // (slots * top_k * 4))
        if rows < step_rows:
            raise ValueError(f"the staging area must hold one step ({step_rows} rows), got rows={rows}")
        self._recorder = recorder
        self._buffer = buffer
        self._layers = layers
        self._gathered = gathered
        self._flush_every = flush_every
        self.capacity = rows
        device = buffer.ids.device
        self._device = device
        cuda = device.type == "cuda"
        with torch.inference_mode(False):
            # Rows in step order, every layer's row beside the others: the staged part is one contiguous
            # block, so its copy to the host is one plain (pinned, asynchronous) copy.
            self._ids = torch.empty((rows, slots, top_k), dtype=torch.int32, device=device)
            self._counts = torch.empty((MAX_STEPS, slots), dtype=torch.int64, device=device)
            self._host_ids = torch.empty((rows, slots, top_k), dtype=torch.int32, pin_memory=cuda)
            self._host_counts = torch.empty((MAX_STEPS, slots), dtype=torch.int64, pin_memory=cuda)
        # Views made once, so a step slices each source and target once: the static buffer row-major by
        # token, and one row of the count log per staged step.
        self._by_token = buffer.ids.transpose(0, 1)
        self._count_rows = self._counts.unbind(0)
        self._side = torch.cuda.Stream(device) if cuda else None
        self._ready = torch.cuda.Event() if cuda else None
        # Per staged step: where its rows start, its tokens, its tags, and on a DP rank the rows every layer
        # must have reported with the step's per-rank counts (else None, None: at least the step's tokens).
        self._steps: list[tuple[int, int, StepTags, Optional[int], Optional[list[int]]]] = []
        self._pos = 0
        self._last_flush = time.monotonic()
        # Reentrant, with a busy flag: a signal handler's write (the same thread, mid-step or mid-flush)
        # must neither deadlock nor see half a step; it skips the flush and the exit path does it.
        self._lock = threading.RLock()
        self._busy = False
        # A flush that found a step it cannot record, on any thread: every later step raises it, so the
        # engine stops as the direct hand-over's would (a checkpoint thread's flush can only report it).
        self._failed: Optional[RuntimeError] = None
        # Built on the thread that runs the steps (the worker's).
        self._held = _signals.held_here()
        recorder._add_drain(self.flush)

    @property
    def staged_steps(self) -> int:
        """Steps staged on the device and not yet recorded."""
        return len(self._steps)

    def mark_unwritten(self) -> None:
        """Mark every routed layer's rows unwritten (before a data-parallel rank's forward): a device fill."""
        self._buffer.rows.fill_(NOT_CALLED)

    def step(self, total: int, tags: StepTags, now: float) -> None:
        """Stage one step: three device ops and an event, no host read of device data.

        Raises RuntimeError when a flush (this one's, or an earlier one on any
        thread) found a step it cannot record.
        """
        held = self._held
        held.depth += 1
        try:
            self._step(total, tags, now)
        finally:
            held.depth -= 1
            if held.pending and not held.depth:
                held.run_pending()

    def _step(self, total: int, tags: StepTags, now: float) -> None:
        if self._failed is not None:
            raise self._failed
        with self._lock:
            self._busy = True
            try:
                if (self._pos + total > self.capacity or len(self._steps) == MAX_STEPS
                        or now - self._last_flush >= self._flush_every):
                    self._flush_staged(now)
                ranks = self.ranks
                offset, expected, counts = (0, None, None) if ranks is None else ranks.place(total, self._gathered)
                at = self._pos
                buffer = self._buffer
                self._ids[at:at + total].copy_(self._by_token[offset:offset + total])
                self._count_rows[len(self._steps)].copy_(buffer.rows)
                buffer.rows.fill_(NOT_CALLED)
                if self._ready is not None:
                    self._ready.record(torch.cuda.current_stream(self._device))
                self._steps.append((at, total, tags, expected, counts))
                self._pos = at + total
            finally:
                self._busy = False

    def flush(self) -> None:
        """Record every staged step, in order; the recorder's drain (before each of its writes)."""
        held = _signals.held_here()  # any thread: the checkpoint thread's flushes too
        held.depth += 1
        try:
            with self._lock:
                if self._busy:
                    return
                self._busy = True
                try:
                    self._flush_staged(time.monotonic())
                finally:
                    self._busy = False
        finally:
            held.depth -= 1
            if held.pending and not held.depth:
                held.run_pending()

    def _flush_staged(self, now: float) -> None:
        try:
            self._flush_steps(now)
        except RuntimeError as exc:
            self._failed = exc
            raise

    def _flush_steps(self, now: float) -> None:
        self._last_flush = now
        steps = self._steps
        if not steps:
            return
        n, m = self._pos, len(steps)
        self._to_host(n, m)
        # One host transpose per flush: each layer's rows of a step become a contiguous slice.
        ids = np.ascontiguousarray(self._host_ids[:n].numpy().transpose(1, 0, 2))
        counts = self._host_counts[:m].numpy().copy()
        self._steps = []
        self._pos = 0
        record = self._recorder.record_batch
        # The recorder's drain is this flush: the mark's drain finds it busy and returns.
        mark = self._recorder.mark_step
        layers = self._layers
        for (at, total, tags, expected, across), seen in zip(steps, counts):
            low, high = int(seen.min()), int(seen.max())
            if low < total if expected is None else not low == high == expected:
                reason = None
                if expected is not None and self.ranks is not None:
                    reason = misplaced(seen.tolist(), total, across, self.ranks.rank, self._gathered)
                refuse_rows(layers, seen.tolist(), total, reason)
            for slot, layer in enumerate(layers):
                block = ids[slot, at:at + total]
                for start, stop, phase, seq in tags.pieces:
                    record(layer, block[start:stop], seq=seq, phase=phase)
            mark()

    def _to_host(self, n: int, m: int) -> None:
        # The side stream starts after the last staged step's copies (its event, recorded on the stream
        # that step ran on), whichever thread flushes.
        pairs = [(self._host_ids[:n], self._ids[:n]), (self._host_counts[:m], self._counts[:m])]
        if self._side is None:
            _to_host(None, pairs)
            return
        # On the worker's GPU: a checkpoint thread's current device is GPU 0, and switching streams there
        # would make it a CUDA context on GPU 0 for every recording worker.
        with torch.cuda.device(self._device):
            _to_host(self._side, pairs, self._ready)
