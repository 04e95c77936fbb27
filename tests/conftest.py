"""Shared fixtures: recorders in a temporary directory, both cores, a stderr guard.

The suite runs once per backend (``TURBOSPARK_PUREPYTHON=1`` selects the
pure-Python one); ``RouterHistogram`` is whichever the package chose. Tests
that compare the two cores in one process use ``cores``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterator

import pytest

import turbospark
from turbospark import _recorder_py
from turbospark.recorder import recorder_class

EXPECTED_BACKEND = "python" if os.environ.get("TURBOSPARK_PUREPYTHON") else "cython"


def compiled_core() -> Any:
    """The compiled core class, or None when the extension is not built."""
    try:
        from turbospark import _recorder
    except ImportError:
        return None
    return _recorder.RecorderCore


def require(module: str) -> Any:
    """Import an optional module, or skip the test without it; under ``CI=true`` a missing module fails instead."""
    if os.environ.get("CI") == "true":
        try:
            return __import__(module)
        except ImportError as exc:
            pytest.fail(f"{module} is required under CI=true: {exc}")
    return pytest.importorskip(module)


@pytest.fixture(autouse=True)
def _no_swallowed_exceptions(capfd: pytest.CaptureFixture[str]) -> Any:
    """Fail a test whose stderr shows an exception swallowed in extension code or a finalizer."""
    yield
    err = capfd.readouterr().err
    if "Exception ignored" in err:
        pytest.fail(f"stderr shows a swallowed exception:\n{err}")


@pytest.fixture
def make(tmp_path: Any) -> Callable[..., Any]:
    """``make(num_layers, num_experts, top_k=0, **options)``: a recorder writing under tmp_path.

    Every recorder it made is closed at teardown with its output read, so no
    test leaves a write for the garbage collector or interpreter exit.
    """
    made = []

    def factory(*args: Any, cls: Any = None, name: str = "capture.json", **kwargs: Any) -> Any:
        recorder = (cls or turbospark.RouterHistogram)(str(tmp_path / name), *args, **kwargs)
        made.append(recorder)
        return recorder

    yield factory
    for recorder in made:
        recorder.discard()


@pytest.fixture
def cores() -> tuple[Any, Any]:
    """(compiled RouterHistogram class, pure-Python RouterHistogram class); skips without the extension."""
    core = compiled_core()
    if core is None:
        pytest.skip("the compiled core is not built")
    return recorder_class(core), recorder_class(_recorder_py.RecorderCore)


@pytest.fixture
def interleave() -> Iterator[None]:
    """Switch threads as often as CPython allows, for the length of the test."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


@pytest.fixture(params=["compiled", "python", "default"])
def cls(request: pytest.FixtureRequest, cores: tuple[Any, Any]) -> Any:
    """Each RouterHistogram class in turn: on the compiled core, on the pure-Python core, the package's choice."""
    return {"compiled": cores[0], "python": cores[1], "default": turbospark.RouterHistogram}[request.param]
