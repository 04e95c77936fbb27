"""``record_batch``: a block of passes with their sequence ids and phase, committed with them.

Twin of ``csrc/_record_tagged.pxi`` (the pure-Python core is split along the compiled core's seams, module for
.pxi file, so the two read side by side; ``recording/_recorder_py.py`` composes the mixins).
"""

from __future__ import annotations

from typing import Any, Optional, SupportsIndex

from .. import _sequences
from .._types import RowMask, SelectedBlock
from ._record_block import RecordBlock


class RecordTagged(RecordBlock):
    """Tagged blocks: checks in the documented order, then passes and tags commit together."""

    def record_batch(self, layer: SupportsIndex, ids_2d: SelectedBlock, *, seq: Any, phase: str,
                     mask: Optional[RowMask] = None) -> None:
        """Record a block of passes that belong to different sequences, in one phase.

        Takes ``ids_2d`` (n, top_k) integer ids (ndarray, nested list or CPU
        tensor), ``seq`` one non-negative sequence id per row (list, ndarray or
        CPU tensor), ``phase`` ``"prompt"`` or ``"decode"`` for every row, and
        an optional boolean ``mask`` of length n: only the rows it keeps are
        validated and recorded (the others may hold anything, e.g. -1 padding,
        except that a dropped row's ``seq`` entry must still be an integer,
        of any value: a str, float, bool or None there raises TypeError).
        Counts and trace are exactly those of ``record_many`` with the kept
        rows; the capture then also carries each pass's sequence id and phase,
        committed with the passes in one step (no write, signal handler or
        other thread sees a pass without its tag). Raises what ``record_many``
        raises, and TypeError/ValueError for a bad ``seq``, ``phase`` or
        ``mask``; a rejected call records nothing.

        Checks, in order: closed, layer, phase, the block's container and
        shape, mask, seq (one integer per row, non-negative int64 where
        kept), then the ids; each into a private copy. The passes and
        their tags commit together.
        """
        with self._lock:
            index, _ = self._begin(layer)
            code = _sequences.phase_code(phase)
            block = _sequences.block_copy(ids_2d)
            keep = _sequences.mask_copy(mask, block.shape[0])
            seq_ids = _sequences.seq_copy(seq, block.shape[0], keep)
            index, _, ids = self._block(index, block, keep)
            self._add_block(index, ids, (seq_ids, code))
        if self._unspilled >= self._spill_at:
            self._spill()
