# Growable uint32 id buffers (one per layer for the trace and the probe),
# faulted in ahead of the writer, and their copies out as numpy arrays.
#
# Included by _recorder.pyx.

ctypedef struct IdBuf:
    uint32_t* data
    size_t len
    size_t cap
    size_t faulted  # ids of capacity known to be resident (see _prefault)

# How far ahead of the writer a trace's memory is faulted in: 64 KiB, so one
# system call replaces sixteen page faults. Small traces are left to fault
# page by page (sixteen faults at most), so a short capture of many layers
# holds no memory it never writes.
cdef size_t PREFAULT_IDS = 16384
cdef bint _prefault_works = True


cdef inline void _prefault_spare(IdBuf* buf, size_t n) noexcept nogil:
    """Fault in the next ``n`` ids of spare capacity in one call, before a bulk write."""
    global _prefault_works
    cdef size_t end = buf.len + n
    if end <= buf.faulted or not _prefault_works:
        return
    if ts_prefault(buf.data, buf.faulted * sizeof(uint32_t), end * sizeof(uint32_t)) != 0:
        _prefault_works = False
    buf.faulted = end


cdef inline void _prefault(IdBuf* buf) noexcept nogil:
    """Once a trace outgrows the first window, keep one window faulted in ahead of its writer."""
    global _prefault_works
    cdef size_t end
    if buf.len < buf.faulted or buf.len < PREFAULT_IDS or not _prefault_works:
        return
    end = buf.len + PREFAULT_IDS
    if end > buf.cap:
        end = buf.cap
    if ts_prefault(buf.data, buf.faulted * sizeof(uint32_t), end * sizeof(uint32_t)) != 0:
        _prefault_works = False
    buf.faulted = end


cdef int _reserve(IdBuf* buf, size_t extra) except -1:
    """Make room for ``extra`` more ids, growing by doubling (amortised O(1))."""
    cdef size_t need = buf.len + extra
    cdef size_t cap
    cdef uint32_t* grown
    if need <= buf.cap:
        return 0
    cap = buf.cap * 2 if buf.cap else FIRST_CAPACITY
    while cap < need:
        cap *= 2
    # realloc (not calloc) so capacity never written costs no resident memory.
    grown = <uint32_t*>realloc(buf.data, cap * sizeof(uint32_t))
    if grown == NULL:
        raise MemoryError()
    buf.data = grown
    buf.cap = cap
    return 0


cdef inline size_t _kept(uint64_t passes, uint64_t cap) noexcept nogil:
    """How many of a layer's first ``passes`` passes a trace capped at ``cap`` keeps."""
    return <size_t>(passes if passes < cap else cap)


cdef void _free_rows(IdBuf* rows, Py_ssize_t count) noexcept:
    cdef Py_ssize_t layer
    if rows == NULL:
        return
    for layer in range(count):
        free(rows[layer].data)
    free(rows)


cdef object _rows_array(IdBuf* buf, Py_ssize_t width):
    cdef cnp.ndarray out = np.empty(buf.len, dtype=np.uint32)
    if buf.len:
        memcpy(cnp.PyArray_DATA(out), buf.data, buf.len * sizeof(uint32_t))
    if width == 0:
        return out.reshape(0, 0)
    return out.reshape(-1, width)
