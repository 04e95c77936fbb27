"""``turbospark export CAPTURE --to json``: any loaded capture as the reference's JSON document.

The bytes are those the in-memory recorder (``trace=True``) writes for the
same recording: members in the recorder's order (sizes, ``counts``,
``trace``, ``trace_cap``/``trace_dropped``, ``pred``, ``router_logits``,
``seq``/``phase``), then ``pilot_distance`` as a model capture writes it and
``requests`` as the vLLM plugin writes it, no
whitespace, no newline. For a streamed capture this is the document the
recorder would have written had it kept the trace in memory; for a JSON
capture it gives the file back, byte for byte. The rows are written one
layer at a time, so a streamed layer's rows are in memory only while that
layer is written. A streamed capture with a gap (rows lost to a failed
append with kept rows after them) is refused (``ValueError`` naming the
rows): the reference's document has no notation for missing rows, so its
trace would read as unbroken across the gap; ``--to parquet`` keeps the gap
(its ``pass`` column holds the recorded row indices).
"""

from __future__ import annotations

from typing import IO, Any

import numpy as np

from ..capture.reader import Capture, logits_json, requests_key
from ..capture.rows import gap_text

__all__ = ["write_json"]


def write_json(capture: Capture, out: IO[bytes], name: str = "the capture") -> None:
    """Write ``capture`` (called ``name`` in a message) to the binary stream ``out`` as the recorder's
    JSON document. Raises ``ValueError``, before writing anything, for a streamed capture with a gap."""
    gaps = gap_text(capture)
    if gaps is not None:
        raise ValueError(f"cannot export {name} as one JSON document: its streamed trace misses rows lost to a "
                         f"failed append, with rows kept after them ({gaps}); the JSON cannot say which rows are "
                         "missing, so its trace would read as unbroken across the gap. --to parquet keeps the "
                         "gap (the pass column holds the recorded row indices)")
    experts = capture.num_experts if capture.num_layers else 0
    out.write(f'{{"num_layers":{capture.num_layers},"num_experts":{experts},"top_k":{capture.top_k},'
              f'"counts":'.encode("ascii"))
    _rows(out, capture.counts)
    if capture.trace is not None:
        out.write(b',"trace":')
        _rows(out, capture.trace)
        if capture.trace_cap is not None:
            dropped = ",".join(map(str, np.asarray(capture.trace_dropped).tolist()))
            out.write(f',"trace_cap":{capture.trace_cap},"trace_dropped":[{dropped}]'.encode("ascii"))
    if capture.pred is not None:
        out.write(b',"pred":')
        _rows(out, capture.pred)
    if capture.router_logits is not None:
        out.write(logits_json(capture.router_logits).encode("ascii"))
    if capture.seq is not None and capture.phase is not None:
        out.write(b',"seq":')
        _rows(out, capture.seq)
        out.write(b',"phase":')
        _rows(out, capture.phase)
    if capture.step_passes is not None:
        rows = ",".join("[" + ",".join(map(str, row)) + "]" for row in capture.step_passes.tolist())
        out.write(f',"step_passes":[{rows}]'.encode("ascii"))
    if capture.pilot_distance is not None:
        out.write(f',"pilot_distance":[{",".join(map(str, capture.pilot_distance))}]'.encode("ascii"))
    if capture.requests is not None:
        out.write(requests_key(capture.requests).encode("ascii"))
    out.write(b"}")


def _rows(out: IO[bytes], rows: Any) -> None:
    out.write(b"[")
    for index in range(len(rows)):
        if index:
            out.write(b",")
        flat = np.asarray(rows[index]).ravel()
        out.write(b"[" + ",".join(map(str, flat.tolist())).encode("ascii") + b"]")
    out.write(b"]")
