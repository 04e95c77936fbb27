"""``turbospark merge``: the per-rank captures of one run joined into one capture.

* The captures must agree on geometry (num_layers, num_experts, top_k) and
  on what was recorded (trace on or off, probe on or off, a router-logit row
  or not); otherwise ``ValueError`` names the files and the difference.
* ``counts`` are summed. ``trace`` and ``pred`` rows are concatenated per
  layer in argument order, and every input's passes become sequences of
  their own: the output's ``seq`` (per pass) is the input's own sequence id
  (0 for a capture without sequence information) plus an offset, the sum of
  the widths (largest sequence id + 1, or 0 without passes) of the inputs
  before it; ``phase`` is copied (1, decode, without sequence information).
  So window and per-sequence metrics never join passes of two ranks. ``seq``
  and ``phase`` are written when the inputs hold a trace or sequence
  information; counts-only captures merge to counts only.
* Predictions align with passes by index, so each input but the last must
  hold as many predictions as passes in every layer where any input holds
  predictions; otherwise the later files' predictions would shift.
* ``router_logits``: the first input's row (its pass index still points at
  the same pass, since the first input's passes come first).

The same inputs in any grouping (``merge(merge(A, B), C)``, ``merge(A,
merge(B, C))``, ``merge(A, B, C)``) give byte-identical files: sums and
concatenations are associative, and the offsets are sums of widths.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..recording._f32display import format_f32_row
from .capture_sequences import Sequences, layer_passes
from .capture import Capture

__all__ = ["merge_captures"]


def merge_captures(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> str:
    """Merge (name, capture, (seq, phase) or None) triples; returns the JSON text (no newline, as the recorder writes)."""
    _check(inputs)
    first_name, first, _ = inputs[0]
    captures = [capture for _, capture, _ in inputs]
    counts = sum((c.counts for c in captures[1:]), captures[0].counts.copy())
    parts = [f'{{"num_layers":{first.num_layers},"num_experts":{first.num_experts},"top_k":{first.top_k}',
             f',"counts":{_rows(list(counts))}']
    if first.trace is not None:
        parts.append(f',"trace":{_rows(_joined([c.trace for c in captures], first.num_layers))}')
    if first.pred is not None:
        parts.append(f',"pred":{_rows(_joined([c.pred for c in captures], first.num_layers))}')
    if first.router_logits is not None:
        logits = first.router_logits
        values = "null" if logits.values is None else format_f32_row(logits.values.astype(np.float32))
        parts.append(f',"router_logits":{{"layer":{logits.layer},"pass":{logits.pass_index},"values":{values}}}')
    if first.trace is not None or any(seqs is not None for _, _, seqs in inputs):
        seq, phase = _sequences(inputs)
        parts.append(f',"seq":{_rows(seq)},"phase":{_rows(phase)}')
    parts.append("}")
    return "".join(parts)


def _check(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> None:
    first_name, first, _ = inputs[0]
    settings = {"trace": lambda c: c.trace is not None, "predictions (pilot probe)": lambda c: c.pred is not None,
                "a router-logit row": lambda c: c.router_logits is not None}
    for name, capture, _ in inputs[1:]:
        if capture.header != first.header:
            raise ValueError(
                f"cannot merge {first_name} and {name}: different geometry "
                f"({_shape(first)} against {_shape(capture)})")
        for what, has in settings.items():
            if has(capture) != has(first):
                with_it, without = (first_name, name) if has(first) else (name, first_name)
                raise ValueError(f"cannot merge {with_it} and {without}: {with_it} has {what}, {without} has not")
    if first.pred is None:
        return
    for layer in range(first.num_layers):
        if not any(len(capture.pred[layer]) for _, capture, _ in inputs):
            continue
        for name, capture, _ in inputs[:-1]:
            passes = layer_passes(capture)[layer]
            if len(capture.pred[layer]) != passes:
                raise ValueError(
                    f"cannot merge {name}: layer {layer} holds {len(capture.pred[layer])} predictions for "
                    f"{passes} passes, so the predictions of the files after it would not line up with their passes")


def _shape(c: Capture) -> str:
    return f"{c.num_layers} layers x {c.num_experts} experts, top-{c.top_k}"


def _joined(rows: list, num_layers: int) -> list[np.ndarray]:
    return [np.concatenate([r[layer].reshape(-1) for r in rows]) for layer in range(num_layers)]


def _sequences(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    offset = 0
    seq_parts, phase_parts = [], []
    for _, capture, seqs in inputs:
        passes = layer_passes(capture)
        if seqs is None:
            seq = [np.zeros(n, dtype=np.int64) for n in passes]
            phase = [np.ones(n, dtype=np.int64) for n in passes]
        else:
            seq, phase = seqs
        seq_parts.append([row + offset for row in seq])
        phase_parts.append(phase)
        # The width of an input: its largest sequence id + 1, or 0 when it has no passes.
        offset += max((int(row.max()) + 1 for row in seq if row.size), default=0)
    layers = len(inputs[0][1].counts)
    return _joined(seq_parts, layers), _joined(phase_parts, layers)


def _rows(rows: list[np.ndarray]) -> str:
    return "[" + ",".join("[" + ",".join(map(str, row.tolist())) + "]" for row in rows) + "]"
