"""Configurations that can only produce a useless capture: rejected by the constructor, warned about by from_env.

``from_env`` stays lenient, as the reference is (an environment setting must
never stop a runtime), but it says what is wrong.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any, Callable

import pytest

import turbospark
import turbospark.recording.recorder
from turbospark import RouterHistogram

HIST, TRACE, PILOT = "TURBOSPARK_ROUTER_HIST", "TURBOSPARK_ROUTER_TRACE", "TURBOSPARK_PILOT_PROBE"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (HIST, TRACE, PILOT, "TURBOSPARK_ROUTER_LOGITS_LAYER", "TURBOSPARK_ROUTER_LOGITS_PASS"):
        monkeypatch.delenv(name, raising=False)


def caught(make: Callable[[], Any]) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        made = make()
    return made, record


@pytest.mark.parametrize("pilot", ["next", "self"])
def test_the_constructor_warns_about_a_pilot_without_a_trace(tmp_path: pathlib.Path, pilot: str) -> None:
    hist, record = caught(lambda: RouterHistogram(str(tmp_path / "c.json"), 2, 3, 2, pilot=pilot))
    assert [(w.category, str(w.message), w.filename) for w in record] == [
        (
            RuntimeWarning,
            f"pilot={pilot!r} with trace=False: the predictions can never be scored "
            "(pilot recall compares them with the trace); pass trace=True",
            __file__,
        )
    ]
    # Still a working recorder: a warning, not a refusal.
    hist.record_prediction(1, [2, 1])
    assert hist.to_json() == '{"num_layers":2,"num_experts":3,"top_k":2,"counts":[[0,0,0],[0,0,0]],"pred":[[],[2,1]]}'
    hist.discard()


def test_from_env_warns_about_a_pilot_without_a_trace(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HIST, str(tmp_path / "c.json"))
    monkeypatch.setenv(PILOT, "1")
    hist, record = caught(lambda: RouterHistogram.from_env(2, 3))
    assert [(w.category, str(w.message)) for w in record] == [
        (
            RuntimeWarning,
            f"{PILOT} is set but {TRACE} is not: the predictions can never be scored "
            f"(pilot recall compares them with the trace); set {TRACE}=1",
        )
    ]
    assert hist.pilot_enabled()
    hist.discard()


def test_useful_configurations_are_quiet(make: Callable[..., Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for options in ({}, {"trace": True}, {"trace": True, "pilot": "next"}, {"trace": True, "pilot": "self"}):
        assert caught(lambda: make(2, 3, 3, **options))[1] == []
    monkeypatch.setenv(HIST, str(tmp_path / "env.json"))
    monkeypatch.setenv(PILOT, "self")
    monkeypatch.setenv(TRACE, "")
    hist, record = caught(lambda: RouterHistogram.from_env(1, 3, 3))
    assert record == []
    hist.discard()


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((2, 4, 5), "top_k=5 exceeds num_experts=4: a router cannot pick more experts than it has"),
        ((0, 4, 2), "num_layers must be at least 1, got 0: a recorder with no layers can record nothing"),
    ],
)
def test_the_constructor_rejects_a_capture_that_cannot_be_useful(
    tmp_path: pathlib.Path, sizes: tuple[int, int, int], message: str
) -> None:
    live = turbospark.recording.durable._lifecycle.pending_count()
    with pytest.raises(ValueError) as info:
        RouterHistogram(str(tmp_path / "c.json"), *sizes, trace=True)
    assert str(info.value) == message
    assert turbospark.recording.durable._lifecycle.pending_count() == live
    assert list(tmp_path.iterdir()) == []


def test_from_env_warns_about_top_k_above_num_experts_and_records_like_the_reference(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HIST, str(tmp_path / "c.json"))
    hist, record = caught(lambda: RouterHistogram.from_env(1, 2, 3))
    assert [(w.category, str(w.message), w.filename) for w in record] == [
        (
            RuntimeWarning,
            "top_k=3 exceeds num_experts=2: a router cannot pick more experts than it has; "
            "recording anyway, as the reference does",
            __file__,
        )
    ]
    hist.record(0, [1, 1, 0])  # the reference counts whatever it is given
    assert hist.to_json() == '{"num_layers":1,"num_experts":2,"top_k":3,"counts":[[1,2]]}'
    hist.discard()


def test_a_warning_from_code_without_a_file_points_at_that_code(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "<string>" (exec, python -c) is the user's code even when the working
    # directory is inside the package, where os.path.abspath would have made
    # it look like one of turbospark's own files.
    monkeypatch.setenv(HIST, str(tmp_path / "c.json"))
    monkeypatch.chdir(os.path.dirname(turbospark.__file__))
    code = compile("made.append(RouterHistogram.from_env(1, 2, 3))", "<string>", "exec")
    made: list[Any] = []
    _, record = caught(lambda: exec(code, {"RouterHistogram": RouterHistogram, "made": made}))
    assert [(w.filename, w.lineno) for w in record] == [("<string>", 1)]
    made[0].discard()


def test_top_k_equal_to_num_experts_is_fine(make: Callable[..., Any]) -> None:
    hist, record = caught(lambda: make(1, 3, 3, trace=True))
    assert record == []
    hist.record(0, [2, 0, 1])
    assert hist.to_json() == '{"num_layers":1,"num_experts":3,"top_k":3,"counts":[[1,1,1]],"trace":[[2,0,1]]}'
