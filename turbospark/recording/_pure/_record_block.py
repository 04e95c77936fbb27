"""``record_many`` and ``record_prediction_many``: a (rows, top_k) block, optionally masked, committed whole.

Twin of ``csrc/_record_block.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
"""

from __future__ import annotations

from array import array
from typing import Any, Optional, SupportsIndex

import numpy as np

from .. import _convert, _errors
from .._types import RowMask, SelectedBlock
from ._core import _State
from ._record_one import RecordOne


class RecordBlock(RecordOne):
    """Blocks of passes (or predictions): validated into one private copy, then one commit."""

    def _block(self, layer: Any, selected: Any, mask: Any) -> tuple[int, _State, np.ndarray]:
        """Validate a block call: (layer index, state, the selected rows' ids as a private uint32 copy)."""
        index, state = self._begin(layer)
        if not (isinstance(selected, (np.ndarray, list, tuple)) or _convert.is_array_like(selected)):
            raise _errors.selection_type(selected)
        arr = _convert.as_array(selected, _convert.TWO_D)
        _convert.check_length(arr.shape[1], state.top_k or state.pred_k)
        return index, state, _convert.block_ids(arr, self._num_experts, mask)

    def record_many(self, layer: SupportsIndex, selected: SelectedBlock, mask: Optional[RowMask] = None) -> None:
        with self._lock:
            index, _, ids = self._block(layer, selected, mask)
            self._add_block(index, ids, None)
        if self._unspilled >= self._spill_at:
            self._spill()

    def _add_block(self, index: int, ids: np.ndarray, tags: Optional[tuple[np.ndarray, int]]) -> None:
        rows = ids.shape[0]
        if rows == 0:
            return
        added = np.bincount(ids.ravel(), minlength=self._num_experts).tolist()
        self._add_selection(index, array("I", ids.tobytes()), rows, added, tags)
    def record_prediction_many(
        self, layer: SupportsIndex, predicted: SelectedBlock, mask: Optional[RowMask] = None
    ) -> None:
        with self._lock:
            index, _, ids = self._block(layer, predicted, mask)
            if ids.shape[0]:
                self._add_predictions(index, array("I", ids.tobytes()), ids.shape[1])
        if self._unspilled >= self._spill_at:
            self._spill()
