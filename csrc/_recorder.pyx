"""Compiled recorder core: the hot paths of ``turbospark.RouterHistogram``.

Behaviour is defined by ``turbospark/_recorder_py.py``; this module must
match it call for call (same results, same exceptions, same messages). Ids
are validated into a local buffer first and committed only when the whole
call is valid, and the commit runs no Python code, so a call is atomic under
the GIL and a rejected call records nothing.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy

cimport numpy as cnp

import numpy as np

from turbospark import _convert, _counts, _errors

cnp.import_array()
ts_init_small_ints()

cdef extern from "_fastint.h":
    bint ts_compact_int(PyObject* op, long long* value)
    int ts_init_small_ints() except -1
    Py_ssize_t ts_record_ints(PyObject** items, Py_ssize_t n, unsigned long long limit, uint32_t* out,
                              uint64_t* row)
    Py_ssize_t ts_small_index(PyObject* op, Py_ssize_t limit)
    int ts_prefault(void* base, size_t start, size_t end) noexcept nogil

cdef extern from "Python.h":
    bint PyLong_CheckExact(object)
    bint PyList_CheckExact(object)
    bint PyTuple_CheckExact(object)
    Py_ssize_t PyList_GET_SIZE(object)
    PyObject* PyList_GET_ITEM(object, Py_ssize_t)
    Py_ssize_t PyTuple_GET_SIZE(object)
    PyObject* PyTuple_GET_ITEM(object, Py_ssize_t)
    PyObject** PySequence_Fast_ITEMS(object)
    # The same check on a borrowed pointer, so Cython adds no INCREF/DECREF.
    bint _is_exact_int "PyLong_CheckExact"(PyObject*)

# Selections up to this many ids are converted on the stack; top-k routing
# never comes close, so the heap is only touched by unusual callers.
cdef enum:
    STACK_IDS = 64
    FIRST_CAPACITY = 256


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


ctypedef fused int_t:
    int8_t
    uint8_t
    int16_t
    uint16_t
    int32_t
    uint32_t
    int64_t
    uint64_t


cdef Py_ssize_t _convert_strided(const int_t* first, Py_ssize_t n, Py_ssize_t stride,
                                 uint32_t* out, uint64_t num_experts) noexcept nogil:
    """Copy ``n`` ids to ``out``; return the position of the first out-of-range id, or -1."""
    cdef const char* base = <const char*>first
    cdef int_t value
    cdef Py_ssize_t i
    for i in range(n):
        value = (<const int_t*>(base + i * stride))[0]
        if value < 0 or <uint64_t>value >= num_experts:
            return i
        out[i] = <uint32_t>value
    return -1


cdef inline Py_ssize_t _record_strided(const int_t* first, Py_ssize_t n, Py_ssize_t stride,
                                       uint32_t* out, uint64_t* row, uint64_t num_experts) noexcept nogil:
    """``_convert_strided`` that also counts into ``row``, taking its counts back on a bad id."""
    cdef const char* base = <const char*>first
    cdef int_t value
    cdef Py_ssize_t i, j
    for i in range(n):
        value = (<const int_t*>(base + i * stride))[0]
        if value < 0 or <uint64_t>value >= num_experts:
            for j in range(i):
                row[out[j]] -= 1
            return i
        out[i] = <uint32_t>value
        row[value] += 1
    return -1


cdef inline uint64_t _clamp(uint64_t value, uint64_t limit) noexcept nogil:
    return value if value < limit else limit


cdef bint _convert_count(const int_t* src, Py_ssize_t n, uint32_t* out, uint64_t num_experts,
                         uint64_t* tables) noexcept nogil:
    """One pass over ``n`` contiguous ids: validate, copy to ``out`` (unless NULL), count.

    Counts go to four interleaved scratch tables of ``num_experts + 1`` slots
    (zeroed by the caller): one table would serialise on repeated ids, each
    increment waiting for the previous store to the same counter. An
    out-of-range id (a negative one too, once cast to uint64) is counted in
    the spare last slot, so nothing is written out of bounds and the caller,
    seeing True, merges nothing and names the bad id instead.
    """
    cdef uint64_t bad = 0
    cdef uint64_t v0, v1, v2, v3
    cdef uint64_t width = num_experts + 1
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t quad = n - n % 4
    while i < quad:
        v0 = <uint64_t>src[i]
        v1 = <uint64_t>src[i + 1]
        v2 = <uint64_t>src[i + 2]
        v3 = <uint64_t>src[i + 3]
        bad |= (v0 >= num_experts) | (v1 >= num_experts) | (v2 >= num_experts) | (v3 >= num_experts)
        if out != NULL:
            out[i] = <uint32_t>v0
            out[i + 1] = <uint32_t>v1
            out[i + 2] = <uint32_t>v2
            out[i + 3] = <uint32_t>v3
        tables[_clamp(v0, num_experts)] += 1
        tables[width + _clamp(v1, num_experts)] += 1
        tables[2 * width + _clamp(v2, num_experts)] += 1
        tables[3 * width + _clamp(v3, num_experts)] += 1
        i += 4
    while i < n:
        v0 = <uint64_t>src[i]
        bad |= v0 >= num_experts
        if out != NULL:
            out[i] = <uint32_t>v0
        tables[_clamp(v0, num_experts)] += 1
        i += 1
    return bad != 0


# Above this many experts the scratch count tables of record_many would cost
# more to clear and merge than they save; count in place instead.
cdef uint64_t MAX_TABLE_EXPERTS = 65536


cdef int _record_many_sparse(RecorderCore self, Py_ssize_t index, cnp.ndarray arr, Py_ssize_t rows,
                             Py_ssize_t width, uint32_t* ids) except -1:
    """``record_many`` for very many experts: validate into ``ids`` (or scratch), then count in place."""
    cdef Py_ssize_t i
    cdef Py_ssize_t total = rows * width
    cdef uint32_t* scratch = NULL
    cdef uint64_t* row = self._counts + index * self._num_experts
    if ids == NULL:
        scratch = <uint32_t*>malloc(total * sizeof(uint32_t))
        if scratch == NULL:
            raise MemoryError()
        ids = scratch
    try:
        if _on_array(arr, CONVERT, total, cnp.PyArray_ITEMSIZE(arr), ids, NULL, self._num_experts) >= 0:
            _convert.array_ids(arr, self._num_experts)  # raises, naming the id
        _recheck_k(self, width)
        for i in range(total):
            row[ids[i]] += 1
        _commit_block(self, index, rows, width)
    finally:
        free(scratch)
    return 0


cdef inline void _commit_block(RecorderCore self, Py_ssize_t index, Py_ssize_t rows, Py_ssize_t width) noexcept:
    """The rest of a ``record_many`` commit once its ids are counted (and sit in the trace's spare room)."""
    if self._top_k == 0:
        self._top_k = width
    if self._trace != NULL:
        self._trace[index].len += rows * width
        _prefault(&self._trace[index])
    self._passes[index] += rows


cdef void _merge_counts(uint64_t* row, const uint64_t* tables, uint64_t num_experts) noexcept nogil:
    cdef uint64_t e
    cdef uint64_t width = num_experts + 1
    for e in range(num_experts):
        row[e] += tables[e] + tables[width + e] + tables[2 * width + e] + tables[3 * width + e]


cdef enum:
    # What _on_array does with an integer array's ids (see _kernel).
    CONVERT = 0
    RECORD = 1
    CONVERT_COUNT = 2


cdef inline Py_ssize_t _kernel(const int_t* data, int op, Py_ssize_t n, Py_ssize_t stride, uint32_t* out,
                               uint64_t* counts, uint64_t num_experts) noexcept nogil:
    """One loop over ``n`` ids of one dtype; returns the position of a bad id (0 for CONVERT_COUNT), or -1.

    CONVERT copies strided ids to ``out``; RECORD also counts them into the
    row ``counts``; CONVERT_COUNT reads contiguous ids into ``out`` (unless
    NULL) and the four scratch tables ``counts``.
    """
    if op == CONVERT:
        return _convert_strided(data, n, stride, out, num_experts)
    if op == RECORD:
        return _record_strided(data, n, stride, out, counts, num_experts)
    return 0 if _convert_count(data, n, out, num_experts, counts) else -1


cdef Py_ssize_t _on_array(cnp.ndarray arr, int op, Py_ssize_t n, Py_ssize_t stride, uint32_t* out,
                          uint64_t* counts, uint64_t num_experts) except -2:
    """Run ``_kernel`` on the (native, aligned, integer) dtype of ``arr``."""
    cdef void* data = cnp.PyArray_DATA(arr)
    cdef int itemsize = cnp.PyArray_ITEMSIZE(arr)
    cdef bint signed = cnp.PyTypeNum_ISSIGNED(cnp.PyArray_TYPE(arr))
    if itemsize == 8:
        if signed:
            return _kernel(<const int64_t*>data, op, n, stride, out, counts, num_experts)
        return _kernel(<const uint64_t*>data, op, n, stride, out, counts, num_experts)
    if itemsize == 4:
        if signed:
            return _kernel(<const int32_t*>data, op, n, stride, out, counts, num_experts)
        return _kernel(<const uint32_t*>data, op, n, stride, out, counts, num_experts)
    if itemsize == 2:
        if signed:
            return _kernel(<const int16_t*>data, op, n, stride, out, counts, num_experts)
        return _kernel(<const uint16_t*>data, op, n, stride, out, counts, num_experts)
    if itemsize == 1:
        if signed:
            return _kernel(<const int8_t*>data, op, n, stride, out, counts, num_experts)
        return _kernel(<const uint8_t*>data, op, n, stride, out, counts, num_experts)
    raise _errors.dtype(str(arr.dtype))


cdef cnp.ndarray _plain_integer_array(cnp.ndarray arr):
    """``arr`` itself when C code can read it directly, else a native-order aligned copy."""
    cdef int typenum = cnp.PyArray_TYPE(arr)
    if not cnp.PyTypeNum_ISINTEGER(typenum) or typenum == cnp.NPY_BOOL:
        raise _errors.dtype(str(arr.dtype))
    if cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_ISALIGNED(arr):
        return arr
    # A fresh copy: ascontiguousarray would hand back an unaligned array as is.
    return np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C", copy=True)


cdef inline char* _put_u64(char* p, uint64_t value) noexcept nogil:
    cdef char digits[20]
    cdef int n = 0
    if value < 10:
        p[0] = <char>(48 + value)
        return p + 1
    while value:
        digits[n] = <char>(48 + value % 10)
        value //= 10
        n += 1
    while n:
        n -= 1
        p[0] = digits[n]
        p += 1
    return p


cdef char* _put_rows(char* p, IdBuf* rows, Py_ssize_t num_layers) noexcept nogil:
    cdef Py_ssize_t layer
    cdef size_t i
    for layer in range(num_layers):
        if layer:
            p[0] = 44  # ','
            p += 1
        p[0] = 91  # '['
        p += 1
        for i in range(rows[layer].len):
            if i:
                p[0] = 44
                p += 1
            p = _put_u64(p, rows[layer].data[i])
        p[0] = 93  # ']'
        p += 1
    return p


cdef char* _put_text(char* p, const char* text, Py_ssize_t n) noexcept nogil:
    memcpy(p, text, n)
    return p + n


cdef size_t _digits(uint64_t value) noexcept nogil:
    cdef size_t n = 1
    while value >= 10:
        value //= 10
        n += 1
    return n


cdef class RecorderCore:
    """Counts, trace and predictions of one capture; see ``RouterHistogram``."""

    cdef Py_ssize_t _num_layers
    cdef uint64_t _num_experts
    cdef Py_ssize_t _top_k
    cdef Py_ssize_t _pred_k
    cdef uint64_t* _counts
    cdef uint64_t* _passes
    cdef IdBuf* _trace
    cdef IdBuf* _pred
    cdef bint _self_test
    cdef Py_ssize_t _logits_layer
    cdef uint64_t _logits_pass
    cdef object _logits
    cdef bint _closed
    cdef bint _ready

    def __cinit__(self, *args, **kwargs):
        self._counts = NULL
        self._passes = NULL
        self._trace = NULL
        self._pred = NULL
        self._logits = None
        self._logits_layer = -1

    def __init__(self, Py_ssize_t num_layers, uint64_t num_experts, Py_ssize_t top_k,
                 bint trace, pilot, Py_ssize_t logits_layer, uint64_t logits_pass):
        if self._ready:
            raise RuntimeError("a recorder core is initialised once")
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._top_k = top_k
        self._pred_k = 0
        self._counts = <uint64_t*>calloc(max(num_layers * num_experts, 1), sizeof(uint64_t))
        self._passes = <uint64_t*>calloc(max(num_layers, 1), sizeof(uint64_t))
        if self._counts == NULL or self._passes == NULL:
            raise MemoryError()
        if trace:
            self._trace = self._new_rows()
        if pilot is not None:
            self._pred = self._new_rows()
        self._self_test = pilot == "self"
        self._logits_layer = logits_layer
        self._logits_pass = logits_pass
        self._ready = True

    cdef IdBuf* _new_rows(self) except NULL:
        cdef IdBuf* rows = <IdBuf*>calloc(max(self._num_layers, 1), sizeof(IdBuf))
        cdef Py_ssize_t layer
        if rows == NULL:
            raise MemoryError()
        for layer in range(self._num_layers):
            rows[layer].data = <uint32_t*>malloc(FIRST_CAPACITY * sizeof(uint32_t))
            if rows[layer].data == NULL:
                _free_rows(rows, layer)
                raise MemoryError()
            rows[layer].cap = FIRST_CAPACITY
        return rows

    def __dealloc__(self):
        free(self._counts)
        free(self._passes)
        _free_rows(self._trace, self._num_layers)
        _free_rows(self._pred, self._num_layers)

    @property
    def num_layers(self):
        return self._num_layers

    @property
    def num_experts(self):
        return self._num_experts

    @property
    def top_k(self):
        return self._top_k

    @property
    def closed(self):
        return self._closed

    @property
    def trace_enabled(self):
        return self._trace != NULL

    def pilot_offset(self):
        return 0 if self._self_test else 1

    def pilot_enabled(self):
        return self._pred != NULL

    def record(self, layer, selected):
        _record_pass(self, layer, selected, False)

    def record_prediction(self, layer, predicted):
        _record_pass(self, layer, predicted, True)

    def record_many(self, layer, selected):
        cdef Py_ssize_t index, rows, width, total
        cdef cnp.ndarray arr
        cdef uint32_t* ids
        cdef uint64_t* tables
        if self._closed:
            raise _errors.closed()
        index = _layer_index(self, layer)
        if not (isinstance(selected, (list, tuple)) or cnp.PyArray_Check(selected)
                or _convert.is_array_like(selected)):
            raise _errors.selection_type(selected)
        arr = _convert.as_array(selected, _convert.TWO_D)
        rows = cnp.PyArray_DIM(arr, 0)
        width = cnp.PyArray_DIM(arr, 1)
        _convert.check_length(width, self._top_k or self._pred_k)
        if arr.dtype.kind == "O":
            arr = _convert.array_ids(arr, self._num_experts)
        else:
            arr = np.ascontiguousarray(_plain_integer_array(arr))
        if rows == 0:
            return
        total = rows * width
        ids = NULL
        if self._trace != NULL:
            # Convert straight into the trace's spare capacity: it becomes part
            # of the trace only when len moves, after the whole call is valid.
            ids = _spare(&self._trace[index], total)
            _prefault_spare(&self._trace[index], total)
        if self._num_experts > MAX_TABLE_EXPERTS:
            return _record_many_sparse(self, index, arr, rows, width, ids)
        tables = <uint64_t*>calloc(4 * (self._num_experts + 1), sizeof(uint64_t))
        if tables == NULL:
            raise MemoryError()
        try:
            if _on_array(arr, CONVERT_COUNT, total, 0, ids, tables, self._num_experts) >= 0:
                _convert.array_ids(arr, self._num_experts)  # raises, naming the id
            _recheck_k(self, width)
            _merge_counts(self._counts + index * self._num_experts, tables, self._num_experts)
            _commit_block(self, index, rows, width)
        finally:
            free(tables)

    def record_router_logits(self, layer, logits):
        cdef Py_ssize_t index, got
        if self._closed:
            raise _errors.closed()
        index = _layer_index(self, layer)
        got = _convert.logits_length(logits)
        if <uint64_t>got != self._num_experts:
            raise _errors.logits_length(got, self._num_experts)
        if index != self._logits_layer or self._passes[index] != self._logits_pass or self._logits is not None:
            return
        row = _convert.logit_row(logits, self._num_experts)
        # Converting ran Python code: another thread may have closed the
        # recorder, or recorded a pass or this very row, meanwhile.
        if self._closed:
            raise _errors.closed()
        if self._passes[index] == self._logits_pass and self._logits is None:
            self._logits = row

    def _after_fork_in_child(self):
        """Nothing to reset: this core holds no lock (the GIL makes each call atomic)."""

    def _mark_closed(self):
        """Close for recording; True only for the call that did it."""
        cdef bint was_open = not self._closed
        self._closed = True
        return was_open

    def counts_array(self):
        cdef cnp.ndarray out = np.empty((self._num_layers, self._num_experts), dtype=np.uint64)
        memcpy(cnp.PyArray_DATA(out), self._counts, self._num_layers * self._num_experts * sizeof(uint64_t))
        return out

    def passes_array(self):
        cdef cnp.ndarray out = np.empty(self._num_layers, dtype=np.uint64)
        memcpy(cnp.PyArray_DATA(out), self._passes, self._num_layers * sizeof(uint64_t))
        return out

    def trace_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._trace == NULL:
            return None
        return _rows_array(&self._trace[index], self._top_k)

    def predictions_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._pred == NULL:
            return None
        return _rows_array(&self._pred[index], self._top_k or self._pred_k)

    def logits_capture(self):
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def json_document(self, bytes tail):
        """The JSON document up to ``router_logits``, followed by ``tail``."""
        cdef size_t bound = 160 + len(tail)
        cdef size_t id_width = _digits(self._num_experts) + 1
        cdef Py_ssize_t layer
        cdef uint64_t e
        cdef char* buf
        cdef char* p
        cdef uint64_t* row
        for layer in range(self._num_layers):
            bound += 3 + 21 * self._num_experts
            if self._trace != NULL:
                bound += 3 + id_width * self._trace[layer].len
            if self._pred != NULL:
                bound += 3 + id_width * self._pred[layer].len
        head = ('{"num_layers":%d,"num_experts":%d,"top_k":%d,"counts":['
                % (self._num_layers, self._num_experts if self._num_layers else 0, self._top_k)).encode()
        bound += len(head)
        buf = <char*>malloc(bound)
        if buf == NULL:
            raise MemoryError()
        try:
            p = _put_text(buf, head, len(head))
            for layer in range(self._num_layers):
                if layer:
                    p[0] = 44
                    p += 1
                p[0] = 91
                p += 1
                row = self._counts + layer * self._num_experts
                for e in range(self._num_experts):
                    if e:
                        p[0] = 44
                        p += 1
                    p = _put_u64(p, row[e])
                p[0] = 93
                p += 1
            p[0] = 93
            p += 1
            if self._trace != NULL:
                p = _put_text(p, b',"trace":[', 10)
                p = _put_rows(p, self._trace, self._num_layers)
                p[0] = 93
                p += 1
            if self._pred != NULL:
                p = _put_text(p, b',"pred":[', 9)
                p = _put_rows(p, self._pred, self._num_layers)
                p[0] = 93
                p += 1
            p = _put_text(p, tail, len(tail))
            return PyBytes_FromStringAndSize(buf, p - buf)
        finally:
            free(buf)

    def _add_counts(self, counts, passes, Py_ssize_t top_k):
        """Add whole passes known by their counts only: ``counts`` (L, E) and ``passes`` (L,) int64.

        For the device path's counts-only mode; refused (ValueError) while the
        trace or the probe is on, or when a row does not sum to passes x top_k.
        Learns ``top_k`` when it was still 0 and passes were added.
        """
        cdef const int64_t[:, ::1] added
        cdef const int64_t[::1] more
        cdef Py_ssize_t layer
        cdef uint64_t e
        cdef uint64_t* row
        cdef bint any_pass = False
        if self._closed:
            raise _errors.closed()
        added_arr, more_arr = _counts.added_counts(
            counts, passes, top_k, self._num_layers, self._num_experts,
            self._top_k or self._pred_k, self._trace != NULL or self._pred != NULL)
        added = added_arr.reshape(self._num_layers, self._num_experts)
        more = more_arr
        # Validation ran Python code: another thread may have closed us meanwhile.
        if self._closed:
            raise _errors.closed()
        for layer in range(self._num_layers):
            row = self._counts + layer * self._num_experts
            for e in range(self._num_experts):
                row[e] += <uint64_t>added[layer, e]
            self._passes[layer] += <uint64_t>more[layer]
            any_pass = any_pass or more[layer] > 0
        if self._top_k == 0 and any_pass:
            self._top_k = top_k



# -- the per-call path of record and record_prediction ----------------------
# Module-level cdef functions rather than methods: direct C calls the
# compiler can inline, where a cdef method goes through the vtable.

cdef enum:
    OTHER = 0
    LIST = 1
    TUPLE = 2
    ARRAY = 3

cdef inline int _record_pass(RecorderCore self, object layer, object selected, bint prediction) except -1:
    """One pass's selection (or, with ``prediction``, the pilot's prediction) for ``layer``."""
    cdef uint32_t local[STACK_IDS]
    cdef uint32_t* dest
    cdef IdBuf* rows = self._pred if prediction else self._trace
    cdef Py_ssize_t index, n = 0
    cdef int kind
    if self._closed:
        raise _errors.closed()
    index = _layer_index(self, layer)
    kind = _kind(selected, &n)
    if kind == OTHER:
        selected = _normalize(selected)
        kind = _kind(selected, &n)
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
        return _record_slowly(self, index, selected, kind, n, prediction)
    # Python code may have run since the entry check (a layer's __index__,
    # _normalize): another thread may have closed the recorder meanwhile.
    if self._closed:
        raise _errors.closed()
    # The fast conversion counts selections as it goes (and takes its counts
    # back if it stops early): no Python code runs in it, so nobody sees them.
    if _convert_fast(self, selected, kind, n, dest,
                     NULL if prediction else self._counts + index * self._num_experts) < n:
        return _record_slowly(self, index, selected, kind, n, prediction)
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


cdef inline int _kind(object selected, Py_ssize_t* n) noexcept:
    """LIST, TUPLE or ARRAY (1-D integer, native, aligned) with its length in ``n``; else OTHER."""
    cdef int typenum
    if PyList_CheckExact(selected):
        n[0] = PyList_GET_SIZE(selected)
        return LIST
    if PyTuple_CheckExact(selected):
        n[0] = PyTuple_GET_SIZE(selected)
        return TUPLE
    if cnp.PyArray_CheckExact(selected):
        typenum = cnp.PyArray_TYPE(<cnp.ndarray>selected)
        if (cnp.PyArray_NDIM(<cnp.ndarray>selected) == 1 and cnp.PyTypeNum_ISINTEGER(typenum)
                and typenum != cnp.NPY_BOOL and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>selected)
                and cnp.PyArray_ISALIGNED(<cnp.ndarray>selected)):
            n[0] = cnp.PyArray_DIM(<cnp.ndarray>selected, 0)
            return ARRAY
    return OTHER


cdef object _normalize(object selected):
    """Any other accepted selection as a plain list or ndarray; raise as the pure-Python core does."""
    if isinstance(selected, (list, tuple)):
        return list(selected)
    if cnp.PyArray_Check(selected) or _convert.is_array_like(selected):
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
                                     uint32_t* dest, uint64_t* row) except -1:
    """Convert, and count into ``row`` unless NULL, without running Python code.

    Returns n, or fewer (having counted nothing) when some id needs the slow
    path; raises, having counted nothing, for an array with a bad id.
    """
    cdef Py_ssize_t bad
    if kind == ARRAY:
        bad = _on_array(<cnp.ndarray>selected, CONVERT if row == NULL else RECORD, n,
                        cnp.PyArray_STRIDE(<cnp.ndarray>selected, 0), dest, row, self._num_experts)
        if bad >= 0:
            _convert.array_ids(selected, self._num_experts)  # raises, naming the id
        return n
    return ts_record_ints(PySequence_Fast_ITEMS(selected), n, self._num_experts, dest, row)


cdef int _convert_slowly(RecorderCore self, object selected, int kind, Py_ssize_t n,
                         uint32_t* ids) except -1:
    """Any list or tuple of ids, some of which may run Python code (``__index__``)."""
    cdef Py_ssize_t i
    cdef PyObject* item
    cdef long long value
    if kind == ARRAY:
        return _convert_fast(self, selected, kind, n, ids, NULL)
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
        else:
            ids[i] = <uint32_t>_convert.check_id(<object>item, i, self._num_experts)
    return 0


cdef int _record_slowly(RecorderCore self, Py_ssize_t index, object selected, int kind, Py_ssize_t n,
                        bint prediction) except -1:
    """Convert into a private buffer first, then commit with a copy: safe whatever the ids run."""
    cdef uint32_t* ids = <uint32_t*>malloc(n * sizeof(uint32_t))
    if ids == NULL:
        raise MemoryError()
    try:
        _convert_slowly(self, selected, kind, n, ids)
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
    if self._trace != NULL:
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
    return 0


cdef inline int _commit_prediction(RecorderCore self, Py_ssize_t index, const uint32_t* ids,
                                   Py_ssize_t n, bint copy) except -1:
    cdef IdBuf* pred
    _recheck_k(self, n)
    if self._pred == NULL:
        return 0
    pred = &self._pred[index]
    if copy:
        memcpy(_spare(pred, n), ids, n * sizeof(uint32_t))
    pred.len += n
    _prefault(pred)
    if self._top_k == 0 and self._pred_k == 0:
        self._pred_k = n
    return 0


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
