# record_many and record_prediction_many: a (rows, top_k) block of passes,
# read once through a view, optionally masked, committed whole.
#
# Included by _recorder.pyx.

# -- record_many and record_prediction_many -----------------------------------

# Blocks of at least this many ids (and at least num_experts of them) count
# through four scratch tables (see _convert_count); smaller ones count
# straight into the layer's row, so a small block costs no allocation and a
# block over a huge expert count no table to clear.
cdef Py_ssize_t TABLE_MIN_IDS = 2048


cdef Py_ssize_t _record_block(RecorderCore self, object layer, object selected, object mask,
                              bint prediction, const TagArgs* tagging) except -1:
    """``n`` passes (or predictions) for ``layer`` at once, only the rows ``mask`` keeps; all or nothing.

    ``tagging``: NULL, or record_batch's private copies (the kept rows'
    sequence ids, the phase, and the row mask in place of ``mask``),
    committed with the passes. Returns 0.
    """
    cdef Py_ssize_t first
    cdef IdView view
    cdef Py_ssize_t index, rows, width, total, chosen, i
    cdef uint8_t* keep = NULL
    cdef uint8_t* owned_keep = NULL
    cdef uint32_t local[STACK_IDS]
    cdef uint32_t* dest = NULL
    cdef uint32_t* scratch = NULL
    cdef uint64_t* tables = NULL
    cdef uint64_t* row
    cdef IdBuf* buf = self._pred if prediction else self._trace
    cdef object held = None
    cdef TagBuf* tag = NULL
    if self._closed:
        raise _errors.closed()
    index = _layer_index(self, layer)
    if not _fast_view(selected, &view, 2):
        held, masked = _block_slowly(self, selected, mask)
        if masked:
            mask = None
        _array_view(held, &view, 2)
    rows = view.rows
    width = view.width
    _expect(self, width)
    try:
        if tagging != NULL and tagging.keep != NULL:
            if tagging.rows != rows:
                raise RuntimeError(f"a row mask of {tagging.rows} rows for a block of {rows}")
            keep = <uint8_t*>tagging.keep
            chosen = 0
            for i in range(rows):
                chosen += keep[i] != 0
        elif mask is not None:
            keep = owned_keep = <uint8_t*>malloc(rows if rows else 1)
            if keep == NULL:
                raise MemoryError()
            chosen = _mask_copy(mask, rows, keep)
        else:
            chosen = rows
        if chosen == 0:
            return 0
        total = chosen * width
        if buf != NULL:
            # Straight into the trace's (or predictions') spare capacity: it
            # becomes part of it only when len moves, once all is valid.
            dest = _spare(&buf[index], total)
            _prefault_spare(&buf[index], total)
        # Python code may have run (a layer's __index__, a slow conversion).
        if self._closed:
            raise _errors.closed()
        if tagging != NULL:
            if tagging.count != chosen:
                raise RuntimeError(f"{tagging.count} tags for {chosen} kept rows")
            # Room for the tags before anything is counted: after this, no
            # step can fail and none runs Python code until the commit.
            if self._tags == NULL:
                self._tags = <TagBuf*>calloc(max(self._num_layers, 1), sizeof(TagBuf))
                if self._tags == NULL:
                    raise MemoryError()
            tag = &self._tags[index]
            _tags_reserve(tag, _kept(self._passes[index] + chosen, self._cap) - self._taken[index])
        if (not prediction and keep == NULL and total >= TABLE_MIN_IDS
                and self._num_experts <= <uint64_t>total and _contiguous(&view)):
            tables = <uint64_t*>calloc(4 * (self._num_experts + 1), sizeof(uint64_t))
            if tables == NULL:
                raise MemoryError()
            _on_view(&view, CONVERT_COUNT, NULL, dest, tables, self._num_experts)
            _recheck_k(self, width)
            _merge_counts(self._counts + index * self._num_experts, tables, self._num_experts)
        else:
            if dest == NULL:
                if total <= STACK_IDS:
                    dest = local
                else:
                    dest = scratch = <uint32_t*>malloc(total * sizeof(uint32_t))
                    if scratch == NULL:
                        raise MemoryError()
            _on_view(&view, CONVERT, keep, dest, NULL, self._num_experts)
            _recheck_k(self, width)
            if not prediction:
                row = self._counts + index * self._num_experts
                for i in range(total):
                    row[dest[i]] += 1
        first = <Py_ssize_t>self._passes[index]
        if prediction:
            _commit_prediction_rows(self, index, chosen, width)
        else:
            if tag != NULL:
                # Under a cap, tags only for the kept passes (the defaults pad up to the first of them).
                _commit_tags(tag, _kept(first, self._cap) - self._taken[index], tagging.seq,
                             _kept(first + chosen, self._cap) - _kept(first, self._cap), <uint8_t>tagging.phase)
                self._tagged = True
            _commit_block(self, index, chosen, width)
    finally:
        free(owned_keep)
        free(scratch)
        free(tables)
    return 0


cdef tuple _block_slowly(RecorderCore self, object selected, object mask):
    """Any other accepted block as (a 2-D integer ndarray ``_array_view`` takes, whether ``mask`` was applied).

    Raises as the pure-Python core does. Object arrays (big or odd ints) are
    validated here, into a private uint32 copy of the rows the mask keeps.
    """
    if not (isinstance(selected, (list, tuple)) or cnp.PyArray_Check(selected)
            or _convert.is_array_like(selected)):
        raise _errors.selection_type(selected)
    if _convert.is_tensor(selected):
        _exchange_table(type(selected))  # from now on, tensors of this class take the fast path
    arr = _convert.as_array(selected, _convert.TWO_D)
    _convert.check_length(arr.shape[1], self._top_k or self._pred_k)
    if arr.dtype.kind == "O":
        return _convert.block_ids(arr, self._num_experts, mask), True
    return _plain_integer_array(arr), False


cdef inline int _commit_prediction_rows(RecorderCore self, Py_ssize_t index, Py_ssize_t rows,
                                        Py_ssize_t width) noexcept:
    """Commit ``rows`` validated predictions already in the predictions' spare room (dropped when the probe is off)."""
    cdef IdBuf* pred
    cdef size_t first
    if self._pred == NULL:
        return 0
    pred = &self._pred[index]
    if self._capped:
        first = pred.len // <size_t>width
        pred.len += (_kept(first + rows, self._cap) - first) * width
    else:
        pred.len += rows * width
    self._unspilled += rows * width
    _prefault(pred)
    if self._top_k == 0 and self._pred_k == 0:
        self._pred_k = width
    return 0
