"""``turbospark merge``: the per-rank captures of one run joined into one capture.

* The captures must agree on geometry (num_layers, num_experts, top_k) and
  on what was recorded (trace on or off, probe on or off, a router-logit row
  or not); otherwise ``ValueError`` names the files and the difference.
* ``counts`` are summed. ``trace`` and ``pred`` rows are concatenated per
  layer in argument order, and every input's passes become sequences of
  their own: the output's ``seq`` (per pass) is the input's own sequence id
  (0 for a capture without sequence information) plus an offset, the sum of
  the widths of the inputs before it; ``phase`` is copied (1, decode,
  without sequence information). An input's width is the length of its
  ``requests`` map when it has one, else its largest sequence id + 1 (0
  without passes).
  So window and per-sequence metrics never join passes of two ranks. With a
  trace, ``seq`` and ``phase`` are always written. Counts-only captures carry
  them only when every input has them: a counts-only input without them
  would need one entry per pass to stay apart (the file would grow from
  L x E numbers to L x passes), so the merge is then counts only and
  ``dropped_sequences`` says which inputs caused it.
* A shifted sequence id and a summed count must fit in int64 (what ``turbospark.load`` reads);
  otherwise ``ValueError`` names the file and the value, before anything is written.
  So does a counts-only merge whose tags would not match its summed passes.
* ``pilot_distance`` (a model capture whose probe crossed a dense layer) is
  kept when every input has the same one; inputs that differ (or one with
  it, one without) are refused, naming the files and both values.
* Predictions align with passes by index, so each input but the last must
  hold as many predictions as passes in every layer where any input holds
  predictions; otherwise the later files' predictions would shift.
* A capped trace (``trace_cap``) that dropped passes is refused, naming the
  file and its dropped passes: its kept passes are only a layer's first N, so
  concatenating them would hide a gap. One capped without a drop merges as an
  uncapped trace (every pass is in it).
* ``requests`` (the vLLM plugin's map from sequence ids to requests): kept
  when every input has one, as the inputs' maps one after the other, each
  entry's ``seq`` shifted by its input's offset, so the merged map
  describes the merged ids exactly (entry i is sequence id i). An input's
  map may hold entries beyond its largest id (a request whose passes a
  checkpoint had not reached), which is why its width is the map's length.
  Inputs with and without a map are refused, naming both files, and so is
  an input whose map cannot describe its passes (passes without seq tags).
  A counts-only merge that carries no sequence tags carries no map either.
* A streamed capture with a gap (rows lost to a failed append, with kept rows
  on both sides: ``capture.stream.missing``) is refused, naming the file and
  the missing rows: the merged file is an in-memory capture, whose format
  has no notation for missing rows, so its trace would read as unbroken
  across the gap (windows, transitions and caches spanning it).
  ``turbospark analyze FILES...`` reports the merge with every file's gaps
  honoured; a missing tail (or head) is no gap: the kept rows are merged.
  ``analyze FILES...`` is the one consumer that does not refuse them.
* ``router_logits``: the first input's row (its pass index still points at
  the same pass, since the first input's passes come first).

The same inputs in any grouping (``merge(merge(A, B), C)``, ``merge(A,
merge(B, C))``, ``merge(A, B, C)``) give byte-identical files: sums and
concatenations are associative, the offsets are sums of widths, and a
counts-only merge holds sequence information exactly when all of its inputs
do (so an inner merge without it makes every grouping that contains it
counts only, as the flat merge is).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np

from .sequences import Sequences, layer_passes
from . import rows as row_reader
from .rows import layer_rows
from .reader import Capture, Request, logits_json, requests_key

__all__ = ["check_mergeable", "dropped_sequences", "merge_captures", "merged_pieces", "sequence_width"]

_INT64_MAX = int(np.iinfo(np.int64).max)


def merge_captures(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> str:
    """Merge (name, capture, (seq, phase) or None) triples; returns the JSON text (no newline, as the recorder writes).

    Raises ``ValueError`` naming the files when the captures do not fit
    together (geometry, what was recorded, ``pilot_distance``, predictions
    that would shift, sequence ids or summed counts beyond int64, counts-only
    tags that would not match the summed passes).
    """
    return "".join(merged_pieces(inputs))


def merged_pieces(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> Iterator[str]:
    """``merge_captures``' text in pieces of at most ``CHUNK_PASSES`` values (ids or tags) of one layer, for writing
    as they come:
    the memory of a merge of streamed captures is then a chunk, not the merged capture. Checks everything (and
    raises what ``merge_captures`` raises) before it returns."""
    for name, capture, _ in inputs:
        gaps = row_reader.gap_text(capture)
        if gaps is not None:
            raise ValueError(
                f"cannot merge {name}: its streamed trace misses rows lost to a failed append, with rows "
                f"kept after them ({gaps}); a merged capture cannot say which rows are missing, so its trace "
                "would read as unbroken across the gap. turbospark analyze FILES... reports the merge with "
                "each file's gaps as breaks")
    _check(inputs)
    first = inputs[0][1]
    with_sequences = first.trace is not None or all(_tagged(c, seqs is not None) for _, c, seqs in inputs)
    # Everything that can fail is computed before the text is assembled.
    counts = _summed(inputs)
    tags = _sequences(inputs, counts) if with_sequences else None
    return _pieces(inputs, counts, tags)


def _pieces(inputs: list[tuple[str, Capture, Optional[Sequences]]], counts: np.ndarray,
            tags: Optional[list[tuple[Optional[Sequences], int, list[int]]]]) -> Iterator[str]:
    first = inputs[0][1]
    captures = [capture for _, capture, _ in inputs]
    yield (f'{{"num_layers":{first.num_layers},"num_experts":{first.num_experts},"top_k":{first.top_k}'
           f',"counts":{_rows(list(counts))}')
    if first.trace is not None:
        yield ',"trace":'
        yield from _joined_rows([(c.trace, None, 0) for c in captures], first.num_layers)
    if first.pred is not None:
        yield ',"pred":'
        yield from _joined_rows([(c.pred, None, 0) for c in captures], first.num_layers)
    if first.router_logits is not None:
        yield logits_json(first.router_logits)
    if tags is not None:
        yield ',"seq":'
        yield from _joined_rows([(seqs[0] if seqs is not None else None, _SEQ_DEFAULT, offset)
                                 for seqs, offset, _ in tags], first.num_layers, [n for *_, n in tags])
        yield ',"phase":'
        yield from _joined_rows([(seqs[1] if seqs is not None else None, _PHASE_DEFAULT, 0) for seqs, _, _ in tags],
                                first.num_layers, [n for *_, n in tags])
    if first.pilot_distance is not None:
        yield f',"pilot_distance":[{",".join(map(str, first.pilot_distance))}]'
    if tags is not None and first.requests is not None:
        yield _requests_key(captures)
    yield "}"


# What an input without sequence information contributes per pass: sequence 0 (plus its offset), decode.
_SEQ_DEFAULT, _PHASE_DEFAULT = 0, 1


def _joined_rows(parts: list[tuple[Any, Optional[int], int]], num_layers: int,
                 passes: Optional[list[list[int]]] = None) -> Iterator[str]:
    """``_rows`` of each layer's rows of every part one after the other, a chunk at a time.

    A part is (rows per layer, or None: ``default`` for each of the input's ``passes[i][layer]`` passes,
    default, offset added to every value)."""
    yield "["
    for layer in range(num_layers):
        yield "," if layer else ""
        yield "["
        written = False
        for index, (rows, default, offset) in enumerate(parts):
            if rows is not None:
                count = layer_rows(rows, layer)
            else:
                assert passes is not None, "a part without rows is counted by its passes"
                count = passes[index][layer]
            # A chunk of CHUNK_PASSES values, not rows: its text (a str per value, the join's list of them,
            # ~50 bytes a value) is then the same size for a top-8 trace as for a seq column, whatever
            # the layer's length (rows of top-8 ids made a 2 M-value chunk: ~100 MiB of strs).
            chunk = max(1, row_reader.CHUNK_PASSES // _width(rows, layer))
            for lo in range(0, count, chunk):
                hi = min(count, lo + chunk)
                if rows is None:
                    values = np.full(hi - lo, default, dtype=np.int64)
                else:
                    piece = getattr(rows, "row_range", None)
                    values = np.asarray(piece(layer, lo, hi) if piece is not None else rows[layer][lo:hi])
                    values = values.reshape(-1)
                if not values.size:
                    continue
                if offset:
                    values = values.astype(np.int64) + offset
                yield ("," if written else "") + ",".join(map(str, values.tolist()))
                written = True
            release = getattr(rows, "release", None)
            if release is not None:
                release()
        yield "]"
    yield "]"


def _width(rows: Any, layer: int) -> int:
    """Values per row of ``rows[layer]`` (top_k for ids, 1 for tags), read from its first row only."""
    if rows is None or not layer_rows(rows, layer):
        return 1
    piece = getattr(rows, "row_range", None)
    first = np.asarray(piece(layer, 0, 1) if piece is not None else rows[layer][:1])
    return max(1, int(first.size))


def dropped_sequences(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> Optional[list[str]]:
    """The names of the counts-only inputs without sequence information when
    some counts-only input has it (their merge then carries none); else None."""
    if inputs[0][1].trace is not None:
        return None
    without = [name for name, capture, seqs in inputs if not _tagged(capture, seqs is not None)]
    return without if 0 < len(without) < len(inputs) else None


def _check(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> None:
    for name, capture, _ in inputs:
        dropped = capture.trace_dropped
        if dropped is not None and dropped.any():
            listed = ", ".join(f"layer {layer} {int(d)}" for layer, d in enumerate(dropped.tolist()) if d)
            raise ValueError(
                f"cannot merge {name}: its trace is capped at {capture.trace_cap} passes per layer and dropped "
                f"passes ({listed}); a merged trace would hide the gap")
    first_name, first, _ = inputs[0]
    settings = {"trace": lambda c: c.trace is not None, "predictions (pilot probe)": lambda c: c.pred is not None,
                "a router-logit row": lambda c: c.router_logits is not None,
                "a requests map (the vLLM plugin's)": lambda c: c.requests is not None}
    for name, capture, _ in inputs[1:]:
        if capture.header != first.header:
            raise ValueError(
                f"cannot merge {first_name} and {name}: different geometry "
                f"({_shape(first)} against {_shape(capture)})")
        for what, has in settings.items():
            if has(capture) != has(first):
                with_it, without = (first_name, name) if has(first) else (name, first_name)
                raise ValueError(f"cannot merge {with_it} and {without}: {with_it} has {what}, {without} has not")
        if capture.pilot_distance != first.pilot_distance:
            raise ValueError(
                f"cannot merge {first_name} and {name}: different pilot_distance "
                f"({_distance(first)} against {_distance(capture)})")
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


def _distance(c: Capture) -> str:
    if c.pilot_distance is None:
        return "none: every prediction one layer ahead"
    return "[" + ",".join(map(str, c.pilot_distance)) + "]"


def _shape(c: Capture) -> str:
    return f"{c.num_layers} layers x {c.num_experts} experts, top-{c.top_k}"


def _summed(inputs: list[tuple[str, Capture, Optional[Sequences]]]) -> np.ndarray:
    """The summed counts; raises ``ValueError`` rather than let int64 wrap to a negative count."""
    total = inputs[0][1].counts.copy()
    for name, capture, _ in inputs[1:]:
        over = total > _INT64_MAX - capture.counts
        if over.any():
            layer, expert = np.argwhere(over)[0].tolist()
            raise ValueError(
                f"cannot merge {name}: layer {layer}, expert {expert} would count "
                f"{int(total[layer, expert]) + int(capture.counts[layer, expert])}, beyond int64 ({_INT64_MAX})")
        total += capture.counts
    return total


def check_mergeable(inputs: list[tuple[str, Capture]], widths: list[int], tagged: list[bool]) -> bool:
    """Every refusal ``merge_captures`` makes, for inputs known by their shapes alone (``analyze --dask``).

    Takes (name, capture) pairs whose counts, trace and prediction shapes, flags and pilot_distance are
    the files' (the ids themselves are not read), each file's sequence width (largest id + 1, or 0
    without passes) and whether it has sequence tags. Returns whether the merge carries sequences;
    raises the ``ValueError`` ``merge_captures`` would raise.
    """
    triples: list[tuple[str, Capture, Optional[Sequences]]] = [(name, capture, None) for name, capture in inputs]
    _check(triples)
    for (name, capture), has_tags in zip(inputs, tagged):
        _check_map(name, capture, has_tags)
    counts = _summed(triples)
    first = inputs[0][1]
    if not (first.trace is not None or all(_tagged(c, t) for (_, c), t in zip(inputs, tagged))):
        return False
    offset = 0
    for (name, _), width in zip(inputs, widths):
        offset = _shifted(name, offset, width)
    held = np.sum([layer_passes(capture) for _, capture in inputs], axis=0, dtype=np.int64).tolist()
    _check_tag_count(first, counts, held)
    return True


def _shifted(name: str, offset: int, width: int) -> int:
    """The offset after an input of ``width``; raises ``ValueError`` when its ids would pass int64."""
    if width and offset + width - 1 > _INT64_MAX:
        raise ValueError(
            f"cannot merge {name}: its sequence id {width - 1} shifted by {offset} (the widths of the "
            f"captures before it) is {offset + width - 1}, beyond the largest id a capture holds "
            f"({_INT64_MAX}); merge fewer captures, or captures with smaller sequence ids")
    return offset + width


def _check_tag_count(first: Capture, counts: np.ndarray, held: list[int]) -> None:
    """Counts only: the loader reads the merged passes as summed selections // top_k, which the tags must match."""
    if first.trace is not None or not first.top_k:
        return
    for layer, total in enumerate(counts.sum(axis=1).tolist()):
        if total // first.top_k != held[layer]:
            raise ValueError(
                f"cannot merge: layer {layer} holds {total} selections in all, {total // first.top_k} "
                f"passes of top_k={first.top_k}, but the inputs tag {held[layer]}: some input's selections are "
                "not whole passes, so the merged seq would not line up with its passes")


def _sequences(inputs: list[tuple[str, Capture, Optional[Sequences]]],
               counts: np.ndarray) -> list[tuple[Optional[Sequences], int, list[int]]]:
    """Per input: its (seq, phase) or None (its passes read as sequence 0, decode), its sequence-id offset,
    and its passes per layer; raises when the ids or the tags' count would not fit."""
    offset = 0
    out = []
    for name, capture, seqs in inputs:
        _check_map(name, capture, seqs is not None)
        passes = layer_passes(capture)
        if seqs is None:
            width = len(capture.requests) if capture.requests is not None else (1 if any(passes) else 0)
        else:
            width = input_width(capture, seqs[0])
        out.append((seqs, offset, passes if seqs is None else [layer_rows(seqs[0], layer)
                                                                for layer in range(len(passes))]))
        offset = _shifted(name, offset, width)
    first = inputs[0][1]
    layers = len(first.counts)
    _check_tag_count(first, counts, [sum(held[layer] for _, _, held in out) for layer in range(layers)])
    return out


def input_width(capture: Capture, seq: list[np.ndarray]) -> int:
    """How many sequence ids an input takes in a merge: its ``requests`` map's length, else ``sequence_width``.

    The loader guarantees a map covers every id of ``seq`` (its length is at least the largest id + 1).
    """
    return len(capture.requests) if capture.requests is not None else sequence_width(seq)


def _tagged(capture: Capture, has_tags: bool) -> bool:
    """Whether an input's passes are tagged for the merge: seq/phase present, or a requests map and no passes."""
    return has_tags or (capture.requests is not None and not any(layer_passes(capture)))


def _check_map(name: str, capture: Capture, has_tags: bool) -> None:
    """Refuse an input whose requests map cannot describe its passes: passes without seq tags."""
    if capture.requests is not None and not _tagged(capture, has_tags):
        raise ValueError(
            f"cannot merge {name}: it has a requests map but its passes carry no seq tags, so the map "
            "describes none of them")


def _requests_key(captures: list[Capture]) -> str:
    """The merged ``,"requests":[...]`` key: each input's entries, seq shifted by the widths before it."""
    entries, offset = [], 0
    for capture in captures:
        assert capture.requests is not None  # _check refused inputs with and without a map
        entries.extend(Request(r.seq + offset, r.request, r.attempt, r.start, r.prompt) for r in capture.requests)
        offset += len(capture.requests)
    return requests_key(entries)


def sequence_width(seq: Any) -> int:
    """The width of an input: its largest sequence id + 1, or 0 when it has no passes. A streamed seq
    is read a chunk at a time (``row_range``), never a whole layer."""
    piece = getattr(seq, "row_range", None)
    if piece is None:
        return max((int(row.max()) + 1 for row in seq if row.size), default=0)
    top = -1
    for layer in range(len(seq)):
        count = layer_rows(seq, layer)
        for lo in range(0, count, row_reader.CHUNK_PASSES):
            top = max(top, int(piece(layer, lo, min(count, lo + row_reader.CHUNK_PASSES)).max()))
        seq.release()
    return top + 1


def _rows(rows: list[np.ndarray]) -> str:
    return "[" + ",".join("[" + ",".join(map(str, row.tolist())) + "]" for row in rows) + "]"
