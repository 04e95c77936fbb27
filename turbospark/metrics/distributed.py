"""``turbospark analyze FILES...`` (``--dask ADDRESS|local``): the report of the files' merge, from
per-(file, layer) tasks reduced exactly, in this process or on a Dask cluster.

``analyze_files(paths, windows, caches, run=...)`` gives the ``analyze`` document of the capture
``turbospark merge FILES...`` would write (of the one file, for a single path), equal to it byte
for byte once ``json.dumps``-ed. Nothing is merged: each task loads its file (``turbospark.load``,
cached per process, so a worker parses a JSON capture once however many of its layers it runs)
and returns one ``partial.LayerPart``; the parts of a layer are summed in file order and turned
into the report (``partial`` says why each number is exact). A small task per file first
describes its shapes, so the inputs ``merge`` would refuse are refused with its own message; but a
streamed file with a gap (rows lost to a failed append), which ``merge`` refuses because its output
cannot say which rows are missing, is analysed here with the gap as a break (each task reads its
file's ``capture.stream``).

``run(function, *iterables)`` maps the tasks: ``map`` semantics, returning a list in order. The
default runs them here; ``dask_runner(client)`` submits them to Dask distributed
(``Client.map``, gathered). dask is imported only by ``connect`` and ``dask_runner``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ..capture.reader import Capture, load
from ..capture.merge import check_mergeable, input_width
from .layers import _sizes, count_sum_failures, document
from .partial import LayerPart, layer_entry, layer_part, trace_mismatch
from .report import Heading
from .sequences import sequence_ids

__all__ = ["FileOutline", "Runner", "analyze_files", "connect", "dask_runner", "file_outline", "layer_task",
           "load_version"]

Runner = Callable[..., "list[Any]"]
CONNECT_TIMEOUT = "10s"  # how long ``connect`` waits for a scheduler address to answer
_INSTALL = "pip install 'turbospark[dask]'"


@dataclass(frozen=True)
class FileOutline:
    """What the reduction needs of a file beyond its layers: its ``skeleton`` (the capture with its
    trace and predictions replaced by (passes, 0) arrays: shapes without ids), its sequence
    ``width`` (what ``merge`` shifts the next file's ids by: its requests map's length, else largest id + 1,
    0 without passes), its distinct ``sequences`` and whether it is ``tagged``."""

    name: str
    skeleton: Capture
    width: int
    sequences: int
    tagged: bool
    version: tuple[int, ...] = ()


# ------------------------------------------------------------------ tasks (run on the workers)

_loaded: dict[tuple[Any, ...], tuple[Capture, tuple[int, ...]]] = {}
_loaded_lock = threading.Lock()
_KEEP = 2  # captures a process keeps loaded: the file its tasks are on, and the next


def _load(path: str, verify: bool = False) -> Capture:
    return _load_version(path, verify)[0]


def _load_version(path: str, verify: bool = False) -> tuple[Capture, tuple[int, ...]]:
    """``turbospark.load(path)``, parsed once per process while the file is unchanged, and the version
    of the file it read; raises ``ValueError`` naming the file (as ``turbospark analyze`` words it)
    when it cannot be read.

    The version is the JSON's inode (a checkpoint replaces the file: a new inode, even within one mtime
    tick at the same size) with its size and mtime, and for a streamed capture how far its sidecar was
    read (a live one grows): tasks that read two versions of one file are refused by ``analyze_files``.
    """
    try:
        info = os.stat(path)
        key = (os.path.abspath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, verify)
        # One lock for all files: two threads on one file parse it once, and a JSON parse holds the GIL anyway.
        with _loaded_lock:
            if key not in _loaded:
                while len(_loaded) >= _KEEP:
                    del _loaded[next(iter(_loaded))]
                capture = load(path, verify=verify)
                read = -1 if capture.stream is None else capture.stream.read_bytes
                _loaded[key] = (capture, key[1:5] + (read,))
            return _loaded[key]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def load_version(path: str, verify: bool = False) -> tuple[Capture, tuple[int, ...]]:
    """The capture at ``path`` through this process's cache, and the version of the file it read
    (``_load_version``): what a task compares with the client's to refuse a file changed mid-job."""
    return _load_version(path, verify)


def forget_loaded() -> None:
    """Drop this process's loaded captures (after a job, so a long-lived worker holds none)."""
    with _loaded_lock:
        _loaded.clear()


def file_outline(path: str, verify: bool = False) -> FileOutline:
    """The task that describes one file; raises ``ValueError`` naming it when it cannot be read."""
    capture, version = _load_version(path, verify)

    def shapes(rows: Optional[tuple[np.ndarray, ...]]) -> Optional[tuple[np.ndarray, ...]]:
        return None if rows is None else tuple(np.empty((row.shape[0], 0), dtype=np.int64) for row in rows)

    skeleton = Capture(capture.num_layers, capture.num_experts, capture.top_k, capture.counts,
                       shapes(capture.trace), shapes(capture.pred), capture.router_logits, None, None,
                       capture.pilot_distance, capture.trace_cap, capture.trace_dropped, requests=capture.requests)
    if capture.seq is not None:
        return FileOutline(path, skeleton, input_width(capture, capture.seq), len(sequence_ids(capture)), True,
                           version)
    # Untagged: merge makes all its passes sequence 0 (a requests map then takes its own length).
    routed = any(capture.trace[layer].shape[0] for layer in range(capture.num_layers)) if capture.trace is not None \
        else bool(capture.totals.any())
    width = len(capture.requests) if capture.requests is not None else int(routed)
    return FileOutline(path, skeleton, width, int(routed), False, version)


def layer_task(path: str, layer: int, windows: Sequence[int], caches: Sequence[int],
               header: dict[str, int], verify: bool = False
               ) -> tuple[Optional[FileOutline], Optional[LayerPart], tuple[int, ...]]:
    """The task for one (file, layer): the layer's exact partial state, and for layer 0 the file's outline
    too. A file whose geometry is not ``header`` (the first file's) gives no part: the outline makes
    ``merge``'s refusal. Also the version of the file it read (``_load_version``)."""
    capture, version = _load_version(path, verify)
    outline = file_outline(path, verify) if layer == 0 else None
    if capture.header != header:
        return outline, None, version
    return outline, layer_part(capture, layer, windows, caches), version


# ------------------------------------------------------------------ the job (run by the client)


def analyze_files(paths: Sequence[str], windows: Iterable[int], caches: Iterable[int] = (),
                  run: Optional[Runner] = None, verify: bool = False) -> tuple[dict[str, Any], Heading]:
    """The ``analyze`` document of the merge of ``paths`` (of the file itself when there is one), and the
    ``report.Heading`` that ``format_report`` needs beside it for the text report.

    ``run`` maps the tasks (default: in this process). Raises ``ValueError`` naming the file for an
    unreadable or malformed capture, or with ``merge``'s message for files it would not merge, and for
    a window or cache size below 1, and for a file whose tasks read two versions of it (a live capture
    checkpointed meanwhile: its layers would mix two checkpoints). ``verify`` loads with ``verify=True``.
    """
    window_sizes, cache_sizes = _sizes(windows, "window size"), _sizes(caches, "cache size")
    mapper = run if run is not None else _local
    try:
        header = mapper(file_outline, [paths[0]], [verify])[0].skeleton.header
        layers = header["num_layers"]
        # File-major order: a worker's consecutive tasks share the capture it has loaded.
        jobs = [(path, layer) for path in paths for layer in range(layers)]
        results = mapper(layer_task, [p for p, _ in jobs], [l for _, l in jobs], [window_sizes] * len(jobs),
                         [cache_sizes] * len(jobs), [header] * len(jobs), [verify] * len(jobs))
    finally:
        if run is None:
            forget_loaded()
    _check_versions(jobs, [version for _, _, version in results])
    # A capture of no layers has no layer tasks to describe it.
    outlines = [outline for outline, _, _ in results if outline is not None] or [file_outline(p, verify)
                                                                                 for p in paths]
    if len(outlines) == 1:
        tagged = outlines[0].tagged
    else:
        tagged = check_mergeable([(o.name, o.skeleton) for o in outlines], [o.width for o in outlines],
                                 [o.tagged for o in outlines])
    parts = [part for _, part, _ in results]
    summed = parts[:layers]
    for index, part in enumerate(parts[layers:]):
        assert part is not None and summed[index % layers] is not None  # check_mergeable refused other geometries
        summed[index % layers].add(part)
    final = [p for p in summed if p is not None]
    doc = _document(outlines, final, tagged, window_sizes, cache_sizes)
    first = outlines[0].skeleton
    bad_trace = [layer for layer, part in enumerate(final) if part.kept is not None and trace_mismatch(part, first.top_k)]
    dropped = len(outlines) == 1 and first.trace_dropped is not None and bool(first.trace_dropped.any())
    bad_counts = count_sum_failures(Capture(first.num_layers, first.num_experts, first.top_k,
                                            _stacked(final, first.num_experts)))
    return doc, Heading(first.trace is not None, first.pred is not None, bad_counts, bad_trace, dropped)


def _check_versions(jobs: list[tuple[str, int]], versions: list[tuple[int, ...]]) -> None:
    """Refuse a file whose layer tasks read different versions of it (a checkpoint landed between them)."""
    seen: dict[str, tuple[int, ...]] = {}
    for (path, layer), version in zip(jobs, versions):
        if seen.setdefault(path, version) != version:
            raise ValueError(f"{path} changed while it was analysed (a live capture's checkpoint replaced it, or "
                             f"its sidecar grew, between the tasks of layers 0 and {layer}): its layers would mix "
                             "two versions; analyze it again, or a copy of it")


def _stacked(parts: list[LayerPart], num_experts: int) -> np.ndarray:
    return np.stack([part.counts for part in parts]) if parts else np.zeros((0, num_experts), dtype=np.int64)


def _local(function: Callable[..., Any], *iterables: Iterable[Any]) -> "list[Any]":
    return list(map(function, *iterables))


def _document(outlines: list[FileOutline], parts: list[LayerPart], tagged: bool, windows: Sequence[int],
              caches: Sequence[int]) -> dict[str, Any]:
    """``metrics.analyze``'s document, key for key, from the summed parts."""
    first = outlines[0].skeleton
    k, e = first.top_k, first.num_experts
    traced, predicted = first.trace is not None, first.pred is not None
    layers = [layer_entry(part, layer, k, traced=traced, predicted=predicted, tagged=tagged, windows=windows,
                          caches=caches)
              for layer, part in enumerate(parts)]
    # Merge keeps pilot_distance when all agree, and a cap only when nothing was dropped (then it drops it).
    single = len(outlines) == 1
    totals = Capture(first.num_layers, e, k, _stacked(parts, e), pilot_distance=first.pilot_distance,
                     trace_cap=first.trace_cap if single else None,
                     trace_dropped=first.trace_dropped if single else None)
    extra: dict[str, Any] = {"sequences": sum(o.sequences for o in outlines)} if tagged else {}
    trace_ok = None if not traced else not any(trace_mismatch(p, k) for p in parts)
    return document(totals, not count_sum_failures(totals), trace_ok, layers, extra)


# ------------------------------------------------------------------ Dask


def connect(address: str, command: str = "analyze") -> tuple[Any, Any]:
    """(client, cluster) for ``address``: a scheduler address, or ``"local"`` for a new ``LocalCluster``
    of one single-threaded worker process per core (cluster None for an address). Raises ``ImportError``
    naming the extra (and ``command``) without dask, ``ValueError`` naming the address when no scheduler
    answers."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ImportError(f"{command} --dask needs dask distributed ({exc}); install it with {_INSTALL}") from None
    if address == "local":
        import dask

        # Processes, one thread each: the numpy kernels run in parallel without sharing a GIL. Dask starts
        # workers with MALLOC_TRIM_THRESHOLD_=65536, which turns glibc's dynamic mmap threshold off: every
        # large numpy temporary is then mapped and faulted in afresh (a rebalance replay ran 3-4x slower).
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
            cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, processes=True,
                                   dashboard_address=":0")
        return Client(cluster), cluster
    try:
        return Client(address, timeout=CONNECT_TIMEOUT), None
    except (OSError, TimeoutError, ValueError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler at {address!r}: {exc}") from None


def dask_runner(client: Any, last: Optional[Callable[..., Any]] = None) -> Runner:
    """A ``run`` that maps the tasks on ``client``'s cluster and gathers them in order; after the map of
    ``last`` (the job's last task function: ``layer_task`` for ``analyze_files``), the workers drop the
    captures they loaded."""
    final = layer_task if last is None else last

    def run(function: Callable[..., Any], *iterables: Iterable[Any]) -> "list[Any]":
        # pure=False: a file may change between two jobs; never reuse a result by its arguments.
        futures = client.map(function, *iterables, pure=False)
        try:
            return list(client.gather(futures))
        finally:
            client.cancel(futures)
            if function is final:  # the job's last map: long-lived workers keep no capture
                client.run(forget_loaded)

    return run
