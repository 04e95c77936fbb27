"""``RouterHistogram``: the public recorder, a thin facade over the chosen core.

The facade is a subclass of the core, not a wrapper around it, so the hot
methods (``record``, ``record_many``, ``record_prediction``,
``record_router_logits``) are the core's own and a call costs no extra Python
frame. The facade adds what is not per-call: argument checking at
construction, environment parsing, the router-logits part of the JSON, and the
file lifecycle (atomic writes, close, write-on-drop, write-at-exit).

It is composed of mixins, one concern each, every one a layer over the ones
below it (so each calls only what is beneath it):

- ``_facade_stream.Streaming``: a streamed capture's hand-overs and summary JSON;
- ``_Staging``: the device path's drains (staged ids handed over before a write);
- ``_Reads``: what the recorder holds, read in memory (``counts``, ``trace`` ...);
- ``_Writes``: the capture's JSON (``_document``) and its writes;
- ``_Checkpoints``: the periodic rewrites while recording;
- ``_Lifecycle``: close, discard, the exit path's write, fork, drop;
- ``_Facade``: construction (``__init__``, ``from_env``, ``from_config``), over all of them.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import weakref
from typing import Any, Optional, TypeVar, Union

import numpy as np
import numpy.typing as npt

from .durable import _checkpoint, _lifecycle, _sigterm, _stream
from . import _convert, _env, _paths
from ..capture import _stream_format
from ._convert import MAX_SIZE as _MAX_SIZE, PILOTS as _PILOTS, whole as _whole
from .._atomic import describe_os_error, write_atomic
from ._backend import BACKEND, CoreBase, RecorderCore
from ._destination import check_destination
from ._facade_stream import Streaming, logits_tail
from ..capture._steps import step_passes_key
from ._facade_steps import Steps
from ._warn import warn_caller

PathLike = Union[str, "os.PathLike[str]"]
_Self = TypeVar("_Self", bound="_Facade")
_Open = TypeVar("_Open", bound="_Lifecycle")

def _path_text(path: Any) -> str:
    try:
        text = os.fsdecode(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__} {path!r}") from None
    if not text:
        raise ValueError("path must not be empty")
    return text


def _logits_request(router_logits: Any, num_layers: int) -> tuple[int, int]:
    if router_logits is None:
        return (-1, 0)
    try:
        layer, pass_ = router_logits
    except (TypeError, ValueError):
        raise TypeError(f"router_logits must be None or a (layer, pass) pair, got {router_logits!r}") from None
    layer = _whole("router_logits layer", layer, 0, num_layers - 1 if num_layers else -1)
    return (layer, _whole("router_logits pass", pass_, 0, 2**64 - 1))


def _useless(layers: int, experts: int, top_k: int, *, from_env: bool) -> list[str]:
    """Why this configuration can only produce a useless capture, phrased as errors for the
    constructor or as warnings for ``from_env`` (which, like the reference, records anyway)."""
    problems = []
    if layers == 0:
        problems.append(
            "num_layers is 0: the recorder can record nothing (every layer index is out of range); recording anyway"
            if from_env
            else "num_layers must be at least 1, got 0: a recorder with no layers can record nothing"
        )
    if top_k > experts:
        problems.append(
            f"top_k={top_k} exceeds num_experts={experts}: a router cannot pick more experts than it has"
            + ("; recording anyway, as the reference does" if from_env else "")
        )
    return problems


def _pilot_without_trace(pilot: str, given: frozenset[str]) -> str:
    """The warning for a probe whose predictions can never be scored, naming each setting as it was made."""
    if "pilot" in given:
        what = f"pilot={pilot!r} with " + ("trace=False" if "trace" in given else f"{_env.TRACE} unset")
    else:
        what = f"{_env.PILOT} is set but " + ("trace=False" if "trace" in given else f"{_env.TRACE} is not")
    fix = "pass trace=True" if "trace" in given else f"set {_env.TRACE}=1" + (" or pass trace=True" if given else "")
    return what + ": the predictions can never be scored (pilot recall compares them with the trace); " + fix



class _Staging(CoreBase):
    """The device path's staged ids: drains the recorder runs before every write and before closing."""

    _path: str
    _drains: list[Any]
    _drain_failures: set[str]

    def _add_drain(self, drain: Any) -> None:
        """Call ``drain()`` before every write and before closing (the device path's staged ids).

        A bound method is held weakly, so the stager (which holds this
        recorder) and the recorder never form a cycle: dropping both writes
        the capture at once, without waiting for the garbage collector.
        """
        ref = weakref.WeakMethod(drain) if inspect.ismethod(drain) else (lambda: drain)
        self._drains.append(ref)  # one append: atomic under the GIL

    def _drain(self) -> None:
        """Run every drain; one that fails is reported (once per message) and the write goes on.

        A failed drain must never block the write of what the recorder holds:
        the error is printed on stderr (``[router-hist] FAILED recording
        staged ids``) rather than raised, here and at close or exit.
        """
        for ref in list(self._drains):
            drain = ref()
            if drain is None:
                continue
            try:
                drain()
            except Exception as exc:  # noqa: BLE001 -- reported, and the capture is still written
                message = f"[router-hist] FAILED recording staged ids for {self._path}: {exc}"
                if message not in self._drain_failures:
                    self._drain_failures.add(message)
                    _lifecycle.report(message)

    def _stagers(self) -> list[Any]:
        """The live objects whose bound methods are this recorder's drains."""
        owners = []
        for ref in list(self._drains):
            drain = ref()
            owner = getattr(drain, "__self__", None)
            if owner is not None:
                owners.append(owner)
        return owners


class _Reads(Streaming):
    """What the recorder holds, read in memory: snapshots and copies, never a write."""

    @property
    def counts(self) -> "npt.NDArray[np.int64]":
        """The counts so far: a read-only (num_layers, num_experts) int64 snapshot.

        int64, as a loaded ``Capture``'s counts, so the two subtract exactly.
        Reading it again without recording in between returns the same array
        (no copy); a later record never changes a snapshot already taken.
        """
        return self._counts_snapshot()

    @property
    def passes(self) -> np.ndarray:
        """A copy of the routed-pass count of each layer: (num_layers,) int64."""
        return self._passes_array()

    @property
    def trace_dropped(self) -> Optional[np.ndarray]:
        """Per layer, the passes recorded beyond ``trace_cap`` (counted, not traced): (num_layers,) int64.

        None when no cap is set. Each layer's trace, predictions and tags keep
        its first ``trace_cap`` passes; counts and ``passes`` keep every pass.
        """
        cap = self.trace_cap
        if cap is None:
            return None
        passes = self._passes_array()
        return passes - np.minimum(passes, cap)

    def trace(self, layer: int) -> Optional[np.ndarray]:
        """A copy of one layer's trace as (passes, top_k) uint32, or None when the trace is off.

        With ``trace_cap`` set, the layer's first ``trace_cap`` passes at most.
        Raises ValueError for a streamed trace (it is on disk: ``write()``, then
        ``turbospark.load``).
        """
        self._refuse_streamed("trace")
        return self._trace_array(layer)

    def predictions(self, layer: int) -> Optional[np.ndarray]:
        """A copy of one layer's predictions as (predictions, top_k) uint32, or None when the probe is off.

        Raises ValueError for a streamed trace, as ``trace`` does.
        """
        self._refuse_streamed("predictions")
        return self._predictions_array(layer)


class _Writes(Streaming, _Staging):
    """The capture's JSON, built by one path (``_document``), and its atomic writes."""

    # Serialises writes to self.path, so a checkpoint in progress can never land after the final write.
    _write_lock: threading.RLock
    # trace="stream": the serial (_take_chunk's) of the summary last written, so an older one never replaces it.
    _written_serial: int

    def _document(self) -> bytes:
        """The capture's JSON: the one path every output goes through (``to_json``, ``write``, close, exit).

        In order: the device path's staged ids are drained into the core; the
        core's ``_json_document(tail)`` writes everything it owns (sizes,
        ``counts``, ``trace``, ``pred``), appends ``tail`` verbatim (the
        facade's ``router_logits`` object, values through ``_f32display``,
        Rust's f32 ``Display``), then, after ``record_batch``, the ``seq`` and
        ``phase`` columns it commits with their passes; then the closing
        ``}``. One read of the core's state: nothing else assembles a capture
        document, and nothing has to be retried.
        """
        self._drain()
        if self._stream is not None:
            return self._streamed_document()[0]
        return self._json_document(logits_tail(self._logits_capture())) + step_passes_key(self._step_marks) + b"}"

    def _write_streamed(self, *, checkpoint: bool = False) -> None:
        """Write a streamed capture: built (taken, flushed) outside the write lock, replaced under it.

        Outside: the take may wait for the pure core's lock, held by a call
        on the main thread that a SIGTERM interrupted, whose handler's write
        must then not wait for this one. Under it, only the replacement, and
        only when no later take's summary is on disk already (a checkpoint
        also skips once the recorder closed: the final write is the last word).
        """
        document = self._document()
        # A handler's write between the two lines can only make this larger, and equal to a summary
        # it wrote: then this older one is skipped, as it should be.
        serial = self._serial_here.value
        with self._write_lock:
            if serial > self._written_serial and not (checkpoint and self.closed):
                write_atomic(self._path, document)
                self._written_serial = serial

    def to_json(self) -> str:
        """The capture as the reference's JSON, byte for byte (non-finite logits become null)."""
        return self._document().decode("ascii")

    def write(self, path: Optional[PathLike] = None) -> None:
        """Write the capture now, atomically, to ``path`` (default: ``self.path``); raise OSError on failure.

        A streamed capture is written to its own path only (its JSON names the
        sidecar beside it): another ``path`` is a ValueError.
        """
        target = self._path if path is None else _path_text(path)
        stream = self._stream
        if stream is not None and os.path.abspath(target) != os.path.abspath(self._path):
            raise ValueError(f"a streamed capture is written to its own path {self._path!r}, beside its trace "
                             f"{stream.path!r}, not to {target!r}")
        if stream is not None:
            self._write_streamed()
            return
        with self._write_lock:
            write_atomic(target, self._document())


class _Checkpoints(_Writes):
    """The capture rewritten atomically at an interval while recording (``checkpoint=``)."""

    _checkpointer: Optional[_checkpoint.Checkpointer]

    @property
    def checkpoint(self) -> Optional[float]:
        """Seconds between checkpoints (the capture rewritten atomically while recording), or None."""
        return None if self._checkpointer is None else self._checkpointer.seconds
    def _write_checkpoint(self) -> None:
        """One checkpoint (the checkpoint thread's call): the capture rewritten unless the recorder closed.

        Staged ids are drained before the write lock is taken: a drain may
        wait for a stager's lock, and the final write must never wait behind
        that. Raises OSError; the thread reports it.
        """
        if self.closed or os.getpid() != self._owner_pid:
            return
        self._drain()
        if self._stream is not None:
            self._write_streamed(checkpoint=True)
            return
        with self._write_lock:
            # Closed meanwhile: the final write is (or was) the last word.
            if not self.closed:
                write_atomic(self._path, self._document())

    def _stop_checkpoints(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()


class _Lifecycle(_Checkpoints):
    """Close, discard, the exit path's write, fork and drop: the one write of the capture at the end."""

    _owed: bool  # set by _lifecycle: the capture is still owed to disk

    def close(self) -> None:
        """Stop recording and write the capture once, reporting on stderr; never raises, idempotent.

        Only the process that created the recorder writes: a forked child's
        copy closes silently, so it can never overwrite the parent's capture.
        A write that Ctrl-C cuts short leaves the capture pending, and the
        exit path writes it (``_lifecycle``).
        """
        if self.closed:
            return
        owner = os.getpid() == self._owner_pid
        if owner:
            self._drain()
        if not self._mark_closed():
            return
        self._stop_checkpoints()
        if not owner:
            _lifecycle.settle(self)
            return
        self._write_and_report()

    def discard(self) -> None:
        """Stop recording without writing anything; idempotent, never raises.

        Later records raise ``ValueError`` as after ``close()``; ``to_json()``
        and ``write(path)`` still give what was recorded.
        """
        self._mark_closed()
        self._stop_checkpoints()
        self._close_stream()
        _lifecycle.settle(self)
    def _finish(self, *, close: bool) -> None:
        """The exit path's write of a pending capture: staged ids first; with ``close``, closed before it is written.

        Without ``close`` (a SIGTERM chained to a handler that may let the
        process go on) a closed recorder is left alone: its close() is still
        writing, and resumes once the handlers return.
        """
        if self.closed and not close:
            return
        if not self.closed:
            self._drain()
            if close:
                self._mark_closed()
                self._stop_checkpoints()
        self._write_and_report()

    def _write_and_report(self) -> None:
        # A KeyboardInterrupt (or a signal handler's exception) propagates and
        # leaves the capture pending: nothing new is on disk, the exit path retries.
        try:
            self.write()
        except Exception as exc:  # noqa: BLE001 -- close() must never raise
            _lifecycle.report(f"[router-hist] FAILED writing {self._path}: {describe_os_error(exc)}")
        else:
            _lifecycle.report(f"[router-hist] wrote {self._path}")
        if self.closed:
            self._close_stream()
            _lifecycle.settle(self)

    def _after_fork_in_child(self) -> None:
        # The stagers' locks too (a DeviceRecorder another thread was staging into).
        for stager in self._stagers():
            renew = getattr(stager, "_after_fork_in_child", None)
            if renew is not None:
                renew()
        # A lock another thread held at fork() time stays held in the child (which never writes, but may call write(path)).
        self._write_lock = threading.RLock()
        super()._after_fork_in_child()
    def __enter__(self: _Open) -> _Open:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # A constructor that raised leaves no _owner_pid: nothing to write.
        if getattr(self, "_owner_pid", None) is None:
            return
        if not self.closed:
            self.close()
        elif getattr(self, "_owed", False) and os.getpid() == self._owner_pid:
            # Its close() was cut short (Ctrl-C): dropping it must not lose
            # the capture, and the registry's weak reference is about to go.
            self._finish(close=True)


class _Facade(_Lifecycle, _Reads, Steps):
    """Everything of ``RouterHistogram`` that is not a per-call hot path: its construction, over the mixins."""

    def __init__(
        self,
        path: PathLike,
        num_layers: int,
        num_experts: int,
        top_k: int = 0,
        *,
        trace: Union[bool, str] = False,
        pilot: Optional[str] = None,
        router_logits: Optional[tuple[int, int]] = None,
        trace_cap: Optional[int] = None,
        checkpoint: Optional[float] = None,
    ) -> None:
        self._start(path, num_layers, num_experts, top_k, trace, pilot, router_logits, from_env=False,
                    trace_cap=trace_cap, checkpoint=checkpoint)

    def _start(
        self,
        path: PathLike,
        num_layers: int,
        num_experts: int,
        top_k: int,
        trace: Union[bool, str],
        pilot: Optional[str],
        router_logits: Optional[tuple[int, int]],
        *,
        from_env: bool,
        given: frozenset[str] = frozenset(),
        trace_cap: Optional[int] = None,
        checkpoint: Optional[float] = None,
    ) -> None:
        """Check the configuration and start recording.

        With ``from_env`` (the lenient path), a bad destination, zero layers
        and ``top_k > num_experts`` are warnings instead of errors. ``given``:
        which of ``"trace"`` and ``"pilot"`` came from code rather than the
        environment (only for what a warning calls them).
        """
        text = _path_text(path)
        layers = _whole("num_layers", num_layers, 0, _MAX_SIZE)
        experts = _whole("num_experts", num_experts, 1, 2**32)
        k = _whole("top_k", top_k, 0, _MAX_SIZE)
        if pilot not in _PILOTS:
            raise ValueError(f"pilot must be None, 'next' or 'self', got {pilot!r}")
        logits_layer, logits_pass = _logits_request(router_logits, layers)
        streamed = _stream_mode(trace)
        if streamed:
            # Before anything is created (an invalid size, from the environment too): the sidecar's
            # header holds each size in 4 bytes.
            _stream_format.check_sizes(layers, experts)
        if from_env and trace_cap is not None and streamed:
            warn_caller(f"ignoring {_env.TRACE_CAP}={trace_cap}: the trace is streamed to disk "
                        f"({_env.TRACE}=stream), which keeps memory bounded without dropping passes")
            trace_cap = None
        if streamed and trace_cap is not None:
            raise ValueError(f"trace_cap={trace_cap} with trace='stream': a streamed trace keeps every pass on disk "
                             "in bounded memory; use one or the other")
        if from_env and trace_cap is not None and not trace:
            warn_caller(f"ignoring {_env.TRACE_CAP}={trace_cap}: " + ("trace=False" if "trace" in given else
                        f"{_env.TRACE} is not set") + "; there is no trace to cap")
            trace_cap = None
        cap = _convert.trace_cap(trace_cap, trace)
        seconds = _checkpoint.interval(checkpoint)
        for problem in _useless(layers, experts, k, from_env=from_env):
            if from_env:
                warn_caller(problem)
            else:
                raise ValueError(problem)
        if pilot is not None and not trace:
            warn_caller(_pilot_without_trace(pilot, given if from_env else frozenset({"trace", "pilot"})))
        # {rank} and {pid} may name the directory too: check where the write will go.
        path = _paths.per_process(text)
        if streamed:
            # The sidecar is opened now, the JSON written later: a relative path and an os.chdir
            # in between must not put them in two directories.
            path = os.path.abspath(path)
        try:
            check_destination(path)
        except OSError as exc:
            if not from_env:
                raise
            # An environment setting must never stop a runtime: say it now, record anyway.
            warn_caller(f"{_env.HIST}={text!r}: cannot write the capture there: {exc.strerror}; recording anyway, but it "
                        "will be lost unless that is fixed before it is written")
        # Read the setting and install the handler (both may warn) before this
        # recorder exists, so a warning turned into an error leaves nothing
        # behind to write.
        if _sigterm.requested():
            _sigterm.install(_lifecycle.finish_all)
        stream = None
        if streamed:
            try:
                stream = _stream.StreamWriter(path + _stream_format.SUFFIX, layers, experts, _stream_format.new_run())
            except OSError as exc:
                if not from_env or isinstance(exc, _stream.StreamBusy):
                    # Busy, from the environment too: an in-memory trace would still overwrite the
                    # other recorder's JSON at this path.
                    raise type(exc)(exc.errno, f"cannot create the streamed trace: {exc.strerror}",
                                  path + _stream_format.SUFFIX) from None
                warn_caller(f"{_env.TRACE}=stream: cannot create {path + _stream_format.SUFFIX!r}: {exc.strerror}; "
                            "keeping the trace in memory instead")
        try:
            super().__init__(layers, experts, k, bool(trace), pilot, logits_layer, logits_pass, cap)
        except BaseException:
            if stream is not None:
                stream.close()
            raise
        self._path = path
        self._owner_pid = os.getpid()
        self._stream = stream
        if stream is not None:
            self._stream_every(_stream.CHUNK_IDS)
        # Staged data (the device path) to hand to the core before any write.
        self._drains = []
        self._drain_failures: set[str] = set()
        # Serialises writes to self.path, so a checkpoint in progress can never land after the final write.
        # Re-entrant: a SIGTERM handler may write while the main thread is inside write().
        self._write_lock = threading.RLock()
        # trace="stream": the serial (_take_chunk's) of the summary last written, so an older one never replaces it.
        self._written_serial = 0
        # The serial of the summary this thread's last _streamed_document built (read back by _write_streamed,
        # since _document, which subclasses extend, returns the bytes only).
        self._serial_here = threading.local()
        self._checkpointer = None
        _lifecycle.register(self)
        if stream is not None:
            self._write_initial(from_env)
        if seconds is not None:
            self._checkpointer = _checkpoint.Checkpointer(self, seconds)

    def _write_initial(self, from_env: bool) -> None:
        """A streamed recorder's first JSON, written as it starts: an old run's JSON at this path never
        sits beside the new sidecar (a crash before the first checkpoint leaves this run's capture)."""
        try:
            self.write()
        except OSError as exc:
            if from_env:
                warn_caller(f"{_env.HIST}={self._path!r}: cannot write the capture there: {exc.strerror}; "
                            "recording anyway, but it will be lost unless that is fixed before it is written")
                return
            self.discard()
            raise OSError(exc.errno, f"cannot write the streamed capture's JSON: {exc.strerror}", self._path) from None

    @classmethod
    def from_env(cls: type[_Self], num_layers: int, num_experts: int, top_k: int = 0) -> Optional[_Self]:
        """A recorder configured by the ``TURBOSPARK_*`` variables, or None when recording is off.

        None when ``TURBOSPARK_ROUTER_HIST`` is unset or empty, or when
        ``num_experts`` is 0 (a dense model has nothing to count), exactly as
        the reference. Lenient where the constructor is strict: an unusable
        router-logits setting, an unwritable destination, zero layers,
        ``top_k > num_experts`` or the probe without the trace each give a
        ``RuntimeWarning`` and recording goes on. Raises TypeError/ValueError
        for invalid sizes (negative, non-integer).
        """
        _whole("num_layers", num_layers, 0, _MAX_SIZE)
        _whole("num_experts", num_experts, 0, 2**32)
        _whole("top_k", top_k, 0, _MAX_SIZE)
        if not os.environ.get(_env.HIST) or num_experts == 0:
            return None
        config = _env.config_from_env(num_layers)
        assert config is not None
        return cls.from_config(config, num_layers, num_experts, top_k)

    @classmethod
    def from_config(
        cls: type[_Self],
        config: _env.EnvConfig,
        num_layers: int,
        num_experts: int,
        top_k: int = 0,
        *,
        given: frozenset[str] = frozenset(),
    ) -> _Self:
        """A recorder for an environment configuration (``_env.config_from_env``, perhaps with fields replaced).

        As lenient as ``from_env`` (warnings, not errors, for what an
        environment setting may get wrong); for integrations that must know
        the configuration before the recorder exists. ``given`` names the
        fields (``"trace"``, ``"pilot"``) the caller replaced, so a warning
        names them as the caller set them.
        """
        recorder = cls.__new__(cls)
        recorder._start(
            config.path,
            num_layers,
            num_experts,
            top_k,
            config.trace,
            config.pilot,
            config.router_logits,
            from_env=True,
            given=given,
            trace_cap=config.trace_cap,
            checkpoint=config.checkpoint,
        )
        return recorder

    @property
    def path(self) -> str:
        """Where ``close()`` (and ``write()`` without an argument) writes the capture."""
        return self._path
    def __repr__(self) -> str:
        pilot = ("self" if self.pilot_offset() == 0 else "next") if self.pilot_enabled() else None
        return (
            f"<RouterHistogram path={self._path!r} layers={self.num_layers} experts={self.num_experts} "
            f"top_k={self.top_k} trace={'stream' if self.streamed else self.trace_enabled!r} pilot={pilot!r} "
            f"closed={self.closed}>"
        )


class RouterHistogram(_Facade, RecorderCore):
    """Per-layer router top-k histogram, with optional trace, pilot probe and logit row.

    ``RouterHistogram(path, num_layers, num_experts, top_k=0, *, trace=False,
    pilot=None, router_logits=None, trace_cap=None, checkpoint=None)``: ``top_k == 0`` learns it
    from the first ``record``; ``pilot`` is None, ``"next"`` or ``"self"``;
    ``router_logits`` is None or a ``(layer, pass)`` pair; ``trace_cap`` is None
    (unbounded) or N >= 1: each layer's trace, predictions and tags keep its
    first N passes, counts keep every pass, and the capture says how many
    passes each layer dropped (``trace_dropped``); ``checkpoint`` is None or
    a positive number of seconds: the capture is rewritten atomically at that
    interval while recording, so a process killed without warning loses at
    most one interval. ``RouterHistogram.from_env(...)``
    configures it from the ``TURBOSPARK_*`` variables instead.

    The constructor raises ValueError for a capture that cannot be useful
    (``num_layers == 0``, ``top_k > num_experts``, a ``trace_cap`` without the
    trace or below 1), an OSError naming the path
    when the destination cannot be written, and warns (RuntimeWarning) about a
    pilot with the trace off, whose predictions could never be scored.

    Recording: ``record(layer, ids)``, ``record_many(layer, ids_2d, mask=None)``,
    ``record_batch(layer, ids_2d, seq=..., phase=..., mask=None)`` (passes of
    several sequences, tagged),
    ``record_prediction(layer, ids)``, ``record_prediction_many(layer, ids_2d,
    mask=None)``, ``record_router_logits(layer, row)``; ids may be sequences of
    ints, integer ndarrays or CPU torch tensors. A rejected call raises
    (IndexError for the layer, TypeError for non-integer input or a tensor on
    another device, ValueError for bad ids, lengths, shapes or masks) and
    records nothing. ``close()`` writes the capture; ``discard()`` stops
    without writing.
    """


def _stream_mode(trace: Any) -> bool:
    """Whether ``trace`` asks for the streamed trace; raises for a value that is neither a bool nor "stream"."""
    if isinstance(trace, str):
        if trace != "stream":
            raise ValueError(f"trace must be True, False or 'stream', got {trace!r}")
        return True
    return False

@functools.lru_cache(maxsize=None)
def recorder_class(core: type) -> type:
    """``RouterHistogram`` built on a given core class (tests compare the two backends in one process)."""
    if core is RecorderCore:
        return RouterHistogram
    return type("RouterHistogram", (_Facade, core), {"__doc__": RouterHistogram.__doc__, "__module__": __name__})


__all__ = ["BACKEND", "RouterHistogram", "recorder_class"]
