"""The recorder a model capture writes through: a ``RouterHistogram`` that may add ``pilot_distance``.

With ``pilot="next"`` the probe predicts each routed layer from the routed
layer before it. When a dense layer sits in between, that is two or more
layers ahead, not the one layer the reference format assumes, so the capture
says so: ``"pilot_distance":[d_0,...,d_(L-1)]`` is appended as the last key,
``d_l`` being how many layers before ``l`` its prediction was made (0 for a
layer without predictions). When every distance is 1 (or the probe is off,
or in self-test mode) the key is left out and the JSON is byte-identical to
the reference's.
"""

from __future__ import annotations

from typing import Optional, Sequence

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

    def _document(self) -> bytes:
        document: bytes = super()._document()
        extra = distance_key(self.pilot_distances)
        return document[:-1] + extra + b"}" if extra else document
