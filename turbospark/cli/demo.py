"""``turbospark demo``: a simulated MoE decode loop recorded through the real recorder.

The loop is the one a model integration writes: in every decode pass, each
layer's router picks its top-k and calls ``record``; with the probe on, the
layer also predicts the layer ``pilot_offset()`` ahead and files it with
``record_prediction``. The routing itself comes from ``RouterSimulator``.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable, Optional

from ..capture.reader import Capture, loads
from .simulate import RouterSimulator, RoutingParams

__all__ = ["DEFAULTS", "NEXT_STEPS", "CaptureNotWritten", "run_demo"]

NEXT_STEPS = (
    "note: the routing above is simulated (turbospark/cli/simulate.py), not recorded from a model.\n"
    "next: record your own model (README: 'Record', docs/recording.md; or run it with\n"
    "      TURBOSPARK_ROUTER_HIST=capture.json), then `turbospark analyze capture.json`\n"
    "      and `turbospark plot capture.json`."
)


class CaptureNotWritten(OSError):
    """The recorder could not write the demo's capture; it has already said why on stderr."""

# Small enough to finish in a couple of seconds on the pure-Python recorder,
# large enough for the windows, reuse and recall to be meaningful. 128
# experts with top-8 is a common shape for today's fine-grained MoE models.
DEFAULTS: dict[str, Any] = {
    "out": "turbospark-demo.json",
    "layers": 16,
    "experts": 128,
    "top_k": 8,
    "passes": 1000,
    "seed": 0,
}


def run_demo(
    out: str | os.PathLike[str] = DEFAULTS["out"],
    *,
    layers: int = DEFAULTS["layers"],
    experts: int = DEFAULTS["experts"],
    top_k: int = DEFAULTS["top_k"],
    passes: int = DEFAULTS["passes"],
    seed: int = DEFAULTS["seed"],
    pilot: str = "next",
    progress: Optional[Callable[[int], None]] = None,
    drift: int = 0,
) -> Capture:
    """Simulate ``passes`` decode passes, record them (trace on, probe in
    ``pilot`` mode: "next" or "self") into ``out``, and return the loaded capture.

    ``progress``, if given, is called with the number of passes done after
    each one. ``drift`` D > 0 reshuffles each layer's popular experts every
    D passes (``RoutingParams.drift``). The recorder announces the write on stderr. Raises
    ``ValueError`` for an impossible shape (top_k > experts, a size < 1), the
    recorder's ``OSError`` when ``out`` cannot be written (before simulating
    anything), and ``CaptureNotWritten`` when the final write failed (the
    recorder has reported it).
    """
    from .. import RouterHistogram  # the recorder is the package's core; load it only when used

    simulator = RouterSimulator(layers, experts, top_k, seed=seed, params=RoutingParams(drift=drift))
    with RouterHistogram(out, layers, experts, top_k, trace=True, pilot=pilot) as recorder:
        offset = recorder.pilot_offset()
        for done, step in enumerate(simulator.passes(passes), 1):
            selected = step.selected.tolist()  # lists: the recorder's cheapest input
            predicted = step.predicted.tolist()
            for layer in range(layers):
                recorder.record(layer, selected[layer])
                target = layer + offset
                # Nothing precedes layer 0, so no prediction is ever filed for it.
                if 0 < target < layers:
                    # "self" reruns this layer's own router: the prediction is its selection.
                    guess = predicted[target] if offset else selected[layer]
                    recorder.record_prediction(target, guess)
            if progress is not None:
                progress(done)
        document = recorder.to_json()
    # Leaving the block wrote the file (close() reports failures, never raises).
    if not _holds(out, document.encode("ascii")):
        raise CaptureNotWritten(f"the capture was not written to {out}")
    return loads(document)


def _holds(path: str | os.PathLike[str], data: bytes) -> bool:
    """Whether ``path`` now holds ``data`` (a device or FIFO cannot be read back: trusted)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return True
        with open(path, "rb") as handle:
            return handle.read() == data
    except OSError:
        return False
