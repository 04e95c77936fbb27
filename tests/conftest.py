"""Shared fixtures: recorders in a temporary directory, both cores, a stderr guard.

The suite runs once per backend (``TURBOSPARK_PUREPYTHON=1`` selects the
pure-Python one); ``RouterHistogram`` is whichever the package chose. Tests
that compare the two cores in one process use ``cores`` (or ``cls``, built on
it): they are marked ``both_backends`` and run on the default pass only, since
the ``TURBOSPARK_PUREPYTHON`` pass would repeat them exactly.

Optional dependencies: a test that needs something the machine may lack
(torch, transformers, matplotlib, rustc, the Rust reference) calls
``require_module(name)`` or ``skip_or_fail(reason)``. Both skip normally and
FAIL under ``CI=true``, where a skip would silently drop the check the run
claims to make. A CI run that deliberately goes without a module lists it in
``TURBOSPARK_CI_OPTIONAL`` (comma-separated, e.g. ``torch,transformers``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import shutil
import signal
import sys
import tempfile
from types import ModuleType
from typing import Any, Callable, Iterator, NoReturn, Optional

import pytest

import reference_harness
from readme_blocks import turbospark_shell

import turbospark
from turbospark.recording import _recorder_py
from turbospark.recording.recorder import recorder_class

EXPECTED_BACKEND = "python" if os.environ.get("TURBOSPARK_PUREPYTHON") else "cython"

if os.environ.get("PYTEST_XDIST_WORKER") and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # pytest-xdist's workers start with SIGINT ignored, and a child process inherits that (Python
    # installs no KeyboardInterrupt handler where SIGINT is ignored): the tests that Ctrl-C a child
    # need the disposition a plain `pytest` process has.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def in_ci() -> bool:
    """True when ``CI`` is ``true`` (or ``1``), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def skip_or_fail(reason: str, *, optional_as: Optional[str] = None) -> NoReturn:
    """Skip the calling test with ``reason``; under ``CI=true`` fail it instead.

    ``optional_as`` names the dependency (e.g. ``"torch"``): when it is listed
    in ``TURBOSPARK_CI_OPTIONAL``, CI skips too. Never returns: raises
    pytest's skip or fail exception.
    """
    allowed = {name.strip() for name in os.environ.get("TURBOSPARK_CI_OPTIONAL", "").split(",")}
    if in_ci() and (optional_as is None or optional_as not in allowed):
        pytest.fail(f"{reason} (CI=true: a missing dependency fails the run instead of skipping it)", pytrace=False)
    # allow_module_level: a test module may require its dependency at import.
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str) -> ModuleType:
    """Import and return module ``name``; when it cannot be imported, ``skip_or_fail`` naming it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip_or_fail(f"could not import {name!r}: {exc}", optional_as=name.partition(".")[0])


def reference_tools_or_skip(directory: Any) -> reference_harness.Tools:
    """The Rust reference tools built into ``directory``; ``skip_or_fail`` without rustc or the reference."""
    tools = reference_harness.build_tools(directory)
    if tools is None:
        skip_or_fail(
            f"rustc (PATH, $CARGO_HOME/bin or ~/.cargo/bin) or the reference {reference_harness.REFERENCE} is missing"
        )
    return tools


@pytest.fixture(scope="session")
def reference_tools(tmp_path_factory: pytest.TempPathFactory) -> reference_harness.Tools:
    """The Rust reference tools, compiled once per session (see ``reference_harness``)."""
    return reference_tools_or_skip(tmp_path_factory.mktemp("rust"))


def compiled_core() -> Any:
    """The compiled core class, or None when the extension is not built."""
    try:
        from turbospark.recording import _recorder
    except ImportError:
        return None
    return _recorder.RecorderCore


@pytest.fixture(autouse=True)
def _no_swallowed_exceptions(capfd: pytest.CaptureFixture[str]) -> Any:
    """Fail a test whose stderr shows an exception swallowed in extension code or a finalizer."""
    yield
    err = capfd.readouterr().err
    if "Exception ignored" in err:
        pytest.fail(f"stderr shows a swallowed exception:\n{err}")


@pytest.fixture
def shell(tmp_path: pathlib.Path) -> dict[str, str]:
    """An environment whose ``turbospark`` command is this checkout's, for the docs' shell examples."""
    return turbospark_shell(tmp_path)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use both cores in one process; skip them on the pure-Python pass."""
    repeat = bool(os.environ.get("TURBOSPARK_PUREPYTHON"))
    for item in items:
        if "cores" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.both_backends)
        if repeat and item.get_closest_marker("both_backends"):
            item.add_marker(pytest.mark.skip(reason="both_backends: the default pass ran it on both cores"))


@pytest.fixture
def cores() -> tuple[Any, Any]:
    """(compiled RouterHistogram class, pure-Python RouterHistogram class); skips without the extension."""
    core = compiled_core()
    if core is None:
        pytest.skip("the compiled core is not built")
    return recorder_class(core), recorder_class(_recorder_py.RecorderCore)


def core_of(cls: type) -> type:
    """The core class a RouterHistogram class is built on (after the facade's mixins in its MRO)."""
    return next(base for base in cls.__mro__ if base.__name__ == "RecorderCore")


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """Root passes every permission check: act as nobody for the block (nothing to do for other users)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def read_only_dir() -> Iterator[pathlib.Path]:
    """A directory nobody may create files in, reachable by everyone (pytest's tmp_path is root-only)."""
    parent = pathlib.Path(tempfile.mkdtemp(prefix="turbospark-ro-"))
    parent.chmod(0o755)
    directory = parent / "ro"
    directory.mkdir(mode=0o555)
    directory.chmod(0o555)
    yield directory
    directory.chmod(0o755)
    shutil.rmtree(parent)


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
