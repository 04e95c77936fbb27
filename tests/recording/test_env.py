"""``RouterHistogram.from_env`` and the constructor's own argument checks.

The switches follow the reference's ``var_os(..).is_some()``: presence is
what counts, whatever the value. The logit-row coordinates parse as Rust's
``str::parse::<usize>``; where the reference silently drops an unusable
setting, we drop it too but say so with a ``RuntimeWarning`` naming the
variable and its value, and recording goes on without the row.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from turbospark import RouterHistogram
from capture_helpers import ONE_PASS

HIST = "TURBOSPARK_ROUTER_HIST"
TRACE = "TURBOSPARK_ROUTER_TRACE"
PILOT = "TURBOSPARK_PILOT_PROBE"
LAYER = "TURBOSPARK_ROUTER_LOGITS_LAYER"
PASS = "TURBOSPARK_ROUTER_LOGITS_PASS"
ALL_VARS = (HIST, TRACE, PILOT, LAYER, PASS, "TURBOSPARK_ROUTER_TRACE_CAP")

EMPTY_2x3 = '{"num_layers":2,"num_experts":3,"top_k":0,"counts":[[0,0,0],[0,0,0]]'


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test with none of the recorder's variables set (the backend switch is left alone)."""
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def from_env(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``from_env(*args)`` with TURBOSPARK_ROUTER_HIST pointing into tmp_path; closes silently at teardown."""
    made: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        if HIST not in os.environ:
            monkeypatch.setenv(HIST, str(tmp_path / "env.json"))
        recorder = RouterHistogram.from_env(*args, **kwargs)
        if recorder is not None:
            made.append(recorder)
        return recorder

    yield factory
    for recorder in made:
        recorder.discard()


def _with_settings(
    from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], num_layers: int = 2
) -> Any:
    """Set each variable of ``settings``, then return ``from_env(num_layers, 3)``."""
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return from_env(num_layers, 3)


# --- when recording is off -------------------------------------------------


def test_unset_hist_gives_none() -> None:
    assert RouterHistogram.from_env(2, 3) is None


def test_empty_hist_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HIST, "")
    assert RouterHistogram.from_env(2, 3) is None


def test_a_dense_model_gives_none(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv(HIST, str(tmp_path / "h.json"))
    # Even an unusable logit request is not looked at (and not warned about) when nothing records.
    monkeypatch.setenv(LAYER, "bogus")
    assert RouterHistogram.from_env(2, 0) is None
    assert RouterHistogram.from_env(2, 0, 8) is None
    assert list(tmp_path.iterdir()) == []


def test_other_switches_alone_do_not_turn_recording_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ((TRACE, "1"), (PILOT, "self"), (LAYER, "0"), (PASS, "0")):
        monkeypatch.setenv(name, value)
    assert RouterHistogram.from_env(2, 3) is None


def test_from_env_still_checks_its_arguments_when_recording_is_off() -> None:
    with pytest.raises(ValueError, match="num_layers must be at least 0, got -1"):
        RouterHistogram.from_env(-1, 3)
    with pytest.raises(ValueError, match="num_experts must be at least 0, got -3"):
        RouterHistogram.from_env(2, -3)
    with pytest.raises(TypeError, match=r"num_layers must be an integer, got float 1\.5"):
        RouterHistogram.from_env(1.5, 3)
    with pytest.raises(TypeError, match="top_k must be an integer, got bool True"):
        RouterHistogram.from_env(2, 3, True)


def test_from_env_rejects_too_many_experts_when_recording(from_env: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match="num_experts must be at most 4294967296, got 4294967297"):
        from_env(1, 2**32 + 1)


# --- the basic recorder ----------------------------------------------------


def test_hist_alone_gives_a_plain_recorder(from_env: Callable[..., Any], tmp_path: pathlib.Path) -> None:
    hist = from_env(2, 3)
    assert isinstance(hist, RouterHistogram)
    assert hist.path == str(tmp_path / "env.json")
    assert (hist.num_layers, hist.num_experts, hist.top_k) == (2, 3, 0)
    assert not hist.trace_enabled
    assert not hist.pilot_enabled()
    assert hist.pilot_offset() == 1
    assert hist.to_json() == EMPTY_2x3 + "}"


def test_top_k_is_passed_through(from_env: Callable[..., Any]) -> None:
    hist = from_env(2, 3, 2)
    assert hist.top_k == 2
    assert hist.to_json() == '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[0,0,0],[0,0,0]]}'
    with pytest.raises(ValueError, match="selection has 1 expert ids but top_k is 2"):
        hist.record(0, [1])


NO_LAYERS = "num_layers is 0: the recorder can record nothing (every layer index is out of range); recording anyway"


def test_zero_layers(from_env: Callable[..., Any]) -> None:
    # Lenient like the reference, but not silent.
    with pytest.warns(RuntimeWarning) as record:
        hist = from_env(0, 3)
    assert [str(w.message) for w in record] == [NO_LAYERS]
    assert hist.to_json() == '{"num_layers":0,"num_experts":0,"top_k":0,"counts":[]}'


def test_the_env_path_is_what_close_writes(
    from_env: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "chosen.json"
    monkeypatch.setenv(HIST, str(target))
    hist = from_env(2, 3)
    hist.record(1, [2, 0])
    # The path is read once, at construction.
    monkeypatch.setenv(HIST, str(tmp_path / "later.json"))
    hist.close()
    assert target.read_text() == '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[0,0,0],[1,0,1]]}'
    assert not (tmp_path / "later.json").exists()
    assert capfd.readouterr().err == f"[router-hist] wrote {target}\n"


def test_a_relative_env_path_is_kept_as_given(
    from_env: Callable[..., Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(HIST, "relative.json")
    hist = from_env(1, 2)
    assert hist.path == "relative.json"
    hist.record(0, [1])
    hist.close()
    assert (tmp_path / "relative.json").read_text() == ONE_PASS
    assert capfd.readouterr().err == "[router-hist] wrote relative.json\n"


# --- switches: presence is what counts ---------------------------------------


@pytest.mark.parametrize("value", ["1", "", "0", "false", "no", "off"])
def test_any_trace_value_turns_the_trace_on(
    value: str, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hist = _with_settings(from_env, monkeypatch, {TRACE: value})
    assert hist.trace_enabled
    hist.record(0, [2, 0])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,0,1],[0,0,0]],"trace":[[2,0],[]]}'
    )


def test_no_trace_variable_no_trace(from_env: Callable[..., Any]) -> None:
    hist = from_env(2, 3)
    hist.record(0, [2, 0])
    assert hist.trace(0) is None
    assert '"trace"' not in hist.to_json()


@pytest.mark.parametrize(
    ("value", "offset"),
    [("self", 0), ("next", 1), ("1", 1), ("", 1), ("0", 1), ("SELF", 1), ("self ", 1), (" self", 1)],
)
def test_any_probe_value_turns_the_probe_on(
    value: str, offset: int, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hist = _with_settings(from_env, monkeypatch, {PILOT: value, TRACE: "1"})
    assert hist.pilot_enabled()
    assert hist.pilot_offset() == offset
    hist.record(0, [2, 0])
    hist.record_prediction(1, [1, 2])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,0,1],[0,0,0]],"trace":[[2,0],[]],"pred":[[],[1,2]]}'
    )


def test_no_probe_variable_no_probe(from_env: Callable[..., Any]) -> None:
    hist = from_env(2, 3)
    assert not hist.pilot_enabled()
    assert hist.pilot_offset() == 1
    hist.record_prediction(1, [1, 2])
    assert hist.to_json() == EMPTY_2x3 + "}"


def test_every_option_at_once(from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    hist = _with_settings(from_env, monkeypatch, {TRACE: "0", PILOT: "self", LAYER: "1", PASS: "0"})
    assert hist.to_json() == (
        EMPTY_2x3 + ',"trace":[[],[]],"pred":[[],[]],"router_logits":{"layer":1,"pass":0,"values":null}}'
    )
    hist.record(0, [2, 0])
    hist.record_prediction(1, [0, 2])
    hist.record_router_logits(1, [0.5, -1.25, 3.0])
    hist.record(1, [0, 1])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,0,1],[1,1,0]],'
        '"trace":[[2,0],[0,1]],"pred":[[],[0,2]],'
        '"router_logits":{"layer":1,"pass":0,"values":[0.5,-1.25,3]}}'
    )


# --- the logit row: values parse like Rust's usize ---------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("5", 5), ("+5", 5), ("007", 7), ("+0", 0), ("00", 0), (str(2**64 - 1), 2**64 - 1)],
)
def test_pass_values_rust_accepts(
    text: str, value: int, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hist = _with_settings(from_env, monkeypatch, {LAYER: "0", PASS: text})
    assert hist.to_json() == EMPTY_2x3 + f',"router_logits":{{"layer":0,"pass":{value},"values":null}}}}'


@pytest.mark.parametrize(("text", "value"), [("1", 1), ("+1", 1), ("001", 1), ("0", 0)])
def test_layer_values_rust_accepts(
    text: str, value: int, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hist = _with_settings(from_env, monkeypatch, {LAYER: text, PASS: "3"})
    assert hist.to_json() == EMPTY_2x3 + f',"router_logits":{{"layer":{value},"pass":3,"values":null}}}}'


REJECTED = [
    " 5",
    "5 ",
    "5\n",
    "\t5",
    "-0",
    "-5",
    "1_0",
    "",
    "+",
    "-",
    "++5",
    "5.0",
    "5e0",
    "0x5",
    "0b1",
    "five",
    "\u0665",  # ARABIC-INDIC DIGIT FIVE: int() takes it, Rust does not
    "\u0661\u0662",
    "\uff15",  # FULLWIDTH DIGIT FIVE
    "\u00b2",  # SUPERSCRIPT TWO
    str(2**64),
    str(2**70),
]


def _assert_ignored(
    record: pytest.WarningsRecorder, hist: Any, expected_fragments: list[str]
) -> None:
    messages = [str(w.message) for w in record.list]
    assert all(w.category is RuntimeWarning for w in record.list)
    for fragment in expected_fragments:
        assert any(fragment in message for message in messages), (fragment, messages)
    assert all("no router-logit row is captured" in message for message in messages)
    # Recording goes on, without the row.
    assert hist is not None
    hist.record(0, [2, 0])
    assert hist.to_json() == '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[1,0,1],[0,0,0]]}'


def _from_env_warning(
    from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], num_layers: int = 2
) -> tuple[pytest.WarningsRecorder, Any]:
    """``_with_settings``, which must warn (RuntimeWarning): returns the warnings and the recorder."""
    with pytest.warns(RuntimeWarning) as record:
        hist = _with_settings(from_env, monkeypatch, settings, num_layers)
    return record, hist


@pytest.mark.parametrize("text", REJECTED)
def test_a_pass_rust_rejects_is_ignored_with_a_warning(
    text: str, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {LAYER: "0", PASS: text})
    assert len(record) == 1
    _assert_ignored(record, hist, [f"{PASS}={text!r}", "not a non-negative integer"])


@pytest.mark.parametrize("text", REJECTED)
def test_a_layer_rust_rejects_is_ignored_with_a_warning(
    text: str, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {LAYER: text, PASS: "0"})
    assert len(record) == 1
    _assert_ignored(record, hist, [f"{LAYER}={text!r}", "not a non-negative integer"])


def test_both_unparsable_warn_about_each(from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {LAYER: "one", PASS: "-1"})
    assert len(record) == 2
    _assert_ignored(record, hist, [f"{LAYER}='one'", f"{PASS}='-1'"])


@pytest.mark.parametrize(("text", "num_layers"), [("2", 2), ("3", 2), ("0", 0), (str(2**64 - 1), 2)])
def test_a_layer_past_the_model_is_ignored_with_a_warning(
    text: str, num_layers: int, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {LAYER: text, PASS: "0"}, num_layers)
    assert len(record) == (1 if num_layers else 2)
    message = str(record[0].message)
    assert f"{LAYER}={text!r}" in message
    assert f"the model has {num_layers} layers" in message
    if num_layers:
        _assert_ignored(record, hist, [])
    else:
        assert str(record[1].message) == NO_LAYERS
        assert hist.to_json() == '{"num_layers":0,"num_experts":0,"top_k":0,"counts":[]}'


def test_the_last_layer_is_in_range(from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    hist = _with_settings(from_env, monkeypatch, {LAYER: "1", PASS: "0"})
    assert hist.to_json() == EMPTY_2x3 + ',"router_logits":{"layer":1,"pass":0,"values":null}}'


@pytest.mark.parametrize(("present", "missing"), [(LAYER, PASS), (PASS, LAYER)])
def test_only_one_coordinate_is_ignored_with_a_warning(
    present: str, missing: str, from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {present: "1"})
    assert len(record) == 1
    _assert_ignored(record, hist, [f"{present}='1'", f"{missing} is not set"])


def test_only_one_coordinate_and_unparsable(from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {PASS: "x"})
    _assert_ignored(record, hist, [f"{PASS}='x'", f"{LAYER} is not set"])


def test_an_empty_coordinate_counts_as_set_but_unparsable(
    from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record, hist = _from_env_warning(from_env, monkeypatch, {LAYER: "", PASS: ""})
    assert len(record) == 2
    _assert_ignored(record, hist, [f"{LAYER}=''", f"{PASS}=''"])


def test_the_warning_points_at_the_caller_of_from_env(
    from_env: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warning must name the user's call site, not a line inside turbospark.
    monkeypatch.setenv(HIST, "unused.json")
    monkeypatch.setenv(LAYER, "x")
    monkeypatch.setenv(PASS, "0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = RouterHistogram.from_env(2, 3)
    hist.discard()
    assert [w.filename for w in caught] == [__file__]


# --- the constructor's own validation ----------------------------------------


def _reject(tmp_path: pathlib.Path, exc: type, fragment: str, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(exc) as info:
        RouterHistogram(*args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    # Nothing was written, and the failed constructor left no finalizer output (autouse guard).
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "exc", "fragment"),
    [
        ("", ValueError, "path must not be empty"),
        (b"", ValueError, "path must not be empty"),
        (None, TypeError, "got NoneType None"),
        (5, TypeError, "got int 5"),
        (["a.json"], TypeError, "got list ['a.json']"),
    ],
)
def test_constructor_rejects_a_bad_path(tmp_path: pathlib.Path, path: Any, exc: type, fragment: str) -> None:
    _reject(tmp_path, exc, fragment, path, 1, 2)


@pytest.mark.parametrize("kind", [str, pathlib.Path, os.fsencode])
def test_constructor_accepts_str_pathlike_and_bytes(tmp_path: pathlib.Path, kind: Any) -> None:
    target = tmp_path / "c.json"
    hist = RouterHistogram(kind(str(target)), 1, 2)
    assert hist.path == str(target)
    assert isinstance(hist.path, str)
    hist.discard()


@pytest.mark.parametrize(
    ("value", "exc", "fragment"),
    [
        (-1, ValueError, "num_layers must be at least 0, got -1"),
        (-(2**70), ValueError, f"got {-(2**70)}"),
        (2.0, TypeError, "num_layers must be an integer, got float 2.0"),
        (True, TypeError, "num_layers must be an integer, got bool True"),
        (np.bool_(True), TypeError, "got bool np.True_"),
        ("2", TypeError, "got str '2'"),
        (None, TypeError, "got NoneType None"),
        (np.float64(2), TypeError, "got float64"),
    ],
)
def test_constructor_rejects_bad_num_layers(tmp_path: pathlib.Path, value: Any, exc: type, fragment: str) -> None:
    _reject(tmp_path, exc, fragment, str(tmp_path / "c.json"), value, 4)


@pytest.mark.parametrize(
    ("value", "exc", "fragment"),
    [
        (0, ValueError, "num_experts must be at least 1, got 0"),
        (-3, ValueError, "got -3"),
        (2**32 + 1, ValueError, "got 4294967297"),
        (2**64, ValueError, f"got {2**64}"),
        (4.0, TypeError, "num_experts must be an integer, got float 4.0"),
        (False, TypeError, "got bool False"),
    ],
)
def test_constructor_rejects_bad_num_experts(tmp_path: pathlib.Path, value: Any, exc: type, fragment: str) -> None:
    _reject(tmp_path, exc, fragment, str(tmp_path / "c.json"), 2, value)


@pytest.mark.parametrize(
    ("value", "exc", "fragment"),
    [
        (-1, ValueError, "top_k must be at least 0, got -1"),
        (2.0, TypeError, "top_k must be an integer, got float 2.0"),
        (True, TypeError, "top_k must be an integer, got bool True"),
    ],
)
def test_constructor_rejects_bad_top_k(tmp_path: pathlib.Path, value: Any, exc: type, fragment: str) -> None:
    _reject(tmp_path, exc, fragment, str(tmp_path / "c.json"), 2, 4, value)


def test_constructor_rejects_an_unrepresentable_top_k_naming_it(tmp_path: pathlib.Path) -> None:
    # Both cores reject it the same way, naming the value, rather than the
    # compiled one failing to convert it to a C size.
    _reject(tmp_path, ValueError, f"top_k must be at most {2**31 - 1}, got {2**63}", str(tmp_path / "c.json"), 2, 4, 2**63)


def test_numpy_integers_are_accepted_as_sizes(tmp_path: pathlib.Path) -> None:
    hist = RouterHistogram(str(tmp_path / "c.json"), np.int64(2), np.uint32(3), np.int8(1))
    assert (hist.num_layers, hist.num_experts, hist.top_k) == (2, 3, 1)
    assert hist.to_json() == '{"num_layers":2,"num_experts":3,"top_k":1,"counts":[[0,0,0],[0,0,0]]}'
    hist.discard()


def test_the_largest_expert_count_is_accepted(from_env: Callable[..., Any]) -> None:
    # 2**32 experts is the most a u32 id can address; with no layers it costs
    # nothing (which only from_env allows, with a warning).
    with pytest.warns(RuntimeWarning, match="num_layers is 0"):
        hist = from_env(0, 2**32)
    assert hist.num_experts == 2**32
    hist.discard()


@pytest.mark.parametrize("pilot", ["Self", "SELF", "", "prev", 1, True, b"self"])
def test_constructor_rejects_a_bad_pilot(tmp_path: pathlib.Path, pilot: Any) -> None:
    _reject(tmp_path, ValueError, f"got {pilot!r}", str(tmp_path / "c.json"), 2, 4, pilot=pilot)


@pytest.mark.parametrize(
    ("request_", "exc", "fragment"),
    [
        ((2, 0), ValueError, "router_logits layer must be at most 1, got 2"),
        ((-1, 0), ValueError, "router_logits layer must be at least 0, got -1"),
        ((0, -1), ValueError, "router_logits pass must be at least 0, got -1"),
        ((0, 2**64), ValueError, f"got {2**64}"),
        ((0.0, 0), TypeError, "router_logits layer must be an integer, got float 0.0"),
        ((0, 1.5), TypeError, "router_logits pass must be an integer, got float 1.5"),
        ((True, 0), TypeError, "router_logits layer must be an integer, got bool True"),
        (5, TypeError, "router_logits must be None or a (layer, pass) pair, got 5"),
        ((0, 1, 2), TypeError, "got (0, 1, 2)"),
        ((0,), TypeError, "got (0,)"),
        ("01", TypeError, "router_logits layer must be an integer, got str '0'"),
    ],
)
def test_constructor_rejects_a_bad_logit_request(
    tmp_path: pathlib.Path, request_: Any, exc: type, fragment: str
) -> None:
    _reject(tmp_path, exc, fragment, str(tmp_path / "c.json"), 2, 4, router_logits=request_)


def test_a_logit_request_needs_a_layer_to_exist(tmp_path: pathlib.Path) -> None:
    _reject(tmp_path, ValueError, "got 0", str(tmp_path / "c.json"), 0, 4, router_logits=(0, 0))


def test_the_largest_pass_is_accepted(make: Callable[..., Any]) -> None:
    hist = make(2, 3, router_logits=[1, 2**64 - 1])  # any pair, a list too
    assert hist.to_json() == EMPTY_2x3 + ',"router_logits":{"layer":1,"pass":18446744073709551615,"values":null}}'
