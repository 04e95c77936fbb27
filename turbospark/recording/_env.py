"""Reads the reference's environment variables, with the reference's semantics.

Presence is what counts for the switches (``TURBOSPARK_ROUTER_TRACE=0``
turns the trace ON, exactly as Rust's ``var_os(..).is_some()`` does), and
the logit-row coordinates parse as Rust parses a ``usize``. Where the
reference silently ignores a setting we ignore it too, but say so with a
``RuntimeWarning``: a capture that quietly lacks the row someone asked for
costs a whole rerun.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from ._warn import warn_caller

HIST = "TURBOSPARK_ROUTER_HIST"
TRACE = "TURBOSPARK_ROUTER_TRACE"
PILOT = "TURBOSPARK_PILOT_PROBE"
LOGITS_LAYER = "TURBOSPARK_ROUTER_LOGITS_LAYER"
LOGITS_PASS = "TURBOSPARK_ROUTER_LOGITS_PASS"
TRACE_CAP = "TURBOSPARK_ROUTER_TRACE_CAP"
CHECKPOINT = "TURBOSPARK_ROUTER_HIST_CHECKPOINT"

_USIZE = re.compile(r"\+?[0-9]+\Z", re.ASCII)
_USIZE_MAX = 2**64 - 1


@dataclass(frozen=True)
class EnvConfig:
    """What the environment asks a recorder for."""

    path: str
    # True, False, or "stream" (TURBOSPARK_ROUTER_TRACE=stream: the trace streamed to a sidecar).
    trace: Union[bool, str]
    pilot: Optional[str]
    router_logits: Optional[tuple[int, int]]
    # Passes per layer the trace keeps (TURBOSPARK_ROUTER_TRACE_CAP); None: unbounded.
    trace_cap: Optional[int] = None
    # Seconds between checkpoints (TURBOSPARK_ROUTER_HIST_CHECKPOINT); None: written at the end only.
    checkpoint: Optional[float] = None


def parse_usize(text: str) -> Optional[int]:
    """``text`` parsed as Rust's ``str::parse::<usize>`` would (64-bit), or None."""
    if not _USIZE.match(text):
        return None
    value = int(text)
    return value if value <= _USIZE_MAX else None


def parse_seconds(raw: str) -> float:
    """``raw`` as a float, NaN when it is not a number (so the caller's range check refuses it)."""
    try:
        return float(raw)
    except ValueError:
        return float("nan")


def _warn(message: str) -> None:
    warn_caller(message)


def _router_logits(environ: Mapping[str, str], num_layers: int) -> Optional[tuple[int, int]]:
    raw_layer = environ.get(LOGITS_LAYER)
    raw_pass = environ.get(LOGITS_PASS)
    if raw_layer is None and raw_pass is None:
        return None
    layer = None if raw_layer is None else parse_usize(raw_layer)
    pass_ = None if raw_pass is None else parse_usize(raw_pass)
    for name, raw, value in ((LOGITS_LAYER, raw_layer, layer), (LOGITS_PASS, raw_pass, pass_)):
        if raw is not None and value is None:
            _warn(f"ignoring {name}={raw!r}: not a non-negative integer; no router-logit row is captured")
    if layer is None or pass_ is None:
        if (raw_layer is None) != (raw_pass is None):
            present, missing = (LOGITS_LAYER, LOGITS_PASS) if raw_pass is None else (LOGITS_PASS, LOGITS_LAYER)
            _warn(f"ignoring {present}={environ[present]!r}: {missing} is not set; no router-logit row is captured")
        return None
    if layer >= num_layers:
        _warn(
            f"ignoring {LOGITS_LAYER}={raw_layer!r}: the model has {num_layers} layers; "
            "no router-logit row is captured"
        )
        return None
    return (layer, pass_)


def _trace_cap(environ: Mapping[str, str]) -> Optional[int]:
    """``TURBOSPARK_ROUTER_TRACE_CAP`` as a positive integer; None (unbounded) when unset, warned when unusable."""
    raw = environ.get(TRACE_CAP)
    if raw is None:
        return None
    value = parse_usize(raw)
    if value is None or not 1 <= value <= 2**63 - 1:
        _warn(f"ignoring {TRACE_CAP}={raw!r}: not a positive integer (passes per layer); the trace is not capped")
        return None
    return value


def _checkpoint(environ: Mapping[str, str]) -> Optional[float]:
    """``TURBOSPARK_ROUTER_HIST_CHECKPOINT`` as positive seconds; None when unset, warned when unusable."""
    raw = environ.get(CHECKPOINT)
    if raw is None:
        return None
    value = parse_seconds(raw)
    if not (0 < value < float("inf")):
        _warn(f"ignoring {CHECKPOINT}={raw!r}: not a positive number of seconds; the capture is written at the "
              "end only")
        return None
    return value


def config_from_env(num_layers: int, environ: Optional[Mapping[str, str]] = None) -> Optional[EnvConfig]:
    """The recorder configuration the environment asks for, or None when recording is off."""
    env = os.environ if environ is None else environ
    path = env.get(HIST)
    if not path:
        return None
    probe = env.get(PILOT)
    return EnvConfig(
        path=path,
        trace="stream" if env.get(TRACE) == "stream" else TRACE in env,
        pilot=None if probe is None else ("self" if probe == "self" else "next"),
        router_logits=_router_logits(env, num_layers),
        trace_cap=_trace_cap(env),
        checkpoint=_checkpoint(env),
    )
