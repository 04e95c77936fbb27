"""Compiled recorder core: the hot paths of ``turbospark.RouterHistogram``.

Behaviour is defined by ``turbospark/recording/_recorder_py.py``; this module must
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

from turbospark.recording import _convert, _counts, _errors

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
        self._trace[index].len += rows * width
        _prefault(&self._trace[index])
    self._passes[index] += rows
    self._commits += 1


cdef void _merge_counts(uint64_t* row, const uint64_t* tables, uint64_t num_experts) noexcept nogil:
    cdef uint64_t e
    cdef uint64_t width = num_experts + 1
    for e in range(num_experts):
        row[e] += tables[e] + tables[width + e] + tables[2 * width + e] + tables[3 * width + e]


include "_views.pxi"


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
    # Commits that changed the counts, and the snapshot last handed out.
    cdef uint64_t _commits
    cdef uint64_t _cached_at
    cdef object _counts_cache

    def __cinit__(self, *args, **kwargs):
        self._counts = NULL
        self._passes = NULL
        self._trace = NULL
        self._pred = NULL
        self._logits = None
        self._logits_layer = -1

    def __init__(self, num_layers, num_experts, top_k, trace, pilot, logits_layer, logits_pass):
        if self._ready:
            raise RuntimeError("a recorder core is initialised once")
        # Checked here, not trusted from the facade: these sizes index C arrays.
        num_layers, num_experts, top_k, logits_layer, logits_pass = _convert.core_arguments(
            num_layers, num_experts, top_k, pilot, logits_layer, logits_pass)
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._top_k = top_k
        self._pred_k = 0
        self._counts = <uint64_t*>calloc(max(self._num_layers * self._num_experts, 1), sizeof(uint64_t))
        self._passes = <uint64_t*>calloc(max(self._num_layers, 1), sizeof(uint64_t))
        if self._counts == NULL or self._passes == NULL:
            raise MemoryError()
        if bool(trace):
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

    def record_many(self, layer, selected, mask=None):
        _record_block(self, layer, selected, mask, False)

    def record_prediction_many(self, layer, predicted, mask=None):
        _record_block(self, layer, predicted, mask, True)

    def record_router_logits(self, layer, logits):
        cdef Py_ssize_t index, got
        if self._logits_layer < 0:
            return  # no row requested: free, as the reference's call is
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

    def _counts_snapshot(self):
        """The counts as a read-only int64 array, copied only when a pass was recorded since the last one."""
        cdef cnp.ndarray out
        if self._counts_cache is not None and self._cached_at == self._commits:
            return self._counts_cache
        # int64 like a loaded Capture's counts; no count can reach 2**63.
        out = np.empty((self._num_layers, self._num_experts), dtype=np.int64)
        memcpy(cnp.PyArray_DATA(out), self._counts, self._num_layers * self._num_experts * sizeof(uint64_t))
        out.setflags(write=False)
        self._counts_cache = out
        self._cached_at = self._commits
        return out

    def _passes_array(self):
        cdef cnp.ndarray out = np.empty(self._num_layers, dtype=np.int64)
        memcpy(cnp.PyArray_DATA(out), self._passes, self._num_layers * sizeof(uint64_t))
        return out

    def _trace_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._trace == NULL:
            return None
        return _rows_array(&self._trace[index], self._top_k)

    def _predictions_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._pred == NULL:
            return None
        return _rows_array(&self._pred[index], self._top_k or self._pred_k)

    def _logits_capture(self):
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def _json_document(self, bytes tail):
        """The JSON document up to ``router_logits``, followed by ``tail``."""
        cdef size_t bound = 160 + len(tail)
        # Room for any id a uint32 buffer can hold (10 digits and a comma),
        # not just those below num_experts: the writer never trusts that
        # every committed id was checked.
        cdef size_t id_width = 11
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
    self._commits += 1
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


# -- record_many and record_prediction_many -----------------------------------

# Blocks of at least this many ids (and at least num_experts of them) count
# through four scratch tables (see _convert_count); smaller ones count
# straight into the layer's row, so a small block costs no allocation and a
# block over a huge expert count no table to clear.
cdef Py_ssize_t TABLE_MIN_IDS = 2048


cdef int _record_block(RecorderCore self, object layer, object selected, object mask, bint prediction) except -1:
    """``n`` passes (or predictions) for ``layer`` at once, only the rows ``mask`` keeps; all or nothing."""
    cdef IdView view
    cdef Py_ssize_t index, rows, width, total, chosen, i
    cdef uint8_t* keep = NULL
    cdef uint32_t local[STACK_IDS]
    cdef uint32_t* dest = NULL
    cdef uint32_t* scratch = NULL
    cdef uint64_t* tables = NULL
    cdef uint64_t* row
    cdef IdBuf* buf = self._pred if prediction else self._trace
    cdef object held = None
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
        if mask is not None:
            keep = <uint8_t*>malloc(rows if rows else 1)
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
        if prediction:
            _commit_prediction_rows(self, index, chosen, width)
        else:
            _commit_block(self, index, chosen, width)
    finally:
        free(keep)
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
    if self._pred == NULL:
        return 0
    pred = &self._pred[index]
    pred.len += rows * width
    _prefault(pred)
    if self._top_k == 0 and self._pred_k == 0:
        self._pred_k = width
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
