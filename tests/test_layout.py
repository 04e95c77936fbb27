"""The package's wings keep their import boundaries: ``import turbospark`` and the whole
analysis wing load neither the recorder core nor the optional extras (matplotlib,
torch, transformers), and the public import paths resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from childproc import run_python
from conftest import require_module

HEAVY = (
    "dask",
    "distributed",
    "duckdb",
    "matplotlib",
    "pyarrow",
    "torch",
    "transformers",
    "turbospark.recording._backend",
    "turbospark.recording._recorder",
    "turbospark.recording._recorder_py",
    "turbospark.recording.recorder",
)


def loaded_after(imports: str) -> str:
    """stdout of a child that runs ``imports`` and prints which HEAVY modules it loaded."""
    code = f"import sys\n{imports}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    done = run_python("-W", "error", "-c", code)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def test_import_turbospark_loads_no_core_and_no_extra() -> None:
    assert loaded_after("import turbospark") == "[]\n"


def test_the_analysis_wing_loads_no_core_and_no_extra() -> None:
    imports = (
        "import turbospark.analysis\n"
        "from turbospark.analysis import capture, capture_sequences, compare, holdout, merge, metrics\n"
        "from turbospark.analysis import plot, plot_placement, report, sequences\n"
        "from turbospark.analysis import cache, plot_cache, _cache_py, _cache_kernels, replay, parquet\n"
        "from turbospark.analysis import partial, distributed\n"
        "import turbospark.placement, turbospark.placement.document, turbospark.placement.formats\n"
        "import turbospark.cli\n"
    )
    assert loaded_after(imports) == "[]\n"


def test_the_wings_do_not_import_the_command_line() -> None:
    # The command line is a thin layer over the wings, never the other way round.
    code = (
        "import sys\n"
        "from turbospark.analysis import capture, capture_sequences, compare, holdout, merge, metrics\n"
        "from turbospark.analysis import plot, plot_placement, report, sequences, cache, plot_cache\n"
        "import turbospark.placement, turbospark.placement.document, turbospark.placement.formats\n"
        "import turbospark.placement.evaluate, turbospark.placement.samples\n"
        "from turbospark import RouterHistogram\n"
        "print(sorted(m for m in sys.modules if m.startswith('turbospark.cli')))\n"
    )
    done = run_python("-W", "error", "-c", code)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "[]\n")


def test_the_public_paths_resolve() -> None:
    require_module("torch")
    require_module("transformers")
    imports = (
        "from turbospark import RouterHistogram, Capture, load, loads, analyze, BACKEND\n"
        "from turbospark.analysis import analyze as a2, coverage, lru_hit_rates\n"
        "from turbospark.placement import place\n"
        "from turbospark.cli import main\n"
        "assert a2 is analyze and RouterHistogram.__module__ == 'turbospark.recording.recorder'\n"
        "core = {'cython': 'turbospark.recording._recorder', 'python': 'turbospark.recording._recorder_py'}[BACKEND]\n"
        "assert core in sys.modules, core\n"
        "import turbospark.torch, turbospark.transformers\n"
    )
    # Asking for the recorder loads it and its core; the integrations load their extras.
    assert loaded_after(imports).startswith("['torch', 'transformers', 'turbospark.recording._backend', ")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# What each script imports beyond the core's numpy.
BENCHMARK_NEEDS = {"bench_torch.py": ("torch",), "bench_transformers.py": ("torch", "transformers")}


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_every_benchmark_script_imports_what_it_names(script: str) -> None:
    # Moving a module must not leave a benchmark pointing at its old path: run
    # each script's imports (everything but its __main__ block), timing nothing.
    for module in BENCHMARK_NEEDS.get(script, ()):
        require_module(module)
    code = f"import runpy\nrunpy.run_path({str(BENCHMARKS / script)!r}, run_name='imported')\n"
    done = run_python("-c", code)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


ROOT = Path(__file__).resolve().parents[1]
# File names the docs cite from other projects' source, not ours.
EXTERNAL_FILES = {"eplb.py", "expert_location.py", "expert_location_dispatch.py", "naive_dp_ep.py",
                  "default.py", "eplb_state.py", "base_router.py",  # vLLM 0.33's (docs/rebalance.md)
                  "routed_experts_capturer.py"}


def test_the_docs_name_only_files_that_exist() -> None:
    # A module moved or renamed must not leave the README, docs/ or a docstring
    # pointing at its old name (``_cli_place.py`` outlived its move to cli/_place.py).
    ours = {p.name for p in ROOT.rglob("*.py") if ".git" not in p.parts}
    texts = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("turbospark/**/*.py"))]
    cited = re.compile(r"`{1,2}(?:[\w/]*/)?(\w+\.py)`{1,2}|``(_\w+)``")
    stale = []
    for path in texts:
        for match in cited.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1)
            if name is None:  # a double-backticked private name: stale when it looks like a module we renamed
                if not match.group(2).startswith("_cli_"):
                    continue
                name = match.group(2) + ".py"
            if name not in ours and name not in EXTERNAL_FILES:
                stale.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert stale == []
