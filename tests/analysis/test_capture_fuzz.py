"""The loader's fast path against the ``json`` module, on mutated captures.

Whatever ``_fast_fields`` accepts, ``json.loads`` must accept too, with the
same value for every field; and ``loads`` as a whole must agree with the
json path (same capture, or a ValueError from both).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from turbospark.analysis import capture as capture_module
from turbospark.analysis.capture import loads

# Every byte class the fast path treats specially, plus some it must leave alone.
PIECES = list(' \t\r\n\x0b\x0c0123456789,[]{}:"-+.eE') + ["", "00", "1 1", "99999999999999999999", ",,", "[]", "] [", "\u00e9"]


@st.composite
def documents(draw: Any) -> str:
    """A well-formed capture in one of the layouts a writer might use."""
    layers = draw(st.integers(0, 3))
    experts = draw(st.integers(1, 12))
    k = draw(st.integers(1, 3))
    ids = st.lists(st.integers(0, experts - 1), min_size=0, max_size=4).map(lambda row: row * k)
    doc: dict[str, Any] = {"num_layers": layers, "num_experts": experts, "top_k": k}
    trace = [draw(ids) for _ in range(layers)]
    doc["counts"] = [np.bincount(np.array(row, dtype=np.int64), minlength=experts).tolist() for row in trace]
    if draw(st.booleans()):
        doc["trace"] = trace
    if draw(st.booleans()):
        doc["pred"] = [draw(ids) for _ in range(layers)]
    if layers and draw(st.booleans()):
        values = draw(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=3))
        doc["router_logits"] = {"layer": 0, "pass": draw(st.integers(0, 99)), "values": values}
    layout = draw(st.sampled_from([{"separators": (",", ":")}, {}, {"indent": 1}, {"indent": "\t"}]))
    return json.dumps(doc, **layout)


@st.composite
def mutated(draw: Any) -> bytes:
    text = draw(documents())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(st.sampled_from(PIECES)) + text[at + cut :]
    return text.encode("utf-8")


def plain(value: Any) -> Any:
    """Fast-path values as json would give them (numpy rows become lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def summary(text: bytes, parse: Any) -> Any:
    """A comparable view of a parse: the capture's contents, or the fact that it was rejected."""
    try:
        cap = parse(text)
    except ValueError:
        return "rejected"
    arrays = [None if rows is None else [r.tolist() for r in rows] for rows in (cap.trace, cap.pred)]
    logits = cap.router_logits
    return (cap.header, cap.counts.tolist(), arrays, None if logits is None else (
        logits.layer, logits.pass_index, None if logits.values is None else logits.values.tolist()))


def via_json(text: bytes) -> Any:
    return capture_module._build(capture_module._json_fields(text))


@settings(max_examples=500, deadline=None)
@given(text=mutated())
@example(text=b'{"num_layers":1,"num_experts":20,"top_k":1,"counts":[[1 1]]}')
@example(text=b'{"num_layers":1,"num_experts":20,"top_k":2,"counts":[[0]],"trace":[[1\n2]]}')
def test_fast_path_accepts_only_what_json_accepts_and_reads_the_same(text: bytes) -> None:
    fast = capture_module._fast_fields(text)
    if fast is not None:
        expected = json.loads(text)  # raises (failing the test) if json rejects what the fast path took
        assert isinstance(expected, dict)
        assert {key: plain(value) for key, value in fast.items()} == expected
    assert summary(text, loads) == summary(text, via_json)


@pytest.mark.parametrize("row", ["[1 1]", "[1,2 3]", "[12\t3]", "[1\r\n1]", "[[1] [1]]"])
def test_whitespace_inside_a_row_is_rejected_as_json_rejects_it(row: str) -> None:
    text = '{"num_layers":1,"num_experts":20,"top_k":1,"counts":[' + row + "]}"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(ValueError, match="not valid JSON"):
        loads(text.encode())
