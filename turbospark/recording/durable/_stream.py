"""trace="stream": the rows a recorder takes out of its core, appended to the sidecar by a background thread.

The core buffers at most ``CHUNK_IDS`` ids (plus one call's block) before it
asks the facade to take them (``_spill``); the taken rows wait here for the
writer thread, at most ``PENDING`` chunks of them, so the recorder's memory
stays bounded however long it runs. The caller's thread only copies the rows
out of the core and queues them; narrowing to the file's id width, the
checksums and the system calls run on the writer thread (numpy's cast,
``zlib.crc32`` and ``os.pwrite`` release the GIL for large buffers).

The core's take appends to ``inbox`` in the step that empties the core
(``_take_chunk(into)``), so the queue is in take order and a write that
waits for it to drain has every row taken before its own on disk. On the
main thread every stretch holding the queue's lock is a ``_held.Stretch``: a
signal handler's write there could wait for the writer thread while it waits
for the lock. No ``fsync`` runs under the lock.

A chunk is written with one ``pwrite`` at the end of the last whole chunk. A
failed write (disk full) is cut back off the file, reported once per message
on stderr, and its rows are counted as lost per layer: the summary says how
many (``"lost_passes"``) and exactly which (``"lost_rows"``: per layer, the
``[first, stop)`` ranges), and the frames' ``first`` indices show the gap.
"""

from __future__ import annotations

import errno
import os
import threading
from types import ModuleType
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np


def _posix_locks() -> Optional[ModuleType]:
    """The fcntl module, or None where there is none (not POSIX)."""
    try:
        import fcntl
    except ImportError:
        return None
    return fcntl


fcntl = _posix_locks()

from . import _held, _lifecycle
from ...capture import _stream_format as fmt
from ...capture._steps import StepsChunk
from ..._atomic import describe_os_error, fsync_directory
from .._types import TakenRows

#: Ids the core holds before they are taken out (4 bytes each while in the core).
CHUNK_IDS = 1 << 20
#: Chunks taken but not yet written, at most; a full queue makes the caller wait (the disk is behind).
PENDING = 2


def rows_in(ids: Optional[bytes], width: int) -> int:
    """Rows of ``width`` uint32 ids in a taken buffer (``_take_chunk``'s trace or predictions bytes)."""
    return len(ids or b"") // (4 * width) if width else 0


class Written(NamedTuple):
    """What the sidecar holds after a flush: its size, and per layer the rows on disk and lost."""

    size: int
    passes: list[int]
    predictions: list[int]
    lost_passes: list[int]
    lost_predictions: list[int]
    lost_rows: list[list[tuple[int, int]]] = []
    lost_prediction_rows: list[list[tuple[int, int]]] = []
    lost_steps: list[tuple[int, int]] = []


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, adjacent ones joined (a disk full for an hour is one range per layer, not one a chunk)."""
    out: list[tuple[int, int]] = []
    for first, stop in sorted(ranges):
        if out and out[-1][1] == first:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((first, stop))
    return out


class StreamBusy(OSError):
    """The sidecar is another live recorder's (its lock is held): two recorders on one path are refused."""


def _create_owned(path: str) -> int:
    """A new sidecar at ``path``, locked (``flock``) for as long as its descriptor is open.

    A new file, never the old one truncated: a capture loaded from the old
    sidecar maps it, and truncating a mapped file under a reader makes its next
    access a SIGBUS. An old sidecar whose lock is held belongs to a recorder
    still recording: ``StreamBusy``, rather than two recorders silently
    writing one capture. The old file's lock is held while it is unlinked and
    the new one locked, and a file that changed meanwhile is looked at again,
    so of recorders starting together on one path exactly one proceeds.
    """
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    for _ in range(8):
        old = None
        try:
            old = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            pass
        try:
            if old is not None:
                if not _lock(old):
                    raise StreamBusy(errno.EBUSY, "another streamed recorder is recording to it (it holds the "
                                     "file's lock); give each recorder its own path ({rank} or {pid} in it)", path)
                if not _same_file(old, path):
                    continue  # replaced meanwhile: look at the new one
                os.unlink(path)
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue  # another recorder made it first: look at it
            if _lock(fd) and _same_file(fd, path):
                return fd
            os.close(fd)  # another recorder took it over at once: it records, this one does not
            raise StreamBusy(errno.EBUSY, "another streamed recorder started on it at the same moment", path)
        finally:
            if old is not None:
                os.close(old)
    raise StreamBusy(errno.EBUSY, "it kept changing while this recorder started (other recorders on one path?)", path)


def _lock(fd: int) -> bool:
    if fcntl is None:
        return True  # no flock here: the refusal is not available, the run id still tells two runs apart
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return True  # a file system without flock: as without fcntl
        raise
    return True


def _same_file(fd: int, path: str) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class StreamWriter:
    """The sidecar of one streamed recorder: created (a new file, locked) at construction, appended to by a thread."""

    def __init__(self, path: str, num_layers: int, num_experts: int, run: bytes = fmt.NO_RUN) -> None:
        header = fmt.pack_header(num_layers, num_experts, run)  # ValueError for sizes it cannot hold: no file yet
        self.path = path
        self.run = run
        self._num_layers = num_layers
        self._dtype = fmt.id_dtype(fmt.id_bytes(num_experts))
        self._fd: Optional[int] = _create_owned(path)
        self._size = 0
        try:
            self._append(header)
            # The new name durable at once: a JSON that names the sidecar must never outlive its entry.
            fsync_directory(os.path.dirname(os.path.abspath(path)))
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self._passes = [0] * num_layers
        self._predictions = [0] * num_layers
        self._lost_passes = [0] * num_layers
        self._lost_predictions = [0] * num_layers
        # The chunks taken but not yet written, oldest first: the core's take appends to it in the same
        # step that empties its buffers (_take_chunk(into)), so every row is always in one of the two.
        # Marked engine steps (capture._steps.StepsChunk) join it the same way (StepMarks.take_into).
        self.inbox: list[Any] = []
        self._sync_error: Optional[OSError] = None
        self._lost_rows: list[list[tuple[int, int]]] = [[] for _ in range(num_layers)]
        self._lost_prediction_rows: list[list[tuple[int, int]]] = [[] for _ in range(num_layers)]
        self._lost_steps: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self._failures: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="turbospark-stream", daemon=True)
        self._thread.start()

    # Every stretch that holds the queue's lock on the main thread is a _held.Stretch: a signal
    # handler's write there would wait for the writer while the writer waits for the lock (a hang),
    # and a Ctrl-C between taking the lock and the block's cleanup would leave it taken.

    def wait_for_room(self) -> None:
        """Wait while PENDING chunks are already queued (the disk is behind); call before a take."""
        with _held.Stretch(interrupts=True), self._cond:
            while len(self.inbox) >= PENDING and self._thread.is_alive():
                self._cond.wait()

    def notify(self) -> None:
        """Wake the writer after a take appended a chunk to ``inbox``."""
        with _held.Stretch(interrupts=True), self._cond:
            self._cond.notify_all()

    def flush(self) -> Written:
        """Wait until every queued chunk is written, make the file durable, and say what it holds.

        The queue's lock is not held across the ``fsync``: a recording thread
        handing over a chunk meanwhile never waits for the disk. Raises
        OSError when the file cannot be made durable, and again at every
        later flush: after a failed ``fsync`` the kernel may have dropped
        the pages it could not write and report the next ``fsync`` clean, so
        no later summary may count the frames written before it.
        """
        with _held.Stretch(interrupts=True), self._cond:
            self._cond.notify_all()
            while (self.inbox or self._busy) and self._thread.is_alive():
                self._cond.wait()
            self._lose_stranded()
            written = Written(self._size, list(self._passes), list(self._predictions), list(self._lost_passes),
                              list(self._lost_predictions), [_merged(r) for r in self._lost_rows],
                              [_merged(r) for r in self._lost_prediction_rows], _merged(self._lost_steps))
            fd = self._fd
        if fd is not None:
            self._sync(fd)
        return written

    def close(self) -> None:
        """Flush, stop the thread, close the file; idempotent."""
        with _held.Stretch(interrupts=True), self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        with _held.Stretch(interrupts=True), self._cond:
            self._lose_stranded()
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self._sync(fd)
            finally:
                os.close(fd)

    def _sync(self, fd: int) -> None:
        if self._sync_error is not None:
            raise OSError(self._sync_error.errno, "an earlier fsync of the trace failed "
                          f"({describe_os_error(self._sync_error)}): frames written before it may not be on disk",
                          self.path)
        try:
            os.fsync(fd)
        except OSError as exc:
            self._sync_error = exc
            raise

    def _lose_stranded(self) -> None:
        """Chunks queued after the writer stopped (a take after close): counted as lost, never silently."""
        if not self._thread.is_alive():
            while self.inbox:
                self._lose(self.inbox.pop(0), "the trace's writer has stopped")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.inbox and not self._stopping:
                    self._cond.wait()
                if not self.inbox:
                    return
                item = self.inbox.pop(0)
                self._busy = True
                self._cond.notify_all()
            try:
                self._write_chunk(item)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _lose(self, item: Any, why: str) -> None:
        """Count a chunk that cannot be written as lost, and say why once per message."""
        if isinstance(item, StepsChunk):
            self._lost_steps.append((item.first, item.first + item.counts.shape[0]))
            self._report(why, "those engine steps are said lost in the capture")
            return
        width, rows = item
        if not any(part for layer in rows for part in layer[1:3]):
            return
        for layer, (first, trace, pred, _, _, pred_first) in enumerate(rows):
            passes, predictions = rows_in(trace, width), rows_in(pred, width)
            self._lost_passes[layer] += passes
            self._lost_predictions[layer] += predictions
            if passes:
                self._lost_rows[layer].append((first, first + passes))
            if predictions:
                self._lost_prediction_rows[layer].append((pred_first, pred_first + predictions))
        self._report(why)

    def _report(self, why: str, then: str = "those passes are counted and said lost in the capture") -> None:
        message = f"[router-hist] FAILED streaming the trace to {self.path}: {why}"
        if message not in self._failures:
            self._failures.add(message)
            _lifecycle.report(f"{message}; {then}")

    def _write_chunk(self, item: Any) -> None:
        try:
            if isinstance(item, StepsChunk):
                counts = item.counts.astype(fmt.STEP_DTYPE)
                self._append(fmt.pack_frame(fmt.STEPS, 0, 0, counts.shape[0], counts.shape[1], item.first,
                                            counts.tobytes()))
            else:
                self._append_chunk(*item)
        except OSError as exc:
            self._lose(item, describe_os_error(exc))
        except Exception as exc:  # noqa: BLE001 -- the thread must go on; the rows are counted
            self._lose(item, f"{type(exc).__name__}: {exc}")

    def _append_chunk(self, width: int, rows: Sequence[TakenRows]) -> None:
        frames = []
        passes = [0] * self._num_layers
        predictions = [0] * self._num_layers
        for layer, (first, trace, pred, seq, phase, pred_first) in enumerate(rows):
            if trace:
                ids = np.frombuffer(trace, dtype=np.uint32)
                n = ids.shape[0] // width
                narrow = ids.astype(self._dtype).tobytes()
                if seq is not None and phase is not None:  # the core takes both tag columns or neither
                    flags, payload = fmt.TAGGED, seq + narrow + phase
                else:
                    flags, payload = 0, narrow
                frames.append(fmt.pack_frame(fmt.PASSES, flags, layer, n, width, first, payload))
                passes[layer] = n
            if pred:
                ids = np.frombuffer(pred, dtype=np.uint32)
                n = ids.shape[0] // width
                frames.append(fmt.pack_frame(fmt.PREDICTIONS, 0, layer, n, width, pred_first,
                                             ids.astype(self._dtype).tobytes()))
                predictions[layer] = n
        self._append(b"".join(frames))
        for layer in range(self._num_layers):
            self._passes[layer] += passes[layer]
            self._predictions[layer] += predictions[layer]

    def _append(self, data: bytes) -> None:
        """Write ``data`` after the last whole chunk; on failure cut the file back there and raise OSError."""
        assert self._fd is not None
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], self._size + done)
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass  # the reader stops at the torn frame anyway
            raise
        self._size += len(view)
