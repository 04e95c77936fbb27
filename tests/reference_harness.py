"""Helpers that build and run the Rust reference tools (not a test module).

``tools/reference/f32_display.rs`` prints Rust's ``Display`` for f32 bit
patterns; ``tools/reference/harness.rs`` includes the reference
``router_hist.rs`` verbatim and drives it from stdin. Both need ``rustc``
(no cargo, no crates) and the reference file at
``<repo>/../shared/reference/router_hist.rs``; when either is missing,
``build_tools`` returns ``None``; tests use conftest's ``reference_tools`` fixture,
which skips then (and fails under ``CI=true``).

Typical use from a test::

    tools = reference_harness.build_tools(tmp_path_factory.mktemp("rust"))  # None: skip
    reference_harness.rust_display([0x3F800000])          # -> ["1"]
    reference_harness.run_reference(
        {"TURBOSPARK_ROUTER_HIST": str(path)}, 2, 3, 2,
        [("r", 0, [2, 0]), ("l", 0, [1.5, -2.0])])         # -> JSON text
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
TOOLS_SRC = REPO / "tools" / "reference"
REFERENCE = REPO.parent / "shared" / "reference" / "router_hist.rs"

# Every variable the reference reads; run_reference clears them all so only
# the caller's `env` decides what the reference sees.
ENV_VARS = (
    "TURBOSPARK_ROUTER_HIST",
    "TURBOSPARK_ROUTER_TRACE",
    "TURBOSPARK_PILOT_PROBE",
    "TURBOSPARK_ROUTER_LOGITS_LAYER",
    "TURBOSPARK_ROUTER_LOGITS_PASS",
)


class Tools(NamedTuple):
    f32_display: Path
    harness: Path


_tools: Optional[Tools] = None


def find_rustc() -> Optional[str]:
    """``rustc`` on PATH, else ``$CARGO_HOME/bin`` or ``~/.cargo/bin``."""
    found = shutil.which("rustc")
    if found:
        return found
    candidates = []
    if os.environ.get("CARGO_HOME"):
        candidates.append(Path(os.environ["CARGO_HOME"]) / "bin" / "rustc")
    candidates.append(Path.home() / ".cargo" / "bin" / "rustc")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def build_tools(tmpdir) -> Optional[Tools]:
    """Compile both tools into ``tmpdir`` with ``rustc -O``.

    Returns their paths (and remembers them for ``rust_display`` and
    ``run_reference``), or ``None`` when rustc or the reference file is
    missing. A compile error with both present is a real failure and raises.
    """
    global _tools
    rustc = find_rustc()
    if rustc is None or not REFERENCE.is_file():
        return None
    out_dir = Path(tmpdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for name in Tools._fields:
        exe = out_dir / (name + (".exe" if os.name == "nt" else ""))
        proc = subprocess.run(
            [rustc, "-O", "--edition", "2021", str(TOOLS_SRC / f"{name}.rs"), "-o", str(exe)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"rustc failed on {name}.rs:\n{proc.stderr}")
        built[name] = exe
    _tools = Tools(**built)
    return _tools


def _require_tools(tools: Optional[Tools]) -> Tools:
    tools = tools or _tools
    if tools is None:
        raise RuntimeError("call build_tools(tmpdir) first (and skip if it returns None)")
    return tools


def rust_display(bits_list: Iterable[int], tools: Optional[Tools] = None) -> list[str]:
    """Rust's ``format!("{}", f32::from_bits(b))`` for each bit pattern."""
    tools = _require_tools(tools)
    bits_list = [int(b) & 0xFFFFFFFF for b in bits_list]
    if not bits_list:
        return []
    stdin = "".join(f"{b:08X}\n" for b in bits_list)
    proc = subprocess.run(
        [str(tools.f32_display)], input=stdin, capture_output=True, text=True, check=True, timeout=600
    )
    result = []
    for expected_bits, line in zip(bits_list, proc.stdout.splitlines()):
        hex_text, display = line.split("\t", 1)
        if int(hex_text, 16) != expected_bits:
            raise RuntimeError(f"f32_display out of step: {line!r} for {expected_bits:08X}")
        result.append(display)
    if len(result) != len(bits_list):
        raise RuntimeError(f"f32_display returned {len(result)} lines for {len(bits_list)} inputs")
    return result


def f32_bits(value) -> int:
    """Bit pattern of ``value`` rounded to f32 (numpy scalars or Python floats).

    Finite values beyond f32 range become +/-inf, as a float32 cast would.
    """
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a test dependency
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    with np.errstate(over="ignore"):
        return int(np.asarray(value, dtype=np.float32).view(np.uint32))


def _op_line(op: Sequence) -> str:
    kind, layer, items = op
    if kind in ("r", "p"):
        return " ".join([kind, str(int(layer))] + [str(int(i)) for i in items])
    if kind == "l":
        return " ".join(["l", str(int(layer))] + [f"{f32_bits(v):08X}" for v in items])
    raise ValueError(f"unknown op {kind!r} (want 'r', 'p' or 'l')")


def run_reference(
    env: dict,
    num_layers: int,
    num_experts: int,
    top_k: int,
    ops: Iterable[Sequence],
    tools: Optional[Tools] = None,
) -> Optional[str]:
    """Run the reference recorder and return the JSON text its ``Drop`` wrote.

    ``env`` holds the TURBOSPARK_* variables to set (a value of ``None``
    means unset); every other TURBOSPARK_* variable the reference reads is
    removed from the inherited environment. ``ops`` are tuples
    ``('r', layer, [ids])`` (record), ``('p', layer, [ids])``
    (record_prediction) and ``('l', layer, [float32 values])``
    (record_router_logits). Returns ``None`` when ``from_env`` returned
    ``None``. The JSON is read back, as bytes decoded from UTF-8, from the
    path in ``env["TURBOSPARK_ROUTER_HIST"]``.
    """
    tools = _require_tools(tools)
    child_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    for key, value in env.items():
        if value is not None:
            child_env[key] = str(value)
    stdin = f"{int(num_layers)} {int(num_experts)} {int(top_k)}\n"
    stdin += "".join(_op_line(op) + "\n" for op in ops)
    proc = subprocess.run(
        [str(tools.harness)], input=stdin, capture_output=True, text=True, env=child_env, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reference harness failed ({proc.returncode}):\n{proc.stderr}")
    if proc.stdout.strip() == "none":
        return None
    if "FAILED writing" in proc.stderr:
        raise RuntimeError(f"reference could not write its JSON:\n{proc.stderr}")
    path = child_env["TURBOSPARK_ROUTER_HIST"]
    return Path(path).read_bytes().decode("utf-8")
