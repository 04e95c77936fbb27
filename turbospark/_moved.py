"""The old import paths of modules that moved (issue 26), kept for one release as deprecation aliases.

``MOVED`` maps each old dotted path to the module's new home. ``install`` (run by
``import turbospark``) puts a finder on ``sys.meta_path`` that answers only for
those names: importing an old path emits a ``DeprecationWarning`` naming the new
home and gives the new module itself, so ``turbospark.analysis.cache`` *is*
``turbospark.offload.cache`` (same functions, same state: patching either
patches both). Nothing in the package imports an old path; the table is
the alias list docs/architecture.md shows, and 0.2 deletes it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["MOVED", "install"]

REMOVED_IN = "0.2"

MOVED: dict[str, str] = {
    # analysis/ held five kinds of module; each kind has its room now.
    "turbospark.analysis.capture": "turbospark.capture.reader",
    "turbospark.analysis.streamed": "turbospark.capture.streamed",
    "turbospark.analysis.capture_sequences": "turbospark.capture.sequences",
    "turbospark.analysis.merge": "turbospark.capture.merge",
    "turbospark.analysis.metrics": "turbospark.metrics.layers",
    "turbospark.analysis._metrics_py": "turbospark.metrics._metrics_py",
    "turbospark.analysis._metrics_kernels": "turbospark.metrics._metrics_kernels",
    "turbospark.analysis.sequences": "turbospark.metrics.sequences",
    "turbospark.analysis.trace_sums": "turbospark.metrics.trace_sums",
    "turbospark.analysis.report": "turbospark.metrics.report",
    "turbospark.analysis.compare": "turbospark.metrics.compare",
    "turbospark.analysis.holdout": "turbospark.metrics.holdout",
    "turbospark.analysis.partial": "turbospark.metrics.partial",
    "turbospark.analysis.distributed": "turbospark.metrics.distributed",
    "turbospark.analysis.cache": "turbospark.offload.cache",
    "turbospark.analysis._cache_py": "turbospark.offload._cache_py",
    "turbospark.analysis._cache_kernels": "turbospark.offload._cache_kernels",
    "turbospark.analysis.parquet": "turbospark.outputs.parquet",
    "turbospark.analysis.replay": "turbospark.outputs.replay",
    "turbospark.analysis.export_json": "turbospark.outputs.export_json",
    "turbospark.analysis.plot": "turbospark.outputs.plot",
    "turbospark.analysis.plot_cache": "turbospark.outputs.plot_cache",
    "turbospark.analysis.plot_placement": "turbospark.outputs.plot_placement",
    # The capture format, which the recorder and the readers share.
    "turbospark.recording._stream_format": "turbospark.capture._stream_format",
    "turbospark.recording._f32display": "turbospark.capture._f32display",
    # The recorder's durability (writes at exit, signals, checkpoints, the sidecar's writer) is a
    # room of its own; the atomic write sits below every room that writes a file.
    "turbospark.recording._atomic": "turbospark._atomic",
    "turbospark.recording._checkpoint": "turbospark.recording.durable._checkpoint",
    "turbospark.recording._lifecycle": "turbospark.recording.durable._lifecycle",
    "turbospark.recording._sigterm": "turbospark.recording.durable._sigterm",
    "turbospark.recording._held": "turbospark.recording.durable._held",
    "turbospark.recording._stream": "turbospark.recording.durable._stream",
    # One module for a layer's GPU loads under a dispatch model.
    "turbospark.placement.evaluate": "turbospark.placement.dispatch",
}


def warning_text(old: str) -> str:
    """The DeprecationWarning's message for the old path ``old``."""
    return f"{old} moved to {MOVED[old]}; the old path is an alias that goes in turbospark {REMOVED_IN}"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in ``MOVED``, and loads each as its new module."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None  # a placeholder module; exec_module swaps the new one in

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        # stacklevel 2: the importing statement (warnings skips the import system's own frames).
        warnings.warn(warning_text(old), DeprecationWarning, stacklevel=2)
        # The import system returns what sys.modules holds after exec_module: the new module.
        sys.modules[old] = importlib.import_module(MOVED[old])


_FINDER = _Alias()


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
