# Per-pass sequence ids and phases (record_batch's tags), committed with their
# passes: a tagged block's counts, trace and tags land in one commit that runs
# no Python code, so no write, signal handler or other thread can see a pass
# without its tag. Columns exist once a tagged pass was committed; passes
# recorded without tags read as sequence 0, decode (DEFAULT_SEQ/PHASE), by
# padding when the next tagged block commits and when the JSON is written.
#
# Included by _recorder.pyx.

cdef enum:
    DEFAULT_SEQ = 0
    DEFAULT_PHASE = 1   # decode


cdef struct TagBuf:
    int64_t* seq
    uint8_t* phase
    size_t len
    size_t cap


cdef int _tags_reserve(TagBuf* t, size_t need) except -1:
    """Room for ``need`` tags; raises MemoryError (changing nothing) when it cannot grow."""
    cdef size_t cap = t.cap
    cdef int64_t* seq
    cdef uint8_t* phase
    if need <= cap:
        return 0
    cap = cap * 2 if cap else FIRST_CAPACITY
    while cap < need:
        cap *= 2
    seq = <int64_t*>realloc(t.seq, cap * sizeof(int64_t))
    if seq == NULL:
        raise MemoryError()
    t.seq = seq
    phase = <uint8_t*>realloc(t.phase, cap)
    if phase == NULL:
        raise MemoryError()
    t.phase = phase
    t.cap = cap
    return 0


cdef void _free_tags(TagBuf* tags, Py_ssize_t count) noexcept:
    cdef Py_ssize_t layer
    if tags == NULL:
        return
    for layer in range(count):
        free(tags[layer].seq)
        free(tags[layer].phase)
    free(tags)


cdef inline void _commit_tags(TagBuf* t, size_t first, const int64_t* seq, Py_ssize_t rows,
                              uint8_t phase) noexcept nogil:
    """Tag passes first..first+rows-1 (room reserved); untagged passes before them read as defaults."""
    cdef size_t i
    for i in range(t.len, first):
        t.seq[i] = DEFAULT_SEQ
        t.phase[i] = DEFAULT_PHASE
    memcpy(t.seq + first, seq, rows * sizeof(int64_t))
    for i in range(first, first + rows):
        t.phase[i] = phase
    t.len = first + rows


cdef int _phase_code(object phase) except -1:
    # Literals are interned: the identity tests settle the usual call without a comparison.
    if phase is "decode":
        return 1
    if phase is "prompt":
        return 0
    if isinstance(phase, str):
        if phase == "prompt":
            return 0
        if phase == "decode":
            return 1
    return _sequences.phase_code(phase)  # raises, with the message both cores give


cdef struct TagArgs:
    # record_batch's private copies, handed to _record_block.
    const uint8_t* keep     # the row mask (0/1 per row), or NULL: every row
    Py_ssize_t rows
    const int64_t* seq      # the kept rows' sequence ids, in row order
    Py_ssize_t count
    int phase


cdef Py_ssize_t _fast_seq(object seq, Py_ssize_t rows, const uint8_t* keep, int64_t* out) except -2:
    """Copy the kept rows' sequence ids into ``out`` (room for ``rows``), reading the caller's
    buffer once, for an int64 ndarray or a list of ints; returns how many, or -1 for anything
    else or anything wrong (the slow path, ``_sequences.seq_copy``, then reads it and names it)."""
    cdef cnp.ndarray arr
    cdef const char* src
    cdef Py_ssize_t stride, i, n = 0
    cdef int64_t value
    cdef long long big
    cdef int overflow = 0
    cdef PyObject* item
    cdef IdView view
    if _is_known_tensor(seq):
        # A CPU tensor, through its DLPack description (no Python-level reads).
        if (not _tensor_view(seq, &view, "seq") or view.ndim != 1 or view.width != rows or view.itemsize != 8
                or not view.is_signed or view.is_bool):
            return -1
        for i in range(rows):
            if keep == NULL or keep[i]:
                value = (<const int64_t*>(view.data + i * view.stride))[0]
                if value < 0:
                    return -1
                out[n] = value
                n += 1
        return n
    if cnp.PyArray_CheckExact(seq):
        arr = <cnp.ndarray>seq
        if (cnp.PyArray_TYPE(arr) != cnp.NPY_INT64 or cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_DIM(arr, 0) != rows
                or not cnp.PyArray_ISALIGNED(arr) or not cnp.PyArray_ISNOTSWAPPED(arr)):
            return -1
        src = <const char*>cnp.PyArray_DATA(arr)
        stride = cnp.PyArray_STRIDE(arr, 0)
        for i in range(rows):
            if keep == NULL or keep[i]:
                value = (<const int64_t*>(src + i * stride))[0]  # read once, checked as read
                if value < 0:
                    return -1
                out[n] = value
                n += 1
        return n
    if PyList_CheckExact(seq) and PyList_GET_SIZE(seq) == rows:
        for i in range(rows):
            item = PyList_GET_ITEM(seq, i)
            if not _is_exact_int(item):
                return -1  # a dropped row's entry must be an integer too (one rule with the pure core)
            if keep != NULL and not keep[i]:
                continue
            if not ts_compact_int(item, &big):
                big = PyLong_AsLongLongAndOverflow(<object>item, &overflow)
            if overflow or big < 0:
                return -1
            out[n] = big
            n += 1
        return n
    return -1


cdef Py_ssize_t _block_rows(object ids) except -2:
    """Rows of a block the fast path takes as it is (an ndarray, a list, a CPU tensor), else -1."""
    cdef IdView view
    if _is_known_tensor(ids):
        if not _tensor_view(ids, &view, "ids") or view.ndim != 2:
            return -1
        return view.rows
    if cnp.PyArray_CheckExact(ids):
        return cnp.PyArray_DIM(<cnp.ndarray>ids, 0) if cnp.PyArray_NDIM(<cnp.ndarray>ids) == 2 else -1
    if PyList_CheckExact(ids):
        return PyList_GET_SIZE(ids)
    return -1
