# record and record_prediction: one pass of ids, converted on the stack
# (or straight from a list of small ints), validated, then committed.
#
# Included by _recorder.pyx.

# -- the per-call path of record and record_prediction ----------------------
# Module-level cdef functions rather than methods: direct C calls the
# compiler can inline, where a cdef method goes through the vtable.

cdef enum:
    OTHER = 0
    LIST = 1
    TUPLE = 2
    VIEW = 3  # an integer ndarray or a CPU tensor, described by an IdView

cdef inline int _record_pass(RecorderCore self, object layer, object selected, bint prediction) except -1:
    """One pass's selection (or, with ``prediction``, the pilot's prediction) for ``layer``."""
    cdef uint32_t local[STACK_IDS]
    cdef uint32_t* dest
    cdef IdBuf* rows = self._pred if prediction else self._trace
    cdef Py_ssize_t index, n = 0
    cdef int kind
    cdef IdView view
    if self._closed:
        raise _errors.closed()
    index = _layer_index(self, layer)
    kind = _kind(selected, &n, &view)
    if kind == OTHER:
        selected = _normalize(selected)
        kind = _kind(selected, &n, &view)
        if kind == OTHER:  # cannot happen: _normalize returns what _kind accepts
            raise _errors.selection_type(selected)
    _expect(self, n)
    # Ids are converted straight into the trace's (or predictions') spare
    # capacity, or a stack buffer: they join it only when its length moves,
    # after the whole call has been validated.
    if rows != NULL:
        dest = _spare(&rows[index], n)
    elif n <= STACK_IDS:
        dest = local
    else:
        return _record_slowly(self, index, selected, kind, n, prediction, &view)
    # Python code may have run since the entry check (a layer's __index__,
    # _normalize): another thread may have closed the recorder meanwhile.
    if self._closed:
        raise _errors.closed()
    # The fast conversion counts selections as it goes (and takes its counts
    # back if it stops early): no Python code runs in it, so nobody sees them.
    if _convert_fast(self, selected, kind, n, dest,
                     NULL if prediction else self._counts + index * self._num_experts, &view) < n:
        return _record_slowly(self, index, selected, kind, n, prediction, &view)
    if prediction:
        return _commit_prediction(self, index, dest, n, False)
    return _commit_selection(self, index, dest, n, False)


cdef inline Py_ssize_t _layer_index(RecorderCore self, object layer) except -1:
    cdef Py_ssize_t index = ts_small_index(<PyObject*>layer, self._num_layers)
    if index >= 0:
        return index
    return _layer_index_slowly(self, layer)


cdef Py_ssize_t _layer_index_slowly(RecorderCore self, object layer) except -1:
    return _convert.check_layer(layer, self._num_layers)


cdef inline int _kind(object selected, Py_ssize_t* n, IdView* view) except -1:
    """LIST, TUPLE or VIEW (1-D integer ndarray or known CPU tensor) with its length in ``n``; else OTHER."""
    if PyList_CheckExact(selected):
        n[0] = PyList_GET_SIZE(selected)
        return LIST
    if PyTuple_CheckExact(selected):
        n[0] = PyTuple_GET_SIZE(selected)
        return TUPLE
    if _fast_view(selected, view, 1):
        n[0] = view.width
        return VIEW
    return OTHER


cdef object _normalize(object selected):
    """Any other accepted selection as a plain list or ndarray; raise as the pure-Python core does."""
    if isinstance(selected, (list, tuple)):
        return list(selected)
    if cnp.PyArray_Check(selected) or _convert.is_array_like(selected):
        if _convert.is_tensor(selected):
            _exchange_table(type(selected))  # from now on, tensors of this class take the fast path
        arr = _convert.as_array(selected, _convert.ONE_D)
        if arr.dtype.kind == "O":
            return arr.tolist()
        return np.asarray(_plain_integer_array(arr))
    if _convert.is_iterable_selection(selected):
        return list(selected)
    raise _errors.selection_type(selected)


cdef inline int _expect(RecorderCore self, Py_ssize_t n) except -1:
    cdef Py_ssize_t expected = self._top_k or self._pred_k
    if n == 0 or (expected and n != expected):
        _convert.check_length(n, expected)  # raises, with the message both cores share
    return 0


cdef inline int _recheck_k(RecorderCore self, Py_ssize_t n) except -1:
    # The slow conversion may run Python code (an id's __index__) that lets
    # another thread close the recorder, or learn top_k first; the commit
    # must still find it open, and agree with it.
    cdef Py_ssize_t expected = self._top_k or self._pred_k
    if self._closed:
        raise _errors.closed()
    if expected and n != expected:
        raise _errors.length(n, expected)
    return 0


cdef inline uint32_t* _spare(IdBuf* buf, Py_ssize_t n) except NULL:
    """Room for ``n`` more ids at the end of ``buf``, not yet part of it."""
    if buf.len + n > buf.cap:
        _reserve(buf, n)
    return buf.data + buf.len


cdef inline Py_ssize_t _convert_fast(RecorderCore self, object selected, int kind, Py_ssize_t n,
                                     uint32_t* dest, uint64_t* row, const IdView* view) except -1:
    """Convert, and count into ``row`` unless NULL, without running Python code.

    Returns n, or fewer (having counted nothing) when some id needs the slow
    path; raises, having counted nothing, for an array with a bad id.
    """
    if kind == VIEW:
        _on_view(view, CONVERT if row == NULL else RECORD, NULL, dest, row, self._num_experts)
        return n
    return ts_record_ints(PySequence_Fast_ITEMS(selected), n, self._num_experts, dest, row)


# numpy's integer scalar types (np.int8 ... np.uint64, and the C-named
# aliases that are distinct types, e.g. np.longlong), with their value's
# size and sign. Every one is a PyObject header followed by the value
# (numpy's Py<Type>ScalarObject), so a value is read at a fixed offset.
cdef tuple _numpy_int_types = tuple({t: None for t in (
    np.byte, np.ubyte, np.short, np.ushort, np.intc, np.uintc, np.int_, np.uint, np.longlong, np.ulonglong)})
cdef PyObject* _np_types[16]
cdef int _np_sizes[16]
cdef bint _np_signed[16]
cdef int _np_count = 0
for _t in _numpy_int_types:
    _np_types[_np_count] = <PyObject*>_t
    _np_sizes[_np_count] = np.dtype(_t).itemsize
    _np_signed[_np_count] = np.dtype(_t).kind == "i"
    _np_count += 1


cdef inline bint _numpy_int(PyObject* item, long long* value) noexcept:
    """The value of a numpy integer scalar read in place; False for anything else, or beyond int64."""
    cdef PyObject* kind = _type_of(<object>item)
    cdef const char* at = <const char*>item + sizeof(PyObject)
    cdef int i
    for i in range(_np_count):
        if kind != _np_types[i]:
            continue
        if _np_sizes[i] == 8:
            if _np_signed[i]:
                value[0] = (<const int64_t*>at)[0]
                return True
            if (<const uint64_t*>at)[0] > <uint64_t>9223372036854775807:
                return False
            value[0] = <long long>(<const uint64_t*>at)[0]
        elif _np_sizes[i] == 4:
            if _np_signed[i]:
                value[0] = (<const int32_t*>at)[0]
            else:
                value[0] = (<const uint32_t*>at)[0]
        elif _np_sizes[i] == 2:
            if _np_signed[i]:
                value[0] = (<const int16_t*>at)[0]
            else:
                value[0] = (<const uint16_t*>at)[0]
        elif _np_signed[i]:
            value[0] = (<const int8_t*>at)[0]
        else:
            value[0] = (<const uint8_t*>at)[0]
        return True
    return False


cdef int _convert_slowly(RecorderCore self, object selected, int kind, Py_ssize_t n,
                         uint32_t* ids, const IdView* view) except -1:
    """Any list or tuple of ids, some of which may run Python code (``__index__``)."""
    cdef Py_ssize_t i
    cdef PyObject* item
    cdef long long value
    if kind == VIEW:
        return _convert_fast(self, selected, kind, n, ids, NULL, view)
    for i in range(n):
        if kind == LIST:
            # That code may shrink the list under us.
            if i >= PyList_GET_SIZE(selected):
                raise RuntimeError("the selection changed size while it was being recorded")
            item = PyList_GET_ITEM(selected, i)
        else:
            item = PyTuple_GET_ITEM(selected, i)
        if _is_exact_int(item) and ts_compact_int(item, &value) and 0 <= value and <uint64_t>value < self._num_experts:
            ids[i] = <uint32_t>value
        elif _numpy_int(item, &value) and 0 <= value and <uint64_t>value < self._num_experts:
            # A numpy integer scalar (list(arr)): read in place, no Python frame.
            ids[i] = <uint32_t>value
        else:
            ids[i] = <uint32_t>_convert.check_id(<object>item, i, self._num_experts)
    return 0


cdef int _record_slowly(RecorderCore self, Py_ssize_t index, object selected, int kind, Py_ssize_t n,
                        bint prediction, const IdView* view) except -1:
    """Convert into a private buffer first, then commit with a copy: safe whatever the ids run."""
    cdef uint32_t* ids = <uint32_t*>malloc(n * sizeof(uint32_t))
    if ids == NULL:
        raise MemoryError()
    try:
        _convert_slowly(self, selected, kind, n, ids, view)
        if prediction:
            _commit_prediction(self, index, ids, n, True)
        else:
            _commit_selection(self, index, ids, n, True)
    finally:
        free(ids)
    return 0


cdef inline int _commit_selection(RecorderCore self, Py_ssize_t index, const uint32_t* ids,
                                  Py_ssize_t n, bint slow) except -1:
    """Append validated ids to the trace; after a slow conversion, also copy and count them."""
    cdef Py_ssize_t i
    cdef uint64_t* row = self._counts + index * self._num_experts
    cdef IdBuf* trace
    if slow:
        _recheck_k(self, n)
    if self._trace != NULL and self._passes[index] < self._cap:
        trace = &self._trace[index]
        if slow:
            memcpy(_spare(trace, n), ids, n * sizeof(uint32_t))
        trace.len += n
        _prefault(trace)
    if slow:
        for i in range(n):
            row[ids[i]] += 1
    if self._top_k == 0:
        self._top_k = n
    self._passes[index] += 1
    self._commits += 1
    self._unspilled += n
    return 0


cdef inline int _commit_prediction(RecorderCore self, Py_ssize_t index, const uint32_t* ids,
                                   Py_ssize_t n, bint copy) except -1:
    cdef IdBuf* pred
    _recheck_k(self, n)
    if self._pred == NULL:
        return 0
    pred = &self._pred[index]
    # Under a cap a layer keeps its first N predictions, aligned with the first N passes.
    if not self._capped or pred.len // <size_t>n < self._cap:
        if copy:
            memcpy(_spare(pred, n), ids, n * sizeof(uint32_t))
        pred.len += n
        _prefault(pred)
        self._unspilled += n
    if self._top_k == 0 and self._pred_k == 0:
        self._pred_k = n
    return 0
