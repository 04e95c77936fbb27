# Type stub for the compiled cache kernel built from csrc/_cache.pyx; the
# pure-Python twin with the same signature is _cache_py.simulate.
from typing import Optional

import numpy as np

def simulate(
    ids: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
    num_experts: int,
    slots: int,
    policy: int,
    pred: Optional[np.ndarray] = None,
) -> tuple[int, int, int, int, int]: ...
