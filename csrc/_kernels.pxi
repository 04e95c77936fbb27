# Conversion kernels: ids read from strided memory, validated and counted in
# one pass (four count tables for long blocks, merged after), and the
# commit that makes a counted block part of the recorder.
#
# Included by _recorder.pyx.

ctypedef fused int_t:
    int8_t
    uint8_t
    int16_t
    uint16_t
    int32_t
    uint32_t
    int64_t
    uint64_t


cdef inline Py_ssize_t _record_strided(const int_t* first, Py_ssize_t n, Py_ssize_t stride,
                                       uint32_t* out, uint64_t* row, uint64_t num_experts,
                                       uint64_t* bad) noexcept nogil:
    """Copy ``n`` strided ids to ``out`` and count them into ``row``; on a bad id take the counts back
    and return its position (its bits in ``bad``); else -1."""
    cdef const char* base = <const char*>first
    cdef int_t value
    cdef Py_ssize_t i, j
    for i in range(n):
        value = (<const int_t*>(base + i * stride))[0]
        if value < 0 or <uint64_t>value >= num_experts:
            bad[0] = <uint64_t>value
            for j in range(i):
                row[out[j]] -= 1
            return i
        out[i] = <uint32_t>value
        row[value] += 1
    return -1


cdef Py_ssize_t _convert_count(const int_t* src, Py_ssize_t n, uint32_t* out, uint64_t num_experts,
                               uint64_t* tables, uint64_t* bad) noexcept nogil:
    """One pass over ``n`` contiguous ids: validate, copy to ``out`` (unless NULL), count.

    Counts go to four interleaved scratch tables of ``num_experts + 1`` slots
    (zeroed by the caller): one table would serialise on repeated ids, each
    increment waiting for the previous store to the same counter. A quad
    holding an out-of-range id (a negative one too, once cast to uint64) is
    searched in the values this pass read, never re-read from ``src``: its
    position is returned, its bits put in ``bad``, and the caller merges
    nothing. Returns -1 when every id is valid.
    """
    cdef uint64_t flagged = 0
    cdef uint64_t v0, v1, v2, v3
    cdef uint64_t width = num_experts + 1
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t quad = n - n % 4
    while i < quad:
        v0 = <uint64_t>src[i]
        v1 = <uint64_t>src[i + 1]
        v2 = <uint64_t>src[i + 2]
        v3 = <uint64_t>src[i + 3]
        flagged = (v0 >= num_experts) | (v1 >= num_experts) | (v2 >= num_experts) | (v3 >= num_experts)
        if flagged:
            # The values in hand, not a re-read of src: another thread may
            # have changed it since.
            if v0 >= num_experts:
                bad[0] = v0
                return i
            if v1 >= num_experts:
                bad[0] = v1
                return i + 1
            if v2 >= num_experts:
                bad[0] = v2
                return i + 2
            bad[0] = v3
            return i + 3
        if out != NULL:
            out[i] = <uint32_t>v0
            out[i + 1] = <uint32_t>v1
            out[i + 2] = <uint32_t>v2
            out[i + 3] = <uint32_t>v3
        tables[v0] += 1
        tables[width + v1] += 1
        tables[2 * width + v2] += 1
        tables[3 * width + v3] += 1
        i += 4
    while i < n:
        v0 = <uint64_t>src[i]
        if v0 >= num_experts:
            bad[0] = v0
            return i
        if out != NULL:
            out[i] = <uint32_t>v0
        tables[v0] += 1
        i += 1
    return -1


cdef inline void _commit_block(RecorderCore self, Py_ssize_t index, Py_ssize_t rows, Py_ssize_t width) noexcept:
    """The rest of a ``record_many`` commit once its ids are counted (and sit in the trace's spare room)."""
    if self._top_k == 0:
        self._top_k = width
    if self._trace != NULL:
        # Under a cap, only the rows before it join the trace (the first N passes).
        self._trace[index].len += (_kept(self._passes[index] + rows, self._cap)
                                   - _kept(self._passes[index], self._cap)) * width
        _prefault(&self._trace[index])
    self._passes[index] += rows
    self._commits += 1
    self._unspilled += rows * width


cdef void _merge_counts(uint64_t* row, const uint64_t* tables, uint64_t num_experts) noexcept nogil:
    cdef uint64_t e
    cdef uint64_t width = num_experts + 1
    for e in range(num_experts):
        row[e] += tables[e] + tables[width + e] + tables[2 * width + e] + tables[3 * width + e]


cdef cnp.ndarray _plain_integer_array(cnp.ndarray arr):
    """``arr`` itself when C code can read it directly, else a native-order aligned copy."""
    cdef int typenum = cnp.PyArray_TYPE(arr)
    if not cnp.PyTypeNum_ISINTEGER(typenum) or typenum == cnp.NPY_BOOL:
        raise _errors.dtype(str(arr.dtype))
    if cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_ISALIGNED(arr):
        return arr
    # A fresh copy: ascontiguousarray would hand back an unaligned array as is.
    return np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C", copy=True)
