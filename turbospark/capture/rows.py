"""A layer's rows, read the same way from an in-memory capture and from a streamed one.

A streamed capture's layers are pages of its sidecar file, never one array: these
helpers count, cut and hand back those pages without building the layer, so that the
readers (merge, the per-sequence view) and every metric read a layer in chunks of
``CHUNK_PASSES`` rows, whatever its length.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["CHUNK_PASSES", "gap_text", "layer_breaks", "layer_gaps", "layer_rows"]

# 256 Ki passes: 2 MiB of a uint8 top-8 trace, 16 MiB as int64; large enough
# that the per-chunk Python cost vanishes, small enough to bound memory.
CHUNK_PASSES = 1 << 18


def layer_rows(rows: Any, layer: int) -> int:
    """Rows (passes) of ``rows[layer]`` without building a streamed layer."""
    count = getattr(rows, "row_count", None)
    return int(count(layer)) if count is not None else int(rows[layer].shape[0])


def layer_breaks(capture: Any, layer: int) -> list[int]:
    """Where the rows of ``capture``'s layer ``layer`` break: the row indices (ascending, inside the layer)
    at which a streamed capture's rows resume after a gap (a failed write); empty for any other capture.
    A break is a sequence's end and a new one's start for every metric of consecutive passes."""
    stream = getattr(capture, "stream", None)
    return [] if stream is None else stream.breaks(layer)


def layer_gaps(capture: Any, layer: int, *, leading: bool = False) -> list[tuple[int, int]]:
    """The ``(first, stop)`` row ranges (as recorded) a streamed capture's layer ``layer`` misses with kept
    rows on both sides: each is a break (``layer_breaks``); with ``leading``, also one before the layer's
    first kept row (its kept rows then sit at other indices than recorded). Empty for any other capture,
    and a missing tail (nothing kept after it) is never one: the kept rows are then a prefix, unbroken."""
    stream = getattr(capture, "stream", None)
    if stream is None or not stream.missing or capture.trace is None:
        return []
    rows, before, out = layer_rows(capture.trace, layer), 0, []
    for first, stop in stream.missing[layer]:
        kept_before = first - before
        if kept_before < rows and (kept_before > 0 or leading):
            out.append((int(first), int(stop)))
        before += stop - first
    return out


def gap_text(capture: Any, *, leading: bool = False) -> Optional[str]:
    """``layer_gaps`` of every layer as text ("layer 0 rows [10, 20), layer 1 rows [12, 22)"), None without one."""
    listed = [f"layer {layer} rows " + " ".join(f"[{a}, {b})" for a, b in gaps)
              for layer in range(capture.num_layers) if (gaps := layer_gaps(capture, layer, leading=leading))]
    return ", ".join(listed) if listed else None


def _pieces(passes: int, breaks: Sequence[int]) -> list[tuple[int, int]]:
    """The (start, stop) row ranges of a layer of ``passes`` rows cut at ``breaks``."""
    bounds = [0] + [b for b in breaks if 0 < b < passes] + [passes]
    return list(zip(bounds[:-1], bounds[1:]))


def _row_range(rows: Any, layer: int, lo: int, hi: int) -> np.ndarray:
    piece = getattr(rows, "row_range", None)
    return piece(layer, lo, hi) if piece is not None else rows[layer][lo:hi]


def _release(rows: Any) -> None:
    release = getattr(rows, "release", None)
    if release is not None:
        release()
