"""The JSON writer: the core's part of the capture document (sizes, counts, trace, pred, tags).

Twin of ``csrc/_json.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
The only path: ``RouterHistogram._document`` calls ``_json_document``.
"""

from __future__ import annotations

from typing import Any

from . import _tags
from ._core import Core


class JsonWriter(Core):
    """``_json_document``: the capture's JSON up to ``router_logits``, then the facade's tail."""

    def _json_document(self, tail: bytes, summary: bool = False) -> bytes:
        """The JSON document up to ``router_logits``, followed by ``tail``.

        ``summary``: only the sizes and ``counts`` before ``tail`` (a streamed
        capture's JSON, whose trace, predictions and tags live in its sidecar).
        """
        state = self._state  # one consistent snapshot, whatever runs meanwhile
        num_experts = self._num_experts if self._num_layers else 0
        parts = [
            f'{{"num_layers":{self._num_layers},"num_experts":{num_experts},'
            f'"top_k":{state.top_k},"counts":[{json_rows(layer.counts for layer in state.layers)}]'
        ]
        if summary:
            return "".join(parts).encode("ascii") + tail
        if self._trace is not None:
            rows = (flat[: layer.trace_len] for flat, layer in zip(self._trace, state.layers))
            parts.append(f',"trace":[{json_rows(rows)}]')
            if self._cap is not None:
                dropped = [layer.passes - self._kept(layer.passes) for layer in state.layers]
                parts.append(f',"trace_cap":{self._cap},"trace_dropped":[{",".join(map(str, dropped))}]')
        if self._pred is not None:
            rows = (flat[: layer.pred_len] for flat, layer in zip(self._pred, state.layers))
            parts.append(f',"pred":[{json_rows(rows)}]')
        head = "".join(parts).encode("ascii") + tail
        if not state.tagged:
            return head
        seq_rows = (_tags.padded(flat, layer.tag_len, self._kept(layer.passes) - layer.taken, _tags.DEFAULT_SEQ)
                    for flat, layer in zip(self._seq, state.layers))
        phase_rows = (_tags.padded(flat, layer.tag_len, self._kept(layer.passes) - layer.taken, _tags.DEFAULT_PHASE)
                      for flat, layer in zip(self._phase, state.layers))
        return head + f',"seq":[{json_rows(seq_rows)}],"phase":[{json_rows(phase_rows)}]'.encode("ascii")


def json_rows(rows: Any) -> str:
    return ",".join("[" + ",".join(map(str, row)) + "]" for row in rows)
