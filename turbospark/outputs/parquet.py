"""Parquet export: one row per traced pass, a hive-partitioned dataset DuckDB, polars, pyarrow and Spark read as is.

``export_parquet(captures, directory)`` writes each capture (rank i = the i-th, counted from
``first_rank``) as ``directory/rank=R/layer=L/part-0.parquet``: one file per (rank, layer), every
layer included (a layer without passes is a file of zero rows, so every reader sees the whole
schema and every layer), one row per pass of the layer's trace, in pass order. The layout, the
columns and what each one holds are in docs/exports.md:

* ``pass`` int64: the pass's index in its layer as recorded (0, 1, 2, ...; a streamed capture's
  rows lost to a failed append are absent, so the indices after such a gap jump over it); ``seq`` int64 and ``phase`` uint8
  (0 prompt, 1 decode): its tags, null when the capture has none; ``ids``: its top-k ids in the
  router's order, a list of the smallest unsigned type holding ``num_experts - 1`` (uint8 up to 256
  experts, uint16 up to 65,536, uint32 beyond); ``pred``: the one-layer-ahead prediction filed for
  that pass, the same list type, null where the capture holds none for it; ``step`` int64 (only
  in a capture with recorded engine steps, ``step_passes``): the engine step of the pass.
* Every file's key-value metadata ``turbospark`` is a JSON object naming its source, rank, layer,
  the geometry and the layer's exact ``counts`` (so a capped trace, whose dropped passes are counted
  but not traced, still says what it counted), and ``missing``: the layer's ``[first, stop)`` ranges
  of recorded pass indices that are not in the capture (``capture.stream.missing``; [] for any other
  capture), so a reader knows where a gap breaks the passes' order.

pyarrow is an optional dependency (``pip install 'turbospark[parquet]'``), imported only when an
export runs; without it ``MissingPyarrow`` says what to install. Memory: beyond the capture being
exported, one row group (``ROWS_PER_GROUP`` passes) is built at a time, and captures are taken one
at a time from the iterable, so a lazy iterable keeps one capture loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import numpy as np

from .._atomic import _umask
from ..capture.reader import Capture

__all__ = ["FORMAT", "ROWS_PER_GROUP", "MissingPyarrow", "RankExport", "export_parquet", "id_type"]

FORMAT = "turbospark-parquet/1"
# About 10-20 MiB of zstd-compressed top-8 passes: large enough for the readers' column scans,
# small enough that building one group stays in tens of MiB.
ROWS_PER_GROUP = 1 << 20
_INSTALL = "pip install 'turbospark[parquet]'"


class MissingPyarrow(ImportError):
    """pyarrow is not installed; the message says how to install the ``parquet`` extra."""


@dataclass(frozen=True)
class RankExport:
    """What one capture became: its ``rank``, ``source`` name, rows (passes) and predictions written
    per layer, and per layer the predictions left out because no pass of the layer sits at their index."""

    rank: int
    source: str
    passes: list[int]
    predictions: list[int]
    unaligned_predictions: list[int]


def id_type(num_experts: int) -> np.dtype:
    """The smallest unsigned dtype holding ids 0..num_experts-1: uint8 for up to 256 experts,
    uint16 for up to 65,536, uint32 beyond. Raises ``ValueError`` beyond uint32."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if num_experts <= int(np.iinfo(dtype).max) + 1:
            return np.dtype(dtype)
    raise ValueError(f"{num_experts} experts do not fit uint32 ids")


def export_parquet(
    captures: Iterable[tuple[str, Capture]],
    directory: Union[str, "os.PathLike[str]"],
    *,
    first_rank: int = 0,
    rows_per_group: int = ROWS_PER_GROUP,
) -> list[RankExport]:
    """Write the (name, capture) pairs, rank ``first_rank + i`` for the i-th, as the dataset ``directory``.

    ``directory`` must not exist or be empty; the dataset is built beside it and renamed into place, so
    a failed export leaves nothing behind. Returns one ``RankExport`` per capture. Raises
    ``MissingPyarrow`` without pyarrow, ``ValueError`` naming the capture for one without a trace or
    whose geometry differs from the first's, a negative ``first_rank``, a non-empty ``directory``,
    or no captures at all; ``OSError`` when the directory cannot be written.
    """
    pa, pq = _pyarrow()
    if first_rank < 0:
        raise ValueError(f"the first rank must be 0 or more, got {first_rank}")
    if rows_per_group < 1:
        raise ValueError(f"rows per group must be at least 1, got {rows_per_group}")
    target = os.fspath(directory)
    if os.path.isdir(target) and os.listdir(target):
        raise ValueError(f"{target} exists and is not empty: remove it or name a new directory")
    if os.path.exists(target) and not os.path.isdir(target):
        raise ValueError(f"{target} exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(target))
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(target))}.", dir=parent)
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the dataset from other users
        written: list[RankExport] = []
        first: Optional[tuple[str, Capture]] = None
        for index, (name, capture) in enumerate(captures):
            if first is None:
                first = (name, capture)
            _check_fits(first, name, capture)
            written.append(_write_rank(pa, pq, staging, first_rank + index, name, capture, rows_per_group))
        if first is None:
            raise ValueError("no capture to export")
        os.rename(staging, target)  # an empty target directory is replaced, a new one created
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise MissingPyarrow(f"the Parquet export needs pyarrow ({exc}); install it with {_INSTALL}") from None
    return pyarrow, pyarrow.parquet


def _check_fits(first: tuple[str, Capture], name: str, capture: Capture) -> None:
    if capture.trace is None:
        raise ValueError(f"{name} has counts but no trace: a row per pass needs the trace "
                         "(record with trace=True, or TURBOSPARK_ROUTER_TRACE=1)")
    first_name, head = first
    if capture.header != head.header:
        raise ValueError(f"{name} ({_shape(capture)}) does not fit {first_name} ({_shape(head)}): "
                         "one dataset holds one model's geometry")


def _shape(c: Capture) -> str:
    return f"{c.num_layers} layers x {c.num_experts} experts, top-{c.top_k}"


def _schema(pa: Any, capture: Capture, metadata: dict[str, Any]) -> Any:
    ids = pa.from_numpy_dtype(id_type(capture.num_experts))
    # A capture with recorded engine steps (step_passes) adds a last column, each pass's step.
    step = [("step", pa.int64())] if capture.step_passes is not None else []
    return pa.schema(
        [("pass", pa.int64()), ("seq", pa.int64()), ("phase", pa.uint8()),
         ("ids", pa.list_(ids)), ("pred", pa.list_(ids))] + step,
        metadata={"turbospark": json.dumps(metadata, separators=(",", ":"))},
    )


def _write_rank(pa: Any, pq: Any, root: str, rank: int, name: str, capture: Capture, rows: int) -> RankExport:
    assert capture.trace is not None
    passes, predictions, unaligned = [], [], []
    # Arrow list offsets are int32: a group holds fewer than 2**31 ids.
    rows = max(1, min(rows, (2**31 - 1) // max(capture.top_k, 1) - 1))
    for layer in range(capture.num_layers):
        ids = capture.trace[layer]
        count = int(ids.shape[0])
        held = 0 if capture.pred is None else int(capture.pred[layer].shape[0])
        aligned = min(count, held)
        dropped = None if capture.trace_dropped is None else int(capture.trace_dropped[layer])
        meta = {"format": FORMAT, "source": name, "rank": rank, "layer": layer, **capture.header,
                "passes": count, "predictions": aligned, "unaligned_predictions": held - aligned,
                "trace_cap": capture.trace_cap, "trace_dropped": dropped,
                "counts": capture.counts[layer].tolist(), "missing": [list(r) for r in _missing(capture, layer)]}
        folder = os.path.join(root, f"rank={rank}", f"layer={layer}")
        os.makedirs(folder)
        schema = _schema(pa, capture, meta)
        # zstd: a third smaller than snappy on routing ids, and read by DuckDB, polars, pyarrow and Spark 3.2+.
        with pq.ParquetWriter(os.path.join(folder, "part-0.parquet"), schema, compression="zstd") as writer:
            for start in range(0, count, rows):
                stop = min(start + rows, count)
                writer.write_table(_group(pa, schema, capture, layer, start, stop, aligned))
        passes.append(count)
        predictions.append(aligned)
        unaligned.append(held - aligned)
    return RankExport(rank, name, passes, predictions, unaligned)


def _group(pa: Any, schema: Any, capture: Capture, layer: int, start: int, stop: int, aligned: int) -> Any:
    """Passes start..stop-1 of ``layer`` as one row group."""
    assert capture.trace is not None
    n, k = stop - start, capture.top_k
    dtype = id_type(capture.num_experts)
    # Trace arrays may be narrow (uint8/uint16) or lazily mapped: slice first, then convert the slice.
    ids = _list(pa, capture.trace[layer][start:stop], n, k, dtype)
    if capture.pred is None or aligned <= start:
        pred = pa.nulls(n, type=schema.field("pred").type)
    else:
        have = min(stop, aligned) - start  # rows of this group with a prediction: a prefix
        pred = _list(pa, capture.pred[layer][start : start + have], n, k, dtype)
    if capture.seq is None or capture.phase is None:
        seq, phase = pa.nulls(n, type=pa.int64()), pa.nulls(n, type=pa.uint8())
    else:
        seq = pa.array(np.asarray(capture.seq[layer][start:stop]).astype(np.int64, copy=False))
        phase = pa.array(np.asarray(capture.phase[layer][start:stop]).astype(np.uint8))
    index = pa.array(_recorded(capture, layer, start, stop))
    columns = [index, seq, phase, ids, pred]
    if capture.step_passes is not None:
        from ..capture._steps import steps_of

        columns.append(pa.array(steps_of(capture.step_passes, layer, stop)[start:]))
    return pa.Table.from_arrays(columns, schema=schema)


def _missing(capture: Capture, layer: int) -> list[tuple[int, int]]:
    stream = capture.stream
    return [] if stream is None or not stream.missing else [(int(a), int(b)) for a, b in stream.missing[layer]]


def _recorded(capture: Capture, layer: int, start: int, stop: int) -> np.ndarray:
    """The recorded pass indices of the layer's kept rows start..stop-1: each missing range shifts the rows after it."""
    rows = np.arange(start, stop, dtype=np.int64)
    holes = _missing(capture, layer)
    if not holes:
        return rows
    sizes = np.array([b - a for a, b in holes], dtype=np.int64)
    # A range's first kept row after it, in kept-row indices: its first, less the rows missing before it.
    resume = np.array([a for a, _ in holes], dtype=np.int64) - np.concatenate([[0], np.cumsum(sizes)[:-1]])
    shift = np.concatenate([[0], np.cumsum(sizes)])
    return rows + shift[np.searchsorted(resume, rows, side="right")]


def _list(pa: Any, rows: np.ndarray, n: int, k: int, dtype: np.dtype) -> Any:
    """The first len(rows) of n list entries hold those rows' k ids; the rest are null."""
    have = int(rows.shape[0])
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[: have + 1] = np.arange(0, (have + 1) * k, k, dtype=np.int32)[: have + 1]
    offsets[have + 1 :] = have * k
    values = pa.array(np.ascontiguousarray(rows, dtype=dtype).reshape(-1))
    mask = None if have == n else pa.array(np.arange(n) >= have)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)
