# record_batch: a block of passes with their sequence ids and phase, read in
# one pass where the inputs allow (an ndarray or list block, an int64 ndarray
# or list of seq ids, a bool mask), else through the pure-Python core's
# validation (recording/_sequences.py), into private copies; then one commit
# of counts, trace and tags (_record_block with TagArgs).
#
# Included by _recorder.pyx.

cdef int _record_tagged(RecorderCore self, object layer, object ids, object seq, object phase,
                        object mask) except -1:
    """``record_batch``: checks in the pure-Python core's order (closed, layer, phase, the block's
    container and shape, mask, seq, then the ids), then passes and tags commit together."""
    cdef int code
    cdef Py_ssize_t index, rows, count = -1
    cdef TagArgs args
    cdef uint8_t keep_local[STACK_IDS]
    cdef int64_t seq_local[STACK_IDS]
    cdef uint8_t* keep = NULL
    cdef int64_t* tags = seq_local
    cdef cnp.ndarray kept
    if self._closed:
        raise _errors.closed()
    index = _layer_index(self, layer)
    code = _phase_code(phase)
    try:
        rows = _block_rows(ids)
    except (TypeError, ValueError):
        rows = -1  # the slow path names the problem
    try:
        if rows > STACK_IDS:
            tags = <int64_t*>malloc(rows * sizeof(int64_t))
            keep = <uint8_t*>malloc(rows)
            if tags == NULL or keep == NULL:
                raise MemoryError()
        elif rows >= 0:
            keep = keep_local
        if rows >= 0:
            try:
                if mask is not None:
                    _mask_copy(mask, rows, keep)  # the one read of the caller's mask
                count = _fast_seq(seq, rows, keep if mask is not None else NULL, tags)
                if count >= 0:
                    args.keep = keep if mask is not None else NULL
                    args.rows = rows
                    args.seq = tags
                    args.count = count
                    args.phase = code
                    _record_block(self, index, ids, None, False, &args)
                    return 0
            except (TypeError, ValueError, IndexError, OverflowError):
                pass  # nothing was committed: the slow path reads again and names the problem as both cores do
    finally:
        if rows > STACK_IDS:
            free(tags)
            free(keep)
    # Anything else, and every error: the pure-Python core's reading, into private copies.
    if _convert.is_tensor(ids):
        _exchange_table(type(ids))  # from now on, tensors of this class take the fast path
    block = _sequences.block_copy(ids)
    mask_arr = _sequences.mask_copy(mask, block.shape[0])
    kept = np.ascontiguousarray(_sequences.seq_copy(seq, block.shape[0], mask_arr), dtype=np.int64)
    args.keep = NULL
    args.rows = block.shape[0]
    args.seq = <const int64_t*>cnp.PyArray_DATA(kept)
    args.count = kept.shape[0]
    args.phase = code
    if mask_arr is not None:
        kept_rows = np.ascontiguousarray(mask_arr, dtype=np.uint8)
        args.keep = <const uint8_t*>cnp.PyArray_DATA(kept_rows)
    _record_block(self, index, block, None, False, &args)
    return 0
