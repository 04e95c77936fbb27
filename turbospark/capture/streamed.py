"""Loading a streamed capture (``trace="stream"``): its JSON summary, and its sidecar memory-mapped.

The sidecar (layout in ``docs/stream.md``) is mapped, not read: ``load`` walks
the frame headers (40 bytes each, one per layer and chunk), and each layer's
rows are materialised only when the caller first asks for that layer, as one
array of the file's id width (uint8 for up to 256 experts), a zero-copy view
of the map when the layer sits in one frame. So loading costs the headers,
and memory grows with what the caller touches.

Recovery: frames are read up to the first one that is cut short or fails its
checksum; nothing after it is read. Each layer's rows are then its frames
sorted by their first row (chunks two threads took close together may sit in
either order); a gap between two frames (a failed write) is kept as a gap:
the rows after it are kept, ``StreamInfo.missing`` says which rows are not
there, and the analysis ends every run at the gap (``StreamInfo.breaks``).
Predictions keep the rows whose passes are kept, so that they still line up
with the passes by index. Frames
the summary covers were made durable before the summary was written, so
their checksums are verified only with ``verify=True``; every frame beyond
(written after the last checkpoint, before a crash) is verified. When the
rows on disk are not exactly those the summary counts (a crash after the
last checkpoint, a cut file, a failed write), the counts of each such layer
are recomputed from its rows on disk, and a ``RuntimeWarning`` says what was
recovered or dropped (also in ``Capture.stream``).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union, overload

import numpy as np

from . import _stream_format as fmt

__all__ = ["DamagedCapture", "LayerRows", "StreamInfo", "load_streamed"]

# How much of the sidecar the header walk reads before handing its pages back.
_RELEASE_BYTES = 16 << 20


class DamagedCapture(ValueError):
    """A layer built from a streamed capture's frames holds a value no recorder writes (an id, sequence
    id or phase out of range): a frame the summary covers is damaged (those are not checksummed unless
    ``verify=True``). Raised when the layer is first built."""


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """What a streamed capture's sidecar held when it was loaded.

    ``path``: the sidecar; ``id_dtype``: its id width; ``frames``: whole
    frames read; ``read_bytes``: where the last of them ends;
    ``dropped_bytes``: bytes after it that were not read (a cut or torn
    tail); ``recovered_passes`` / ``missing_passes``: per layer, passes on
    disk beyond what the summary counts, and passes the summary counts that
    are not on disk (both (num_layers,) int64); ``stranded_frames``: whole
    frames not used because rows before them are missing (a failed write);
    ``unmapped_passes``: per layer, passes recovered beyond the summary that
    were dropped because their sequence ids are not in its ``requests`` map
    (they began after the last checkpoint), or None without a map;
    ``missing`` / ``missing_predictions``: per layer, the ``(first, stop)``
    ranges of rows (in the layer's own row indices, as recorded) that are not
    in the capture: lost to a failed write, or counted by the summary and cut
    off the file. The capture's rows of a layer are its rows outside those
    ranges, in order (predictions also leave out the rows of missing passes,
    and stop at a missing prediction of a kept pass, so that they line up).
    """

    path: str
    id_dtype: np.dtype
    frames: int
    read_bytes: int
    dropped_bytes: int
    recovered_passes: np.ndarray
    missing_passes: np.ndarray
    stranded_frames: int = 0
    unmapped_passes: Optional[np.ndarray] = None
    missing: tuple[tuple[tuple[int, int], ...], ...] = ()
    missing_predictions: tuple[tuple[tuple[int, int], ...], ...] = ()

    def breaks(self, layer: int) -> list[int]:
        """Positions in the capture's rows of ``layer`` where rows resume after a gap (ascending): the
        analysis starts a new run at each (a window, a transition or a cache never spans a gap)."""
        out, before = [], 0
        for first, stop in (self.missing[layer] if self.missing else ()):
            if first - before > 0 and (not out or out[-1] != first - before):
                out.append(first - before)  # the kept rows before this gap (a gap after the last is no break)
            before += stop - first
        return out


class LayerRows(Sequence[np.ndarray]):
    """One array per layer, built on access from that layer's frames; the last ``KEPT`` built are kept.

    Keeping only a few bounds the memory of a pass over every layer (the
    analysis, an export) by the largest layers rather than by the capture;
    an array handed out stays valid (it owns its rows, or views the map).
    """

    KEPT = 4

    def __init__(self, count: int, build: Callable[[int], np.ndarray],
                 piece: Optional[Callable[[int, int, int], np.ndarray]] = None,
                 lengths: Optional[Sequence[int]] = None, release: Optional[Callable[[], None]] = None) -> None:
        self._build = build
        self._piece = piece
        self._lengths = lengths
        self._release = release
        self._rows: list[Optional[np.ndarray]] = [None] * count
        self._order: list[int] = []

    def row_count(self, layer: int) -> int:
        """Rows of ``self[layer]``, without building it."""
        if self._lengths is None:
            return int(self[layer].shape[0])
        return int(self._lengths[layer])

    def row_range(self, layer: int, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of ``self[layer]``, read-only, without building (or keeping) the whole layer."""
        kept = self._rows[layer]
        if self._piece is None or kept is not None:
            return self[layer][lo:hi]
        rows = self._piece(layer, lo, hi)
        rows.setflags(write=False)
        return rows

    def release(self) -> None:
        """Hand the mapped pages read so far back to the kernel (the file's pages stay cached; arrays stay valid).

        Pages a reader touched count in its resident memory until the mapping
        goes; a pass over a capture larger than memory calls this as it goes.
        """
        if self._release is not None:
            self._release()

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[np.ndarray, list[np.ndarray]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self._rows)
        if not 0 <= index < len(self._rows):
            raise IndexError(f"layer {index} out of range for {len(self._rows)} layers")
        rows = self._rows[index]
        if rows is None:
            rows = self._rows[index] = self._build(index)
            rows.setflags(write=False)
            # The mapped pages it was read from need not stay resident (a view of the map faults them
            # back in when read): else a pass over every layer would keep the whole file in this process.
            self.release()
            self._order.append(index)
            if len(self._order) > self.KEPT:
                self._rows[self._order.pop(0)] = None
        return rows

    def __repr__(self) -> str:
        return f"<LayerRows: {len(self._rows)} layers, {len(self._order)} built and kept>"


class _Segment:
    __slots__ = ("offset", "rows", "tagged", "span", "first")

    def __init__(self, offset: int, rows: int, tagged: bool, span: Optional[int] = None, first: int = 0) -> None:
        self.offset = offset  # of the payload
        self.rows = rows  # the rows used: the frame's first ``rows``
        self.tagged = tagged
        self.span = rows if span is None else span  # the rows the frame holds (its columns' layout)
        self.first = first  # the layer's row index of the first row used


def _stream_field(fields: dict[str, Any], num_layers: int) -> dict[str, Any]:
    stream = fields["stream"]
    if not isinstance(stream, dict):
        raise ValueError(f"stream must be an object, got {type(stream).__name__}")
    if stream.get("format") != fmt.VERSION:
        raise ValueError(f"stream.format is {stream.get('format')!r}; this turbospark reads format {fmt.VERSION}")
    name = stream.get("file")
    if not isinstance(name, str) or not name or os.path.basename(name) != name:
        raise ValueError(f"stream.file must name a file beside the capture, got {name!r}")
    run = stream.get("run")
    if run is not None and not (isinstance(run, str) and len(run) == 2 * fmt.RUN_BYTES
                                and all(c in "0123456789abcdef" for c in run) and run != fmt.NO_RUN.hex()):
        raise ValueError(f"stream.run must be {2 * fmt.RUN_BYTES} lowercase hex digits, not all 0, got {run!r}")
    size = stream.get("bytes")
    if type(size) is not int or size < 0:
        raise ValueError(f"stream.bytes must be a non-negative integer, got {size!r}")
    for key in ("passes", "predictions", "lost_passes", "lost_predictions"):
        value = stream.get(key)
        if value is None and key != "passes":
            continue
        if (not isinstance(value, list) or len(value) != num_layers
                or any(type(v) is not int or v < 0 for v in value)):
            raise ValueError(f"stream.{key} must be a list of num_layers={num_layers} non-negative integers, "
                             f"got {value!r}")
    return stream


def load_streamed(path: str, fields: dict[str, Any], base: Any, *, verify: bool = False) -> Any:
    """The ``Capture`` of a streamed capture: ``base`` (built from the summary) with its rows from the sidecar.

    ``fields`` are the summary's parsed members. Raises OSError when the
    sidecar cannot be opened and ValueError naming what is wrong with it.
    """
    num_layers, num_experts, top_k = base.num_layers, base.num_experts, base.top_k
    stream = _stream_field(fields, num_layers)
    sidecar = os.path.join(os.path.dirname(os.fspath(path)), stream["file"])
    with open(sidecar, "rb") as handle:
        # A descriptor of the capture's rows' own (copies are read through it), closed with them.
        file = _Sidecar(os.dup(handle.fileno()))
    file_size = os.fstat(file.fd).st_size
    data: Any = mmap.mmap(file.fd, 0, access=mmap.ACCESS_READ) if file_size else b""
    file.data = data
    try:
        header = fmt.unpack_header(data[: fmt.HEADER_SIZE])
    except ValueError as exc:
        raise ValueError(f"{sidecar}: {exc}") from None
    if (header.num_layers, header.num_experts) != (num_layers, num_experts):
        raise ValueError(f"{sidecar}: its header says {header.num_layers} layers x {header.num_experts} experts, "
                         f"the capture {num_layers} x {num_experts}")
    _check_run(path, stream.get("run"), sidecar, header.run)
    dtype = fmt.id_dtype(header.id_bytes)
    found: list[list[list[tuple[int, _Segment]]]] = [[[] for _ in range(num_layers)] for _ in range(2)]
    step_frames: list[tuple[int, int, int]] = []  # (first step, steps, payload offset): kind 2 frames
    width = top_k
    offset, frames, trusted = fmt.HEADER_SIZE, 0, stream["bytes"]
    can_release = bool(file_size) and hasattr(mmap, "MADV_DONTNEED")
    released_at = 0
    while offset + fmt.FRAME_HEADER_SIZE <= file_size:
        if can_release and offset - released_at >= _RELEASE_BYTES:
            # Each header read faults in the cached pages around it too (the kernel's fault-around),
            # so a walk would otherwise leave the whole file resident.
            data.madvise(mmap.MADV_DONTNEED)
            released_at = offset
        try:
            frame = fmt.unpack_frame(data, offset)
        except ValueError:
            break
        end = offset + fmt.FRAME_HEADER_SIZE + frame.payload_size
        tagged = bool(frame.flags & fmt.TAGGED)
        expected = fmt.payload_size(frame.kind, frame.rows, frame.width, header.id_bytes, tagged)
        steps = frame.kind == fmt.STEPS
        if (end > file_size or frame.kind not in (fmt.PASSES, fmt.PREDICTIONS, fmt.STEPS)
                or frame.layer >= num_layers or frame.payload_size != expected or frame.width == 0
                or (steps and (frame.width != num_layers or frame.layer or frame.flags))
                or (not steps and width and frame.width != width) or (tagged and frame.kind != fmt.PASSES)):
            break
        if (verify or end > trusted) and fmt.frame_crc(data, offset, frame.payload_size) != frame.crc:
            break
        frames += 1
        if steps:
            step_frames.append((frame.first, frame.rows, offset + fmt.FRAME_HEADER_SIZE))
            offset = end
            continue
        width = frame.width
        found[frame.kind][frame.layer].append((frame.first, _Segment(offset + fmt.FRAME_HEADER_SIZE, frame.rows,
                                                                     tagged, first=frame.first)))
        offset = end
    if can_release:
        data.madvise(mmap.MADV_DONTNEED)
    (passes, stranded), (preds, stranded_preds) = _ordered(found[0]), _ordered(found[1])
    stated = np.array(stream["passes"], dtype=np.int64)
    requests = base.requests
    unmapped = None
    if requests is not None:
        unmapped = _drop_unmapped(file, passes, stated, len(requests))
    gaps = [_gaps(segments, int(stated[layer])) for layer, segments in enumerate(passes)]
    stated_preds = stream.get("predictions")
    pred_gaps = [_gaps(segments, int(stated_preds[layer]) if stated_preds is not None else 0)
                 for layer, segments in enumerate(preds)]
    preds = [_aligned(segments, holes, pred_holes, width * header.id_bytes)
             for segments, holes, pred_holes in zip(preds, gaps, pred_gaps)]
    on_disk = np.array([sum(s.rows for s in segments) for segments in passes], dtype=np.int64)
    pred_rows = np.array([sum(s.rows for s in segments) for segments in preds], dtype=np.int64)
    ends = np.array([segments[-1].first + segments[-1].rows if segments else 0 for segments in passes], dtype=np.int64)
    recovered = np.maximum(ends - stated, 0)
    missing = np.array([sum(min(stop, int(stated[layer])) - first for first, stop in holes if first < stated[layer])
                        for layer, holes in enumerate(gaps)], dtype=np.int64)
    info = StreamInfo(sidecar, dtype, frames, offset, file_size - offset, recovered, missing,
                      stranded + stranded_preds, unmapped, tuple(tuple(h) for h in gaps),
                      tuple(tuple(h) for h in pred_gaps))

    release = (lambda: data.madvise(mmap.MADV_DONTNEED)) if can_release else None
    # Frames the summary covers are not checksummed by default: a value out of range in one is refused
    # when its layer is built (a max over the rows read anyway), never handed on to crash an analysis.
    check = _Checks(sidecar, num_experts, dtype, None if requests is None else len(requests))
    trace = LayerRows(num_layers, lambda layer: check.ids("trace", layer, _ids(file, passes[layer], dtype, width)),
                      lambda layer, lo, hi: check.ids("trace", layer, _ids(file, passes[layer], dtype, width, lo, hi)),
                      on_disk.tolist(), release)
    pred = (LayerRows(num_layers, lambda layer: check.ids("pred", layer, _ids(file, preds[layer], dtype, width)),
                      lambda layer, lo, hi: check.ids("pred", layer, _ids(file, preds[layer], dtype, width, lo, hi)),
                      pred_rows.tolist(), release)
            if stream.get("predictions") is not None else None)
    seq = phase = None
    if any(segment.tagged for layer in passes for segment in layer):
        # Read a chunk at a time by the analysis, as the trace is, and their pages handed back with it.
        seq = LayerRows(num_layers,
                        lambda layer: check.seq(layer, _tags(file, passes[layer], header.id_bytes, width, 0)),
                        lambda layer, lo, hi: check.seq(layer, _tags(file, passes[layer], header.id_bytes, width, 0,
                                                                     lo, hi)),
                        on_disk.tolist(), release)
        phase = LayerRows(num_layers,
                          lambda layer: check.phase(layer, _tags(file, passes[layer], header.id_bytes, width, 1)),
                          lambda layer, lo, hi: check.phase(layer, _tags(file, passes[layer], header.id_bytes, width,
                                                                         1, lo, hi)),
                          on_disk.tolist(), release)
    step_passes = _step_passes(sidecar, data, step_frames, stream, np.maximum(ends, stated), num_layers)
    if step_passes is not None or "steps" in stream:
        base = dataclasses.replace(base, step_passes=step_passes)
    counts = base.counts
    stale = np.flatnonzero((on_disk != stated) | (missing > 0)
                           | np.array([bool(holes) for holes in gaps], dtype=bool)).tolist()
    if stale:
        counts = counts.copy()
        for layer in stale:
            counts[layer] = np.bincount(trace[layer].ravel(), minlength=num_experts)[:num_experts]
    if stale or info.dropped_bytes or info.stranded_frames or (unmapped is not None and unmapped.any()):
        _warn(sidecar, info, recomputed=bool(stale))
    return dataclasses.replace(base, top_k=top_k or (width if frames else 0), counts=counts, trace=trace, pred=pred,
                               seq=seq, phase=phase, stream=info)


_VERIFY = "a damaged frame: turbospark.load(..., verify=True) (--verify) checks every frame's checksum"


class _Checks:
    """The range checks of a layer's rows as it is built."""

    def __init__(self, sidecar: str, num_experts: int, dtype: np.dtype, sequences: Optional[int]) -> None:
        self.sidecar = sidecar
        self.num_experts = num_experts
        # A width every value of which is an id (256 experts in uint8) needs no check.
        self.bounded = num_experts > int(np.iinfo(dtype).max)
        self.sequences = sequences

    def ids(self, what: str, layer: int, rows: np.ndarray) -> np.ndarray:
        if not self.bounded and rows.size:
            top = int(rows.max())
            if top >= self.num_experts:
                raise DamagedCapture(f"{self.sidecar}: {what}[{layer}] holds expert id {top}, outside "
                                     f"0..{self.num_experts - 1} ({_VERIFY})")
        return rows

    def seq(self, layer: int, rows: np.ndarray) -> np.ndarray:
        if rows.size:
            low = int(rows.min())
            if low < 0:
                raise DamagedCapture(f"{self.sidecar}: seq[{layer}] holds a negative sequence id {low} ({_VERIFY})")
            top = int(rows.max())
            if self.sequences is not None and top >= self.sequences:
                raise DamagedCapture(f"{self.sidecar}: seq[{layer}] holds sequence id {top}, but requests "
                                     f"describes only {self.sequences} sequences ({_VERIFY})")
        return rows

    def phase(self, layer: int, rows: np.ndarray) -> np.ndarray:
        if rows.size:
            top = int(rows.max())
            if top > 1:
                raise DamagedCapture(f"{self.sidecar}: phase[{layer}] holds {top}; a phase is 0 (prompt) or 1 "
                                     f"(decode) ({_VERIFY})")
        return rows


def _drop_unmapped(file: "_Sidecar", passes: list[list[_Segment]], stated: np.ndarray, sequences: int) -> np.ndarray:
    """Per layer, cut the passes recovered beyond the summary at the first whose sequence id its ``requests``
    map lacks (a request that began after the last checkpoint); returns the passes dropped per layer.

    An in-memory capture whose seq holds an id its map lacks is refused; recovered rows are the
    summary's future, so they are kept up to the first such pass instead, and the rest is said dropped.
    Those frames were checksummed at load (they lie beyond the summary), so their ids are the writer's.
    """
    dropped = np.zeros(len(passes), dtype=np.int64)
    for layer, segments in enumerate(passes):
        for index, s in enumerate(segments):
            start = s.first
            end = start + s.rows
            if end > stated[layer]:
                if s.tagged:
                    ids = file.gather([(s.offset, s.rows)], np.dtype("<i8"))
                    skip = max(int(stated[layer]) - start, 0)
                    bad = np.flatnonzero(ids[skip:] >= sequences)
                else:
                    bad = np.zeros(1, dtype=np.int64) if sequences == 0 else np.zeros(0, dtype=np.int64)
                    skip = max(int(stated[layer]) - start, 0)
                if bad.size:
                    keep = skip + int(bad[0])
                    dropped[layer] = sum(t.rows for t in segments[index:]) - keep
                    del segments[index:]
                    if keep:
                        segments.append(_Segment(s.offset, keep, s.tagged, s.span, s.first))
                    break
    return dropped


def _check_run(path: str, run: Optional[str], sidecar: str, header_run: bytes) -> None:
    """Refuse a sidecar that is not the JSON's: another run's, left at (or written to) the same path."""
    found = None if header_run == fmt.NO_RUN else header_run.hex()
    if found != run:
        def named(value: Optional[str]) -> str:
            return value if value is not None else "none (written before run ids)"

        raise ValueError(f"{sidecar} is run {named(found)}, but {path} is run {named(run)}: the JSON and the "
                         "sidecar are two runs' files (a new recording at this path replaced one of them), and "
                         "read together they would mix two runs")


def _step_passes(sidecar: str, data: Any, frames: list[tuple[int, int, int]], stream: dict[str, Any],
                 ends: np.ndarray, num_layers: int) -> Optional[np.ndarray]:
    """The capture's engine steps from the sidecar's kind 2 frames: (L, T) int64, or None without marks.

    The steps run from step 0 through every whole frame that follows on (the
    summary's ``steps`` and any recovered after it), cut where a step would
    hold a pass beyond the layer's rows ``ends`` (the summary's, or the last on
    disk beyond them). When steps the summary counts are missing (a
    failed write, or cut off the file) the capture's steps cannot be placed:
    None, with a warning, and the tools form steps as ``--batch`` does.
    """
    stated = stream.get("steps")
    if stated is not None and (type(stated) is not int or stated < 0):
        raise ValueError(f"stream.steps must be a non-negative integer, got {stated!r}")
    if not frames and stated is None:
        return None
    parts, next_step = [], 0
    for first, rows, offset in sorted(frames):
        if first != next_step:
            break  # a gap (or a damaged frame's index): no later step can be placed
        parts.append(np.frombuffer(data, dtype=fmt.STEP_DTYPE, count=rows * num_layers, offset=offset)
                     .reshape(rows, num_layers).astype(np.int64))
        next_step = first + rows
    if stated is not None and next_step < stated:
        warnings.warn(f"{sidecar}: engine steps {next_step} to {stated} that its summary counts are not in the "
                      "file (a failed write, or cut off); the capture's steps are unknown", RuntimeWarning,
                      stacklevel=4)
        return None
    per_step = np.concatenate(parts).T if parts else np.zeros((num_layers, 0), dtype=np.int64)
    within = (np.cumsum(per_step, axis=1) <= ends[:, None]).all(axis=0)
    keep = int(within.sum()) if within.all() else int(np.argmin(within))
    return np.ascontiguousarray(per_step[:, :keep])


def _ordered(found: list[list[tuple[int, _Segment]]]) -> tuple[list[list[_Segment]], int]:
    """Per layer, its frames in row order (two threads' chunks may land in either order), gaps kept;
    and how many frames were left out because they overlap rows an earlier frame holds (a frame whose
    ``first`` is damaged: no writer writes a row twice)."""
    layers, stranded = [], 0
    for frames in found:
        frames.sort(key=lambda item: item[0])
        kept: list[_Segment] = []
        next_row = 0
        for first, segment in frames:
            if first < next_row:
                stranded += 1
                continue
            kept.append(segment)
            next_row = first + segment.rows
        layers.append(kept)
    return layers, stranded


def _gaps(segments: list[_Segment], stated: int) -> list[tuple[int, int]]:
    """The ``(first, stop)`` row ranges a layer's frames leave out, up to ``stated`` rows or the last frame."""
    holes, next_row = [], 0
    for s in segments:
        if s.first > next_row:
            holes.append((next_row, s.first))
        next_row = s.first + s.rows
    if stated > next_row:
        holes.append((next_row, stated))
    return holes


def _aligned(segments: list[_Segment], holes: list[tuple[int, int]],
             pred_holes: list[tuple[int, int]], row_bytes: int) -> list[_Segment]:
    """A layer's prediction frames cut to the rows whose passes are kept (``holes``: the passes' missing
    ranges), up to the first missing prediction of a kept pass: the predictions then line up with the
    kept passes by index (prediction p is pass p's), over their common prefix."""
    if not holes and not pred_holes:
        return segments
    covered = np.array(holes, dtype=np.int64).reshape(-1, 2)
    stop = None
    for first, end in pred_holes:
        # The first row of this hole not in a missing pass's range, if any.
        row = first
        for a, b in covered.tolist():
            if a <= row < b:
                row = b
        if row < end:
            stop = row
            break
    out = []
    for s in segments:
        lo, hi = s.first, s.first + s.rows if stop is None else min(s.first + s.rows, stop)
        cuts = [(a, b) for a, b in covered.tolist() if a < hi and b > lo]
        at = lo
        for a, b in cuts + [(hi, hi)]:
            if a > at:
                # Predictions are never tagged: a row is ``width`` ids, so the rows' bytes are contiguous.
                out.append(_Segment(s.offset + (at - s.first) * row_bytes, a - at, False, first=at))
            at = max(at, b)
    return out


class _Sidecar:
    """The open sidecar: its map (zero-copy views of one frame) and a descriptor for copies.

    A layer's frames are spread over the whole file, one per chunk. Copying
    them out of the map would fault in, and count in this process's memory,
    the pages around each (the kernel maps neighbours, other layers' frames,
    along with it); ``pread`` into the result reads just the frame's bytes.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd  # closed with this object
        self.data: Any = b""  # the map, once made

    def __del__(self) -> None:
        os.close(self.fd)

    def gather(self, pieces: list[tuple[int, int]], dtype: np.dtype) -> np.ndarray:
        """The ``(offset, count)`` runs of ``dtype`` values, one after the other, as one 1-D array."""
        if len(pieces) == 1:
            offset, count = pieces[0]
            return np.frombuffer(self.data, dtype=dtype, count=count, offset=offset)
        out = np.empty(sum(count for _, count in pieces), dtype=dtype)
        flat = memoryview(out).cast("B")
        at = 0
        for offset, count in pieces:
            size = count * dtype.itemsize
            _read_exactly(self.fd, flat[at: at + size], offset)
            at += size
        return out


def _read_exactly(fd: int, into: memoryview, offset: int) -> None:
    done = 0
    while done < len(into):
        got = os.preadv(fd, [into[done:]], offset + done) if hasattr(os, "preadv") else _pread_into(fd, into[done:],
                                                                                                    offset + done)
        if got <= 0:
            raise OSError(f"the sidecar ended at byte {offset + done} while a frame was read (was it cut since it "
                          "was loaded?)")
        done += got


def _pread_into(fd: int, into: memoryview, offset: int) -> int:
    chunk = os.pread(fd, len(into), offset)
    into[: len(chunk)] = chunk
    return len(chunk)


def _ids(file: _Sidecar, segments: list[_Segment], dtype: np.dtype, width: int, lo: int = 0,
         hi: Optional[int] = None) -> np.ndarray:
    """A layer's rows ``lo:hi`` (default: all) from its frames: a view of the map when they sit in one."""
    pieces, start = [], 0
    for s in segments:
        first, last = max(lo, start), s.rows + start if hi is None else min(hi, start + s.rows)
        if first < last:
            skip = (8 * s.span if s.tagged else 0) + (first - start) * width * dtype.itemsize
            pieces.append((s.offset + skip, (last - first) * width))
        start += s.rows
    if not pieces:
        return np.zeros((0, width), dtype=dtype)
    return file.gather(pieces, dtype).reshape(-1, width)


def _tags(file: _Sidecar, segments: list[_Segment], id_bytes: int, width: int, column: int, lo: int = 0,
          hi: Optional[int] = None) -> np.ndarray:
    """A layer's seq (column 0, int64) or phase (column 1, uint8) column, rows ``lo:hi`` (default: all);
    untagged frames read as the defaults."""
    dtype = np.dtype("<i8") if column == 0 else np.dtype("u1")
    # Per frame holding rows of lo:hi: (where its first wanted entry is, or None untagged; how many).
    pieces: list[tuple[Optional[int], int]] = []
    start = 0
    for s in segments:
        first, last = max(lo, start), s.rows + start if hi is None else min(hi, start + s.rows)
        if first < last:
            # A tagged frame's payload: the seq column, the ids, then the phase column.
            base = s.offset if column == 0 else s.offset + s.span * (8 + width * id_bytes)
            pieces.append((base + (first - start) * dtype.itemsize if s.tagged else None, last - first))
        start += s.rows
    located = [(at, count) for at, count in pieces if at is not None]
    if pieces and len(located) == len(pieces):
        return file.gather(located, dtype)
    parts = [np.full(count, 0 if column == 0 else 1, dtype=dtype) if at is None else file.gather([(at, count)], dtype)
             for at, count in pieces]
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _ranges(holes: dict[int, list[tuple[int, int]]]) -> str:
    return ", ".join(f"{layer}: " + " ".join(f"[{a}, {b})" for a, b in ranges) for layer, ranges in holes.items())


def _warn(sidecar: str, info: StreamInfo, *, recomputed: bool) -> None:
    said = []
    if info.dropped_bytes:
        said.append(f"{info.dropped_bytes} bytes from byte {info.read_bytes} on were not read (a frame there is cut "
                    "short or damaged)")
    if info.recovered_passes.any():
        said.append(f"{int(info.recovered_passes.sum())} passes beyond the last checkpoint were recovered "
                    f"(per layer {info.recovered_passes.tolist()})")
    if info.stranded_frames:
        said.append(f"{info.stranded_frames} whole frames hold rows an earlier frame holds (a damaged frame "
                    "header) and were not used")
    holes = {layer: list(ranges) for layer, ranges in enumerate(info.missing) if ranges}
    if holes:
        said.append(f"{sum(b - a for r in holes.values() for a, b in r)} passes are missing (rows [first, stop) "
                    f"per layer: {_ranges(holes)}); the rows after a gap are kept, and the analysis ends each run "
                    "at a gap (capture.stream.missing, .breaks)")
    if info.unmapped_passes is not None and info.unmapped_passes.any():
        said.append(f"{int(info.unmapped_passes.sum())} recovered passes of sequences the requests map does not "
                    f"describe (begun after the last checkpoint) were dropped (per layer "
                    f"{info.unmapped_passes.tolist()})")
    if info.missing_passes.any():
        said.append(f"{int(info.missing_passes.sum())} passes the capture counts are not on disk "
                    f"(per layer {info.missing_passes.tolist()})")
    if recomputed:
        said.append("the counts of those layers are recomputed from the rows on disk")
    warnings.warn(f"{sidecar}: " + "; ".join(said), RuntimeWarning, stacklevel=3)
