"""Running from a source checkout without the compiled core: the warning says why and how to fix it,
and loading or analysing a capture never imports the recorder core at all."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import turbospark
from childproc import run_isolated

CAPTURE = '{"num_layers":1,"num_experts":3,"top_k":2,"counts":[[1,0,1]],"trace":[[2,0]]}'


def checkout(root: pathlib.Path, *, with_sources: bool) -> pathlib.Path:
    """A copy of the package's Python files (no compiled core), like a fresh clone when with_sources."""
    package = pathlib.Path(turbospark.__file__).parent
    shutil.copytree(package, root / "turbospark", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    if with_sources:
        (root / "csrc").mkdir()
        (root / "csrc" / "_recorder.pyx").write_text("# the compiled core's source\n")
    (root / "capture.json").write_text(CAPTURE)
    return root


# An editable install's import hook would find the worktree's compiled core
# for the copy's missing submodule: drop it, as a plain install has none.
PRELUDE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"


def run(root: pathlib.Path, code: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in the checkout; -c puts the working directory first on sys.path."""
    # Not child_env: this child must find no turbospark but the checkout's, and choose its backend itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURBOSPARK_") and k != "PYTHONPATH"}
    return run_isolated([sys.executable, *options, "-c", PRELUDE + code], str(root), env, 120)


def test_analyze_from_a_checkout_neither_imports_the_core_nor_warns(tmp_path: pathlib.Path) -> None:
    root = checkout(tmp_path, with_sources=True)
    done = run(root, "import runpy; sys.argv[1:] = ['analyze', 'capture.json', '--json']; "
                     "runpy.run_module('turbospark', run_name='__main__')")
    assert (done.returncode, done.stderr) == (0, "")
    assert '"trace_matches_counts": true' in done.stdout
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import turbospark\n"
        "from turbospark.metrics import analyze\n"
        "from turbospark.metrics.report import format_report\n"
        "import turbospark.cli, turbospark.outputs.plot\n"
        "cap = turbospark.load('capture.json')\n"
        "format_report(cap, turbospark.analyze(cap))\n"
        "print(sorted(m for m in sys.modules if m in ('turbospark.recording._backend', 'turbospark.recording._recorder', "
        "'turbospark.recording._recorder_py', 'turbospark.recording.recorder')))\n"
    )
    done = run(root, code)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


def test_the_fallback_warning_names_the_checkout_and_the_fix(tmp_path: pathlib.Path) -> None:
    root = checkout(tmp_path, with_sources=True)
    done = run(root, "import turbospark; print(turbospark.RouterHistogram.__name__, turbospark.BACKEND)")
    assert (done.returncode, done.stdout) == (0, "RouterHistogram python\n")
    assert done.stderr.count("RuntimeWarning") == 1
    message = done.stderr.split("RuntimeWarning: ", 1)[1].splitlines()[0]
    assert message == (
        f"turbospark is imported from its source checkout ({root / 'turbospark'}), which has no compiled core "
        "(No module named 'turbospark.recording._recorder'), so the pure-Python core records 50-110x slower. "
        f"Fix: build it in place with `pip install -e .` in {root}, or run from outside the checkout to use "
        "the installed package. TURBOSPARK_PUREPYTHON=1 selects the pure-Python core without this warning."
    )


def test_an_install_without_the_core_says_to_reinstall(tmp_path: pathlib.Path) -> None:
    root = checkout(tmp_path, with_sources=False)
    done = run(root, "import turbospark; turbospark.BACKEND", "-W", "error::RuntimeWarning")
    assert done.returncode == 1
    assert (
        "RuntimeWarning: turbospark's compiled core could not be imported (No module named "
        "'turbospark.recording._recorder'), so the pure-Python core records 50-110x slower. Fix: reinstall"
    ) in done.stderr


def test_unknown_attributes_still_raise() -> None:
    with pytest.raises(AttributeError, match="module 'turbospark' has no attribute 'nope'"):
        turbospark.nope  # noqa: B018
