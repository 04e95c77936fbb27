"""The recorder a model capture writes through: a ``RouterHistogram`` that may add ``pilot_distance``.

With ``pilot="next"`` the probe predicts each routed layer from the routed
layer before it. When a dense layer sits in between, that is two or more
layers ahead, not the one layer the reference format assumes, so the capture
says so: ``"pilot_distance":[d_0,...,d_(L-1)]`` is appended as the last key,
``d_l`` being how many layers before ``l`` its prediction was made (0 for a
layer without predictions). When every distance is 1 (or the probe is off,
or in self-test mode) the key is left out and the JSON is byte-identical to
the reference's.

Its reads (``counts``, ``passes``, ``trace()``, ``predictions()``) first hand
the capture's staged rows to the core (the sink's waiting blocks, the device
path's staging buffer), as every write does, so a read inside the ``with``
block shows every row recorded so far.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from turbospark.recording.recorder import RouterHistogram

__all__ = ["ModelRecorder", "distance_key"]


def distance_key(distances: Optional[Sequence[int]]) -> bytes:
    """The ``,"pilot_distance":[...]`` JSON fragment, or b"" when it does not apply."""
    if not distances or all(d in (0, 1) for d in distances):
        return b""
    return (',"pilot_distance":[' + ",".join(str(int(d)) for d in distances) + "]").encode("ascii")


class ModelRecorder(RouterHistogram):
    """``RouterHistogram`` plus the optional ``pilot_distance`` key (set by the capture)."""

    pilot_distances: Optional[tuple[int, ...]] = None

    @property
    def counts(self) -> Any:
        """The counts so far, staged rows included: a read-only (num_layers, num_experts) int64 snapshot."""
        self._drain()
        return super().counts

    @property
    def passes(self) -> np.ndarray:
        """A copy of the routed-pass count of each layer, staged rows included: (num_layers,) int64."""
        self._drain()
        return super().passes

    def trace(self, layer: int) -> Optional[np.ndarray]:
        """A copy of one layer's trace, staged rows included, as (passes, top_k) uint32; None when the trace is off."""
        self._drain()
        return super().trace(layer)

    def predictions(self, layer: int) -> Optional[np.ndarray]:
        """A copy of one layer's predictions, staged rows included, as (predictions, top_k) uint32; None when the probe is off."""
        self._drain()
        return super().predictions(layer)

    def _document(self) -> bytes:
        document: bytes = super()._document()
        extra = distance_key(self.pilot_distances)
        return document[:-1] + extra + b"}" if extra else document
