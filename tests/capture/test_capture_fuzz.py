"""The loader's fast path against the ``json`` module, on mutated captures.

Whatever ``_fast_fields`` accepts, ``json.loads`` must accept too, with the
same value for every field; and ``loads`` as a whole must agree with the
json path (same capture, or a ValueError from both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from turbospark.capture import reader as capture_module
from turbospark.capture.reader import loads
from turbospark.cli import main

# Every byte class the fast path treats specially, plus some it must leave alone.
PIECES = list(' \t\r\n\x0b\x0c0123456789,[]{}:"-+.eE') + [
    "", "00", "1 1", "99999999999999999999", ",,", "[]", "] [", "\u00e9",
    # Values of the wrong kind where an integer belongs.
    "null", "true", "false", '{"a":[1]}', "{}", "1.5", "2.0", "1e3", "-0.0"]
LAYOUTS = [{"separators": (",", ":")}, {}, {"indent": 1}, {"indent": "\t"}]


@st.composite
def documents(draw: Any) -> str:
    """A well-formed capture in one of the layouts a writer might use."""
    return json.dumps(draw(capture_dicts()), **draw(st.sampled_from(LAYOUTS)))


@st.composite
def capture_dicts(draw: Any) -> dict[str, Any]:
    """A well-formed capture as a dict: counts, and any of trace, pred, router_logits, seq and phase."""
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
    if draw(st.booleans()):
        passes = [len(row) // k for row in trace]
        doc["seq"] = [draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)) for n in passes]
        doc["phase"] = [draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)) for n in passes]
    return doc


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
    arrays = [None if rows is None else [r.tolist() for r in rows] for rows in (cap.trace, cap.pred, cap.seq, cap.phase)]
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


# JSON values that are not integers, as json.loads reads them.
NOT_INTEGERS = [None, True, False, {}, {"a": [1]}, [1], [], 1.5, 2.0, -0.0, 1e300, "1", {"big": list(range(100))}]
ROW_KEYS = ("counts", "trace", "pred", "seq", "phase")


def shown(value: Any) -> str:
    """The loader's rendering of an offending value: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@st.composite
def poisoned(draw: Any) -> tuple[bytes, str]:
    """A well-formed capture with one value of every array key's rows (or of router_logits)
    replaced by, or joined by, a non-integer; returns (text, the loader's exact message)."""
    doc = draw(capture_dicts().filter(lambda d: d["num_layers"] > 0))
    keys = [key for key in ROW_KEYS if key in doc] + (["router_logits"] if "router_logits" in doc else [])
    key = draw(st.sampled_from(keys))
    bad = draw(st.sampled_from(NOT_INTEGERS))
    if key == "router_logits":
        logits = doc[key]
        field = draw(st.sampled_from(["layer", "pass", "values"]))
        if field == "values":
            bad = draw(st.sampled_from([v for v in NOT_INTEGERS if v is not None and type(v) not in (int, float)]))
            at = draw(st.integers(0, len(logits["values"])))
            logits["values"].insert(at, bad)
            message = f"router_logits.values[{at}] must be a number or null, found {shown(bad)}"
        else:
            logits[field] = bad
            message = f"router_logits.{field} must be a non-negative integer, got {shown(bad)}"
    else:
        layer = draw(st.integers(0, doc["num_layers"] - 1))
        row = doc[key][layer]
        at = draw(st.integers(0, len(row)))
        if at < len(row) and draw(st.booleans()):
            row[at] = bad
        else:
            row.insert(at, bad)
        message = f"{key}[{layer}] must hold integers only, found {shown(bad)}"
    return json.dumps(doc, **draw(st.sampled_from(LAYOUTS))).encode(), message


@settings(max_examples=300, deadline=None)
@given(case=poisoned())
def test_a_non_integer_in_any_array_is_a_value_error_naming_key_and_value(case: tuple[bytes, str]) -> None:
    text, message = case
    for parse in (loads, via_json):
        with pytest.raises(ValueError) as info:
            parse(text)
        assert str(info.value) == message


@pytest.mark.parametrize("key", ROW_KEYS)
@pytest.mark.parametrize("bad, shown_as", [("null", "None"), ("true", "True"), ('{"a":{"b":[1]}}', "{'a': {'b': [1]}}"),
                                           ("1.5", "1.5"), ("3.0", "3.0")])
def test_the_cli_exits_2_naming_key_and_value(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                              key: str, bad: str, shown_as: str) -> None:
    rows = {"counts": "[[1,1]]", "trace": "[[0,1]]", "pred": "[[1,0]]", "seq": "[[0,0]]", "phase": "[[0,1]]"}
    rows[key] = rows[key][:-2] + "," + bad + "]]"
    path = tmp_path / "c.json"
    path.write_text('{"num_layers":1,"num_experts":2,"top_k":1,' + ",".join(f'"{k}":{v}' for k, v in rows.items()) + "}")
    assert main(["analyze", str(path)]) == 2
    assert capfd.readouterr() == ("", f"turbospark: cannot read {path}: {key}[0] must hold integers only, found {shown_as}\n")
