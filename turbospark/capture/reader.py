"""Load a router-histogram capture (the JSON ``RouterHistogram`` writes) into numpy arrays.

The file is ``{"num_layers":L,"num_experts":E,"top_k":K,"counts":[[E ints] x L]``
then optionally ``"trace"`` and ``"pred"`` (L rows of flat ids, K per pass),
``"trace_cap"`` and ``"trace_dropped"`` (a capped trace: passes kept per layer,
and per layer the passes beyond it, counted but not traced),
``"router_logits"``, ``"seq"`` and ``"phase"`` (L rows, one entry per traced pass), and ``"requests"``
(what each sequence id stands for, from the vLLM plugin). ``load`` returns a ``Capture`` whose ``trace`` and ``pred``
rows are reshaped to (passes, top_k), or raises ``ValueError`` naming what is
wrong with the file.

Parsing: the integer rows are nearly the whole file, and ``json.loads`` turns
every id into a Python int before numpy copies it again. The fast path below
finds each row's text and lets numpy parse it straight into int64, several
times faster; any layout it does not fully understand (non-ASCII bytes, a
stray token, an overflowing number) falls back to ``json.loads``, which also
gives the precise error for a malformed file. Both paths feed one validator.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ._f32display import logits_member
from ._steps import read_step_passes

__all__ = ["Capture", "Request", "RouterLogits", "load", "loads", "requests_key"]

# Keys whose values are L rows of non-negative integers.
_ROW_KEYS = ("counts", "trace", "pred", "seq", "phase")
_INT64_MAX = np.iinfo(np.int64).max


class _NegativeZero(int):
    """A JSON ``-0``: Rust's ``Display`` of the f32 -0.0 in a logit row (json reads it as the int 0,
    losing the sign, so an export would write ``0``); anywhere else it reads as a plain 0."""


def _int_parser() -> tuple[Any, list[bool]]:
    """A json ``parse_int`` that reads ``-0`` as ``_NegativeZero``, and a list it appends to when it does."""
    seen: list[bool] = []

    def parse_int(text: str) -> int:
        if text == "-0":
            seen.append(True)
            return _NegativeZero(0)
        return int(text)

    return parse_int, seen


def _plain(value: Any) -> Any:
    """``value`` with every ``_NegativeZero`` in it made a plain 0 (outside a logit row a zero is a zero)."""
    if isinstance(value, _NegativeZero):
        return 0
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _signed_zeros(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields parsed with ``_parse_int``: -0 kept (as -0.0) in ``router_logits.values`` only."""
    out = {}
    for key, value in fields.items():
        if key == "router_logits" and isinstance(value, dict):
            values = value.get("values")
            out[key] = {k: _plain(v) for k, v in value.items()}
            if isinstance(values, list):
                out[key]["values"] = [-0.0 if isinstance(v, _NegativeZero) else v for v in values]
        else:
            out[key] = _plain(value)
    return out


@dataclass(frozen=True)
class RouterLogits:
    """The optional raw router-logit row: requested ``layer`` and ``pass_index``,
    and the captured ``values`` (float64 array) or None when that pass never ran."""

    layer: int
    pass_index: int
    values: np.ndarray | None


@dataclass(frozen=True)
class Request:
    """What one sequence id of a capture stands for (the ``"requests"`` key, written by the vLLM plugin).

    ``seq``: the sequence id (the entry's index); ``request``: the engine's
    request id; ``attempt``: 0 for the request's first run, n for its n-th
    rerun after a preemption (those passes re-route positions routed
    before); ``start``: the position of the sequence's first routed token
    (above 0 on attempt 0 exactly when the prefix cache held the first
    ``start`` prompt tokens, which were never routed); ``prompt``: the
    request's prompt length. Pass p of a layer within the sequence is
    position ``start + p``; positions below ``prompt`` are prompt tokens.
    """

    seq: int
    request: str
    attempt: int
    start: int
    prompt: int


def logits_json(logits: RouterLogits) -> str:
    """A loaded logit row's ``router_logits`` member, written back as the recorder wrote it."""
    values = None if logits.values is None else logits.values.astype(np.float32)
    return logits_member(logits.layer, logits.pass_index, values)


def requests_key(entries: Iterable[Request], offset: int = 0) -> str:
    """The ``,"requests":[...]`` key as the vLLM plugin writes it (ASCII JSON), every ``seq`` plus ``offset``."""
    items = ",".join('{"seq":%d,"request":%s,"attempt":%d,"start":%d,"prompt":%d}'
                     % (e.seq + offset, json.dumps(e.request, ensure_ascii=True), e.attempt, e.start, e.prompt)
                     for e in entries)
    return ',"requests":[' + items + "]"


@dataclass(frozen=True, eq=False)
class Capture:
    """One capture, as numpy arrays.

    ``counts``: (num_layers, num_experts) int64, how often each expert was picked.
    ``trace``: None, or a tuple of num_layers int64 arrays shaped (passes, top_k),
    layer l's selections in pass order; layers that never routed have shape (0, top_k).
    ``pred``: None, or the same for the one-layer-ahead predictions; row 0 is
    (0, top_k) in captures from the recorder, and a row may hold fewer passes
    than the trace (only the common prefix aligns).
    ``router_logits``: None, or the single captured logit row.
    ``seq`` and ``phase``: None, or a list of num_layers 1-D int64 arrays with one
    entry per pass of the layer: the pass's sequence id, and its phase (0 =
    prompt, 1 = decode), when the capture was recorded with ``record_batch``.
    ``pilot_distance``: None, or per layer how many layers before it its
    predictions were made (0: none), present when a model capture's probe
    crossed a dense layer.
    ``trace_cap`` and ``trace_dropped``: None, or (a capture recorded with
    ``trace_cap``) the passes per layer the trace kept, and a (num_layers,)
    int64 array of the passes each layer recorded beyond them: counted in
    ``counts``, absent from ``trace``, ``pred``, ``seq`` and ``phase``, which
    hold each layer's first ``trace_cap`` passes.
    ``stream``: None, or for a streamed capture (``trace="stream"``) a
    ``streamed.StreamInfo`` saying what its sidecar held; its ``trace``,
    ``pred``, ``seq`` and ``phase`` are then ``streamed.LayerRows`` sequences
    whose arrays are built on first access, of the sidecar's id width (uint8
    up to 256 experts, uint16 up to 65,536) and phase as uint8.
    ``requests``: None, or one ``Request`` per sequence id (index = seq id),
    in a capture written by the vLLM plugin (``turbospark.vllm``).
    ``step_passes``: None, or (num_layers, T) int64, the passes each layer routed
    in each of T engine steps marked by ``RouterHistogram.mark_step``
    (``turbospark.capture._steps``).
    """

    num_layers: int
    num_experts: int
    top_k: int
    counts: np.ndarray
    trace: tuple[np.ndarray, ...] | None = None
    pred: tuple[np.ndarray, ...] | None = None
    router_logits: RouterLogits | None = None
    seq: list[np.ndarray] | None = None
    phase: list[np.ndarray] | None = None
    pilot_distance: tuple[int, ...] | None = None
    trace_cap: int | None = None
    trace_dropped: np.ndarray | None = None
    stream: Any = None
    requests: tuple[Request, ...] | None = None
    step_passes: np.ndarray | None = None

    @property
    def header(self) -> dict[str, int]:
        """The shape fields of the file: num_layers, num_experts, top_k."""
        return {"num_layers": self.num_layers, "num_experts": self.num_experts, "top_k": self.top_k}

    @property
    def totals(self) -> np.ndarray:
        """Per-layer count totals N, shape (num_layers,)."""
        return self.counts.sum(axis=1)


def load(path: str | os.PathLike[str], *, verify: bool = False) -> Capture:
    """Read the capture file at ``path``.

    Returns a ``Capture``. A streamed capture's sidecar (``PATH.trace``) is
    memory-mapped; ``verify`` checks every frame's checksum (by default only
    those written after the summary, see ``streamed``). Raises ``OSError``
    when a file cannot be read and ``ValueError`` (naming the problem) when it
    is not a well-formed capture.
    """
    with open(path, "rb") as handle:
        data = handle.read()
    fields = _fields(data)
    base = _build(fields)
    if "stream" not in fields:
        return base
    if base.trace is not None or base.pred is not None or base.seq is not None:
        raise ValueError("a streamed capture's JSON holds no trace, pred or seq: its rows are in its sidecar")
    from .streamed import load_streamed

    return load_streamed(os.fspath(path), fields, base, verify=verify)


def loads(data: str | bytes) -> Capture:
    """Parse capture JSON text (str or bytes); returns a ``Capture``.

    Raises ``ValueError`` naming the problem when the text is not a well-formed capture.
    """
    fields = _fields(data)
    if "stream" in fields:
        raise ValueError("this is a streamed capture's summary: its rows are in a sidecar file beside it; "
                         "read it with turbospark.load(path)")
    return _build(fields)


def _fields(data: str | bytes) -> dict[str, Any]:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fields = _fast_fields(raw)
    return _json_fields(raw) if fields is None else fields


# ---------------------------------------------------------------- fast path

# JSON's whitespace is exactly these four bytes (regex \s would add \f and \v).
_WS = rb"[ \t\r\n]*"
_KEY = re.compile(_WS + rb'"([A-Za-z_][A-Za-z0-9_]*)"' + _WS + rb":" + _WS)
_EMPTY_ROWS = re.compile(rb"\[" + _WS + rb"\]")
_ROWS_END = re.compile(rb"\]" + _WS + rb"\]")
_SEPARATOR = re.compile(_WS + rb"([,}])")
# Whitespace may separate tokens but never split one: "[1 1]" is not "[11]".
_SPLIT_NUMBER = re.compile(rb"[0-9][ \t\r\n]+[0-9]")
_WHITESPACE = b" \t\r\n"


class _NotFast(Exception):
    """The fast parser met something it leaves to json.loads."""


def _fast_fields(raw: bytes) -> dict[str, Any] | None:
    """Top-level fields with integer rows parsed by numpy; None to fall back."""
    if not raw.isascii():
        return None
    text = raw.decode("ascii")  # same indices as raw; raw_decode needs str
    decoder = json.JSONDecoder()
    logits_decoder = json.JSONDecoder(parse_int=_int_parser()[0])
    pos = len(raw) - len(raw.lstrip(_WHITESPACE))
    if raw[pos : pos + 1] != b"{":
        return None
    pos += 1
    fields: dict[str, Any] = {}
    try:
        while True:
            key_match = _KEY.match(raw, pos)
            if key_match is None:
                return None
            key = key_match.group(1).decode("ascii")
            pos = key_match.end()
            if key in fields:
                return None  # duplicate key: let json.loads decide (last one wins)
            if key in _ROW_KEYS and raw[pos : pos + 1] == b"[":
                fields[key], pos = _fast_rows(raw, pos)
            elif key == "router_logits":
                value, pos = logits_decoder.raw_decode(text, pos)
                fields[key] = _signed_zeros({key: value})[key]
            else:
                fields[key], pos = decoder.raw_decode(text, pos)
            sep = _SEPARATOR.match(raw, pos)
            if sep is None:
                return None
            pos = sep.end()
            if sep.group(1) == b"}":
                break
    except (_NotFast, ValueError):
        return None
    if raw[pos:].strip(_WHITESPACE):
        return None
    return fields


def _fast_rows(raw: bytes, pos: int) -> tuple[list[np.ndarray], int]:
    """Parse ``[[1,2],[],[3]]`` starting at ``pos``; returns (rows, end)."""
    empty = _EMPTY_ROWS.match(raw, pos)
    if empty is not None:
        return [], empty.end()
    end_match = _ROWS_END.search(raw, pos)
    if end_match is None:
        raise _NotFast
    end = end_match.end()
    block = raw[pos + 1 : end - 1]  # "[..],[..],[..]"
    # Only digits, commas, brackets and whitespace may appear; signs, dots,
    # exponents or anything else go to the exact json path.
    rest = block.translate(None, b"0123456789,[]")
    if rest:
        if rest.translate(None, _WHITESPACE) or _SPLIT_NUMBER.search(block):
            raise _NotFast
        block = b"".join(block.split())
    if not (block.startswith(b"[") and block.endswith(b"]")):
        raise _NotFast
    pieces = block[1:-1].split(b"],[")
    if block.count(b"[") != len(pieces) or block.count(b"]") != len(pieces):
        raise _NotFast
    rows = []
    with warnings.catch_warnings():
        # fromstring only warns (and stops early) on a token it cannot read.
        warnings.simplefilter("error")
        for piece in pieces:
            if not piece:
                rows.append(np.zeros(0, dtype=np.int64))
                continue
            # Pieces hold digits and commas only now. fromstring rejects an
            # empty token (",," or a leading comma) but accepts a trailing one.
            if piece.endswith(b","):
                raise _NotFast
            try:
                row = np.fromstring(piece, dtype=np.int64, sep=",")
            except (ValueError, DeprecationWarning) as exc:
                raise _NotFast from exc
            # numpy clamps an overflowing number to INT64_MAX; json.loads
            # reads it exactly, for the error message.
            top = int(row.max())
            if top == _INT64_MAX:
                raise _NotFast
            # JSON forbids leading zeros ("007"), which fromstring reads
            # happily: the digits written must be exactly the digits needed.
            digits = row.size + sum(
                int(np.count_nonzero(row >= 10**power)) for power in range(1, len(str(top)))
            )
            if digits != len(piece) - (row.size - 1):
                raise _NotFast
            rows.append(row)
    return rows, end


# ---------------------------------------------------------------- slow path

_RUST_INF = re.compile(rb"([\[,]" + _WS + rb"-?)inf(?=" + _WS + rb"[,\]])")


def _json_fields(raw: bytes) -> dict[str, Any]:
    """All top-level fields via json.loads; raises ValueError when not JSON."""
    if not raw.strip(_WHITESPACE):
        raise ValueError("not valid JSON: the capture is empty (was it written?)")
    parse_int, negative_zeros = _int_parser()
    try:
        obj = json.loads(raw, parse_int=parse_int)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        # The Rust runtime prints a non-finite f32 logit as inf / -inf, which
        # JSON lacks; accept that spelling (json already reads NaN).
        patched = _RUST_INF.sub(rb"\1Infinity", raw) if _RUST_INF.search(raw) else None
        try:
            obj = json.loads(patched, parse_int=parse_int) if patched is not None else None
        except ValueError:
            obj = None
        if obj is None:
            end = len(raw.rstrip(_WHITESPACE))
            # The text stopped before the document did (a string left open runs to the end).
            if isinstance(exc, json.JSONDecodeError) and (exc.pos >= end or exc.msg.startswith("Unterminated string")):
                raise ValueError(
                    f"not valid JSON: the capture is truncated: it stops at byte {end}, before the "
                    "document is complete (was it cut short, or still being written?)"
                ) from None
            raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a capture is a JSON object, got {type(obj).__name__}")
    return _signed_zeros(obj) if negative_zeros else obj


# ---------------------------------------------------------------- validation


def _build(fields: dict[str, Any]) -> Capture:
    """Validate the parsed fields (either path) and assemble a Capture."""
    num_layers = _count_field(fields, "num_layers")
    num_experts = _count_field(fields, "num_experts")
    top_k = _count_field(fields, "top_k")
    if "counts" not in fields:
        raise ValueError("missing key 'counts'")
    count_rows = _int_rows(fields["counts"], "counts", num_layers)
    for layer, row in enumerate(count_rows):
        if row.shape[0] != num_experts:
            raise ValueError(
                f"counts[{layer}] has {row.shape[0]} entries, expected num_experts={num_experts}"
            )
        _check_non_negative(row, f"counts[{layer}]")
    counts = np.stack(count_rows) if num_layers else np.zeros((0, num_experts), dtype=np.int64)
    trace = _id_rows(fields, "trace", num_layers, num_experts, top_k)
    pred = _id_rows(fields, "pred", num_layers, num_experts, top_k)
    logits = _router_logits(fields.get("router_logits"), num_layers)
    seq, phase = _sequence_rows(fields, counts, trace, top_k)
    distance = _pilot_distance(fields.get("pilot_distance"), num_layers)
    cap, dropped = _trace_cap(fields, trace, pred, num_layers)
    requests = _requests(fields.get("requests"), seq)
    step_passes = read_step_passes(fields.get("step_passes"), num_layers)
    return Capture(num_layers, num_experts, top_k, counts, trace, pred, logits, seq, phase, distance, cap, dropped,
                   requests=requests, step_passes=step_passes)


_REQUEST_FIELDS = ("seq", "request", "attempt", "start", "prompt")


def _requests(value: Any, seq: list[np.ndarray] | None) -> tuple[Request, ...] | None:
    """The optional ``requests`` list: entry i describes sequence id i; every seq id must have one."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"requests must be a list of objects, got {_shown(value)}")
    entries = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != set(_REQUEST_FIELDS):
            raise ValueError(f"requests[{index}] must be an object with keys {', '.join(_REQUEST_FIELDS)}, got {_shown(item)}")
        if not isinstance(item["request"], str):
            raise ValueError(f"requests[{index}].request must be a string, got {_shown(item['request'])}")
        for key in ("seq", "attempt", "start", "prompt"):
            number = item[key]
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise ValueError(f"requests[{index}].{key} must be a non-negative integer, got {_shown(number)}")
        if item["seq"] != index:
            raise ValueError(f"requests[{index}].seq must be {index} (entries are listed by sequence id), got {item['seq']}")
        entries.append(Request(index, item["request"], item["attempt"], item["start"], item["prompt"]))
    if seq is not None:
        top = max((int(row.max()) for row in seq if row.size), default=-1)
        if top >= len(entries):
            raise ValueError(f"seq holds sequence id {top}, but requests describes only {len(entries)} sequences")
    return tuple(entries)


def _trace_cap(
    fields: dict[str, Any], trace: tuple[np.ndarray, ...] | None, pred: tuple[np.ndarray, ...] | None, num_layers: int
) -> tuple[int | None, np.ndarray | None]:
    """The optional ``trace_cap`` (a positive integer) and ``trace_dropped`` (one non-negative integer per layer).

    Checks what the file alone can show: the two come together, with a trace;
    no layer keeps more than the cap in its trace or predictions, and a layer
    that dropped passes kept exactly the cap. Whether kept plus dropped passes
    make the counts is ``analyze``'s ``trace_matches_counts`` check, as for any trace.
    """
    if not _pair_present(fields, "trace_cap", "trace_dropped"):
        return None, None
    if trace is None:
        raise ValueError("'trace_cap' is present without 'trace': a cap is a capped trace's")
    cap = fields["trace_cap"]
    if type(cap) is not int or cap < 1:
        raise ValueError(f"trace_cap must be a positive integer, got {_shown(cap)}")
    value = fields["trace_dropped"]
    if not isinstance(value, list) or len(value) != num_layers:
        raise ValueError(f"trace_dropped must be a list of num_layers={num_layers} integers, got {_shown(value)}")
    for layer, item in enumerate(value):
        if type(item) is not int or item < 0:
            raise ValueError(f"trace_dropped[{layer}] must be a non-negative integer, got {_shown(item)}")
        kept = trace[layer].shape[0]
        if kept > cap:
            raise ValueError(f"trace[{layer}] keeps {kept} passes, more than trace_cap={cap}")
        if item and kept != cap:
            raise ValueError(
                f"trace_dropped[{layer}] is {item}, but trace[{layer}] keeps {kept} passes: "
                f"a layer drops passes only once its trace holds trace_cap={cap}"
            )
        if pred is not None and pred[layer].shape[0] > cap:
            raise ValueError(f"pred[{layer}] keeps {pred[layer].shape[0]} predictions, more than trace_cap={cap}")
    try:
        dropped = np.array(value, dtype=np.int64)
    except OverflowError:
        raise ValueError("trace_dropped holds an integer too large for a count") from None
    return cap, dropped


def _pilot_distance(value: Any, num_layers: int) -> tuple[int, ...] | None:
    """The optional ``pilot_distance`` list: one non-negative integer per layer."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != num_layers:
        raise ValueError(f"pilot_distance must be a list of num_layers={num_layers} integers, got {value!r}")
    for layer, item in enumerate(value):
        if type(item) is not int or item < 0:
            raise ValueError(f"pilot_distance[{layer}] must be a non-negative integer, got {item!r}")
    return tuple(value)


def _count_field(fields: dict[str, Any], key: str) -> int:
    if key not in fields:
        raise ValueError(f"missing key {key!r}")
    value = fields[key]
    if type(value) is not int or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


def _int_rows(value: Any, key: str, num_layers: int) -> list[np.ndarray]:
    """L rows of integers as 1-D int64 arrays; raises ValueError otherwise."""
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list of rows, got {type(value).__name__}")
    if len(value) != num_layers:
        raise ValueError(f"{key} has {len(value)} rows, expected num_layers={num_layers}")
    rows = []
    for layer, row in enumerate(value):
        if isinstance(row, np.ndarray):  # from the fast path, already int64
            rows.append(row)
            continue
        where = f"{key}[{layer}]"
        if not isinstance(row, list):
            raise ValueError(f"{where} must be a list of integers, got {type(row).__name__}")
        if not row:
            rows.append(np.zeros(0, dtype=np.int64))
            continue
        # bool is an int subclass and 1.0 would be cast silently: reject both
        # (and null, which is None: the search's default cannot be None).
        bad = next((index for index, v in enumerate(row) if type(v) is not int), -1)
        if bad >= 0:
            raise ValueError(f"{where} must hold integers only, found {_shown(row[bad])}")
        try:
            rows.append(np.array(row, dtype=np.int64))
        except OverflowError:
            raise ValueError(f"{where} holds an integer too large for a count or an id") from None
    return rows


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a nested object may be the size of a whole file."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_non_negative(row: np.ndarray, where: str) -> None:
    if row.size and row.min() < 0:
        raise ValueError(f"{where} holds a negative value {int(row.min())}")


def _id_rows(
    fields: dict[str, Any], key: str, num_layers: int, num_experts: int, top_k: int
) -> tuple[np.ndarray, ...] | None:
    """Optional flat id rows reshaped to (passes, top_k); None when absent."""
    if key not in fields:
        return None
    rows = _int_rows(fields[key], key, num_layers)
    shaped = []
    for layer, row in enumerate(rows):
        where = f"{key}[{layer}]"
        if row.size:
            if top_k == 0:
                raise ValueError(f"{where} holds ids but top_k is 0")
            if row.size % top_k:
                raise ValueError(f"{where} has {row.size} ids, not a multiple of top_k={top_k}")
            low, high = int(row.min()), int(row.max())
            if low < 0 or high >= num_experts:
                bad = low if low < 0 else high
                raise ValueError(
                    f"{where} holds expert id {bad}, outside 0..{num_experts - 1}"
                )
        shaped.append(row.reshape(-1, top_k) if top_k else row.reshape(0, 0))
    return tuple(shaped)


def _pair_present(fields: dict[str, Any], first: str, second: str) -> bool:
    """Whether the two keys that come together are there; raises ValueError when only one is."""
    if (first in fields) != (second in fields):
        present, missing = (first, second) if first in fields else (second, first)
        raise ValueError(f"{present!r} is present without {missing!r}: the two come together")
    return first in fields


def _sequence_rows(
    fields: dict[str, Any], counts: np.ndarray, trace: tuple[np.ndarray, ...] | None, top_k: int
) -> tuple[list[np.ndarray] | None, list[np.ndarray] | None]:
    """The optional per-pass ``seq`` and ``phase`` rows, one entry per pass of each layer."""
    if not _pair_present(fields, "seq", "phase"):
        return None, None
    num_layers = counts.shape[0]
    seq = _int_rows(fields["seq"], "seq", num_layers)
    phase = _int_rows(fields["phase"], "phase", num_layers)
    for layer in range(num_layers):
        if trace is not None:
            passes = trace[layer].shape[0]
        else:
            total = int(counts[layer].sum())
            passes = total // top_k if top_k else 0
        for key, row in (("seq", seq[layer]), ("phase", phase[layer])):
            if row.shape[0] != passes:
                raise ValueError(
                    f"{key}[{layer}] has {row.shape[0]} entries, expected one per pass of the layer ({passes})"
                )
        _check_non_negative(seq[layer], f"seq[{layer}]")
        bad = phase[layer][(phase[layer] != 0) & (phase[layer] != 1)]
        if bad.size:
            raise ValueError(f"phase[{layer}] holds {int(bad[0])}; a phase is 0 (prompt) or 1 (decode)")
    return seq, phase


def _router_logits(value: Any, num_layers: int) -> RouterLogits | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"router_logits must be an object, got {type(value).__name__}")
    for key in ("layer", "pass"):
        if type(value.get(key)) is not int or value[key] < 0:
            got = f", got {_shown(value[key])}" if key in value else " (missing)"
            raise ValueError(f"router_logits.{key} must be a non-negative integer{got}")
    if value["layer"] >= num_layers:
        raise ValueError(f"router_logits.layer {value['layer']} is not below num_layers={num_layers}")
    values = value.get("values")
    if values is not None:
        # The Python recorder writes a non-finite logit as null; read it as NaN.
        if not isinstance(values, list):
            raise ValueError(f"router_logits.values must be a list of numbers or null, got {_shown(values)}")
        for index, v in enumerate(values):
            if v is not None and type(v) not in (int, float):
                raise ValueError(f"router_logits.values[{index}] must be a number or null, found {_shown(v)}")
        values = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return RouterLogits(value["layer"], value["pass"], values)

