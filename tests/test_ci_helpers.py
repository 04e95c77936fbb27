"""conftest's ``skip_or_fail`` / ``require_module``: a skip locally, a failure under ``CI=true``."""

from __future__ import annotations

import pathlib

import pytest

import reference_harness
from conftest import reference_tools_or_skip, require_module, skip_or_fail

MISSING = "turbospark_no_such_module"


@pytest.fixture
def ci(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("TURBOSPARK_CI_OPTIONAL", raising=False)
    return monkeypatch


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("CI", raising=False)
    return monkeypatch


def test_skip_or_fail_skips_outside_ci(local: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        skip_or_fail("rustc is missing")
    assert info.value.msg == "rustc is missing"


def test_skip_or_fail_fails_under_ci(ci: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.fail.Exception) as info:
        skip_or_fail("rustc is missing")
    assert info.value.msg == "rustc is missing (CI=true: a missing dependency fails the run instead of skipping it)"


def test_require_module_returns_the_module_or_names_the_missing_one(local: pytest.MonkeyPatch) -> None:
    assert require_module("json").dumps([1]) == "[1]"
    with pytest.raises(pytest.skip.Exception) as info:
        require_module(MISSING)
    assert info.value.msg == f"could not import {MISSING!r}: No module named {MISSING!r}"


def test_require_module_fails_under_ci_unless_declared_optional(ci: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.fail.Exception):
        require_module(MISSING)
    ci.setenv("TURBOSPARK_CI_OPTIONAL", f"torch, {MISSING}")
    with pytest.raises(pytest.skip.Exception):
        require_module(MISSING + ".sub")


def test_a_missing_reference_fails_under_ci(ci: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    ci.setattr(reference_harness, "REFERENCE", tmp_path / "absent" / "router_hist.rs")
    with pytest.raises(pytest.fail.Exception) as info:
        reference_tools_or_skip(tmp_path / "build")
    assert f"the reference {tmp_path / 'absent' / 'router_hist.rs'} is missing" in info.value.msg
    # Optional names never cover the reference: only a real build counts there.
    ci.setenv("TURBOSPARK_CI_OPTIONAL", "rustc,reference")
    with pytest.raises(pytest.fail.Exception):
        reference_tools_or_skip(tmp_path / "build")


def test_a_missing_rustc_skips_locally(local: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    local.setattr(reference_harness, "find_rustc", lambda: None)
    with pytest.raises(pytest.skip.Exception):
        reference_tools_or_skip(tmp_path / "build")
