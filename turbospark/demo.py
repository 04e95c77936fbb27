"""``turbospark demo``: a simulated MoE decode loop recorded through the real recorder.

The loop is the one a model integration writes: in every decode pass, each
layer's router picks its top-k and calls ``record``; with the probe on, the
layer also predicts the layer ``pilot_offset()`` ahead and files it with
``record_prediction``. The routing itself comes from ``RouterSimulator``.
"""

from __future__ import annotations

import os
from typing import Any

from .capture import Capture, load
from .simulate import RouterSimulator

__all__ = ["DEFAULTS", "run_demo"]

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
) -> Capture:
    """Simulate ``passes`` decode passes, record them (trace on, probe in
    ``pilot`` mode: "next" or "self") into ``out``, and return the loaded capture.

    The recorder announces the write on stderr. Raises ``ValueError`` for an
    impossible shape (top_k > experts, a size < 1) and ``OSError`` when
    ``out`` cannot be written.
    """
    from . import RouterHistogram  # the recorder is the package's core; load it only when used

    simulator = RouterSimulator(layers, experts, top_k, seed=seed)
    with RouterHistogram(out, layers, experts, top_k, trace=True, pilot=pilot) as recorder:
        offset = recorder.pilot_offset()
        for step in simulator.passes(passes):
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
    return load(out)
