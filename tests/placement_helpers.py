"""Shared by the placement tests (not a test module): the published EPLB re-implementation and capture files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark_module(name: str) -> Any:
    """Import ``benchmarks/NAME.py`` (not a package) by path."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_capture(path: Path, doc: dict[str, Any]) -> str:
    """Write ``doc`` as compact JSON at ``path``; returns the path as str."""
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return str(path)


def traced(num_experts: int, top_k: int, rows: list[list[list[int]]], **extra: Any) -> dict[str, Any]:
    """A capture document from per-layer lists of passes (each a top-k list), counts derived."""
    counts = [[0] * num_experts for _ in rows]
    for layer, passes in enumerate(rows):
        for ids in passes:
            for e in ids:
                counts[layer][e] += 1
    doc = {"num_layers": len(rows), "num_experts": num_experts, "top_k": top_k, "counts": counts,
           "trace": [[e for ids in passes for e in ids] for passes in rows]}
    doc.update(extra)
    return doc
