"""The append-only id buffers (``array("I")`` per layer) and their copies out as numpy arrays.

Twin of ``csrc/_buffers.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
"""

from __future__ import annotations

from array import array

import numpy as np


def append(flat: array[int], committed: int, ids: array[int]) -> None:
    """Put ``ids`` after the ``committed`` ids of ``flat``, dropping an uncommitted tail first."""
    del flat[committed:]
    flat.extend(ids)



def rows_array(flat: array[int], width: int) -> np.ndarray:
    data = np.frombuffer(flat, dtype=np.uint32).copy() if len(flat) else np.zeros(0, dtype=np.uint32)
    return data.reshape(-1, width) if width else data.reshape(0, 0)

