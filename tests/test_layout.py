"""The package's rooms keep their import boundaries: ``import turbospark`` and the rooms of the
analysis side (capture, metrics, offload, placement, rebalance, outputs) load neither the
recorder nor the optional extras (matplotlib, torch, transformers); the import graph has no
cycle and follows the rooms' rules (docs/architecture.md); no folder holds more than 16
modules; the old import paths are deprecation aliases of the new homes; and the public
import paths resolve."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from childproc import run_python
from conftest import require_module

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "turbospark"

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

# The rooms that read and decide: none may load the recorder (any of turbospark.recording).
ANALYSIS_SIDE = ("capture", "metrics", "offload", "placement", "rebalance", "outputs")


def modules_of(room: str) -> list[str]:
    """Every Python module (dotted) under turbospark/<room>/, packages included."""
    names = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def loaded_after(imports: str) -> str:
    """stdout of a child that runs ``imports`` and prints which HEAVY modules it loaded."""
    code = f"import sys\n{imports}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    done = run_python("-W", "error", "-c", code)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def test_import_turbospark_loads_no_core_and_no_extra() -> None:
    assert loaded_after("import turbospark") == "[]\n"


def test_the_analysis_side_loads_no_recorder_and_no_extra() -> None:
    # Every module of those rooms (a new one is covered as it lands), the metrics API under
    # both its names, and the command line.
    modules = [m for room in ANALYSIS_SIDE for m in modules_of(room)]
    assert "turbospark.offload._cache_kernels" not in modules  # compiled: named below
    imports = (
        "import importlib\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import turbospark.analysis, turbospark.metrics._metrics_kernels, turbospark.offload._cache_kernels\n"
        "import turbospark.cli\n"
        "assert not [m for m in sys.modules if m.startswith('turbospark.recording.')], "
        "[m for m in sys.modules if m.startswith('turbospark.recording.')]\n"
    )
    assert loaded_after(imports) == "[]\n"


def test_the_rooms_do_not_import_the_command_line() -> None:
    # The command line is a thin layer over the rooms, never the other way round.
    modules = [m for room in ANALYSIS_SIDE for m in modules_of(room)]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "from turbospark import RouterHistogram\n"
        "print(sorted(m for m in sys.modules if m.startswith('turbospark.cli')))\n"
    )
    done = run_python("-W", "error", "-c", code)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "[]\n")


# ------------------------------------------------------------------ the import graph


def package_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (.py and compiled .pyi stubs)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.setdefault(".".join(parts[:-1] if parts[-1] == "__init__" else parts), path)
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """Every absolute turbospark name an ``import`` or ``from ... import`` anywhere in ``path`` asks for
    (module level or inside functions), relative imports resolved; ``from m import x`` gives m.x."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.split(".")[0] == "turbospark")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                source = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] == "turbospark":
                names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name resolves to its longest module prefix)."""
    modules = package_modules()

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    return {m: {owner(n) for n in imported_names(p, m)} - {m} for m, p in modules.items() if p.suffix == ".py"}


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    done: set[str] = set()
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, path + [node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


# Which rooms a room may import (besides itself and the package's bottom, turbospark._atomic).
# The data's path: recording writes the capture format, the readers read it, the metrics
# count, the decisions decide, the outputs show; the integrations feed the recorder, the
# command line sits on top. turbospark.analysis, the old name, only re-exports the metrics.
DECISIONS = {"placement", "offload", "rebalance"}
MAY_IMPORT = {
    "_atomic": set(),
    "_moved": set(),
    "capture": set(),
    "recording": {"capture"},
    "metrics": {"capture"},
    **{room: {"capture", "metrics"} | (DECISIONS - {room}) for room in DECISIONS},
    "outputs": {"capture", "metrics"} | DECISIONS,
    "torch": {"capture", "recording"},
    "transformers": {"capture", "recording", "torch"},
    "vllm": {"capture", "recording", "torch"},
    "llama_cpp": {"capture", "recording", "torch"},
    "cli": {"turbospark", "capture", "recording", "metrics", "outputs", "torch", "transformers", "vllm",
            "llama_cpp"} | DECISIONS,
    "__main__": {"cli"},
    "turbospark": {"_moved", "capture", "metrics", "recording"},
    "analysis": {"_moved", "metrics"},
}


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "turbospark"


def test_each_room_imports_only_the_rooms_below_it() -> None:
    graph = import_graph()
    assert {room_of(m) for m in graph} <= set(MAY_IMPORT), {room_of(m) for m in graph} - set(MAY_IMPORT)
    crossings = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if room_of(target) not in MAY_IMPORT[room_of(module)] | {room_of(module), "_atomic"}
    )
    assert crossings == []


def python_files_outside_the_aliases() -> list[Path]:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *(ROOT / "tools").rglob("*.py")]
    return sorted(p for p in files if p.parent.name != "analysis" and p.name != "_moved.py" and p.name != "test_layout.py")


def test_nothing_imports_an_old_path() -> None:
    # With filterwarnings=error an alias would fail the suite anyway; this names the file.
    from turbospark._moved import MOVED

    old = set(MOVED) | {"turbospark.analysis"}
    stale = []
    for path in python_files_outside_the_aliases():
        if PACKAGE in path.parents:
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        else:
            module = "tests_or_tools"
        for name in imported_names(path, module):
            if name in old or any(name.startswith(o + ".") for o in MOVED) or name.rpartition(".")[0] in old:
                stale.append(f"{path.relative_to(ROOT)}: {name}")
    assert stale == []


def test_no_folder_holds_more_than_16_modules() -> None:
    crowded = {}
    for folder in sorted({p.parent for p in PACKAGE.rglob("*.py")}):
        count = len(list(folder.glob("*.py")))
        if count > 16:
            crowded[str(folder.relative_to(ROOT))] = count
    assert crowded == {}


def test_the_tests_tree_mirrors_the_package() -> None:
    # tests/<room>/ for each room; the integrations' tests sit one level down
    # (tests/integrations/torch/, ...) because tests/ is on sys.path, where a
    # tests/torch/ folder would make `import torch` succeed as a namespace package.
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} | {"torch"}
    integrations = {"torch", "transformers", "vllm", "llama_cpp"}
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("__pycache__", "data")}
    assert folders - {"integrations"} <= rooms - integrations, folders
    nested = {p.name for p in (tests / "integrations").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert nested <= integrations, nested
    assert not [p for p in tests.rglob("__init__.py")]
    basenames = [p.name for p in tests.rglob("test_*.py")]
    assert len(basenames) == len(set(basenames))


# ------------------------------------------------------------------ the deprecation aliases


def moved() -> dict[str, str]:
    from turbospark._moved import MOVED

    return MOVED


@pytest.mark.parametrize("old", sorted(moved()))
def test_each_old_path_warns_and_is_its_new_home(old: str, monkeypatch: pytest.MonkeyPatch) -> None:
    new = moved()[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    parent, _, child = old.rpartition(".")
    if child in vars(importlib.import_module(parent)):
        monkeypatch.delattr(importlib.import_module(parent), child)
    try:
        home = importlib.import_module(new)
    except ImportError:  # compiled kernels not built here: the old path fails the same way, after its warning
        with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")), pytest.raises(ImportError):
            importlib.import_module(old)
        return
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")) as caught:
        alias = importlib.import_module(old)
    assert len(caught) == 1
    assert alias is home
    # Every public name (and every private one old code reached for) is the new home's object.
    for name, value in vars(home).items():
        assert getattr(alias, name) is value


def test_the_old_analysis_names_are_the_metrics_without_a_warning() -> None:
    code = (
        "import turbospark.analysis as old, turbospark.metrics as new\n"
        "assert old.__all__ == new.__all__ and all(getattr(old, n) is getattr(new, n) for n in new.__all__)\n"
        "from turbospark.analysis import analyze, coverage, lru_hit_rates\n"
    )
    done = run_python("-W", "error", "-c", code)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_an_old_submodule_reached_as_an_attribute_warns_at_the_caller() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "import turbospark.analysis\n"
        "cache = turbospark.analysis.cache\n"
        "from turbospark.analysis import plot_cache\n"
        "import turbospark.offload.cache, turbospark.outputs.plot_cache\n"
        "assert cache is turbospark.offload.cache and plot_cache is turbospark.outputs.plot_cache\n"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    # Python 3.13 prints the warned line of -c code under each warning, indented; the warnings are the rest.
    assert [line for line in done.stderr.splitlines() if not line.startswith("  ")] == [
        "<string>:4: DeprecationWarning: turbospark.analysis.cache moved to turbospark.offload.cache; "
        "the old path is an alias that goes in turbospark 0.2",
        "<string>:5: DeprecationWarning: turbospark.analysis.plot_cache moved to turbospark.outputs.plot_cache; "
        "the old path is an alias that goes in turbospark 0.2",
    ]


def test_the_public_paths_resolve() -> None:
    require_module("torch")
    require_module("transformers")
    imports = (
        "from turbospark import RouterHistogram, Capture, load, loads, analyze, BACKEND\n"
        "from turbospark.analysis import analyze as a2, coverage, lru_hit_rates\n"
        "from turbospark.metrics import analyze as a3\n"
        "from turbospark.offload.cache import cache_report\n"
        "from turbospark.placement import place\n"
        "from turbospark.cli import main\n"
        "assert a2 is analyze and a3 is analyze and RouterHistogram.__module__ == 'turbospark.recording.recorder'\n"
        "core = {'cython': 'turbospark.recording._recorder', 'python': 'turbospark.recording._recorder_py'}[BACKEND]\n"
        "assert core in sys.modules, core\n"
        "import turbospark.torch, turbospark.transformers\n"
    )
    # Asking for the recorder loads it and its core; the integrations load their extras.
    assert loaded_after(imports).startswith("['torch', 'transformers', 'turbospark.recording._backend', ")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# What each script imports beyond the core's numpy.
BENCHMARK_NEEDS = {"bench_torch.py": ("torch",), "bench_transformers.py": ("torch", "transformers"),
                   "bench_llama_cpp.py": ("llama_cpp",)}


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_every_benchmark_script_imports_what_it_names(script: str) -> None:
    # Moving a module must not leave a benchmark pointing at its old path: run
    # each script's imports (everything but its __main__ block), timing nothing.
    for module in BENCHMARK_NEEDS.get(script, ()):
        require_module(module)
    code = f"import runpy\nrunpy.run_path({str(BENCHMARKS / script)!r}, run_name='imported')\n"
    done = run_python("-c", code)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


# File names the docs cite from other projects' source, not ours.
EXTERNAL_FILES = {"eplb.py", "expert_location.py", "expert_location_dispatch.py", "naive_dp_ep.py",
                  "routed_experts_capturer.py", "experts_base.py", "kt_ep_wrapper.py",
                  "default.py", "eplb_state.py", "base_router.py",  # vLLM 0.33's (docs/rebalance.md)
                  "eplb_manager.py", "expert_distribution.py", "deepseek.py", "model_runner.py",
                  "parallel_hook.py", "topk.py"}  # SGLang 0.5.23's (docs/rebalance.md)


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
