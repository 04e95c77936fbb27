"""vLLM 0.33.0's own EPLB policy, imported from its wheel on CPU (not a test module).

``load(wheel, directory)`` extracts ``vllm/distributed/eplb/policy/abstract.py``
and ``default.py`` from the wheel into ``directory`` and imports them as the
package ``_vllm033_eplb_policy`` (the package's ``__init__`` is not run: it
only checks the policy names against ``vllm.config``). ``default.py`` imports
numpy, torch and ``.abstract``, nothing else of vLLM, so no stub is needed.
"""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path
from types import ModuleType

POLICY = "vllm/distributed/eplb/policy/"
PACKAGE = "_vllm033_eplb_policy"


def load(wheel: str, directory: Path) -> ModuleType:
    """The wheel's ``default`` module (its ``DefaultEplbPolicy``), imported from ``directory``."""
    target = directory / PACKAGE
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in ("abstract.py", "default.py"):
            (target / name).write_bytes(archive.read(POLICY + name))
    package = ModuleType(PACKAGE)
    package.__path__ = [str(target)]  # a package without running vLLM's __init__
    sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.default")


def close() -> None:
    """Drop the imported modules from ``sys.modules``."""
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]
