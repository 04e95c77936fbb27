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

from turbospark.recording import _convert, _counts, _errors, _sequences

cnp.import_array()
ts_init_small_ints()

cdef extern from "_internals.h":
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
# never comes close, so the heap is only touched by unusual callers. A new
# id buffer starts with room for FIRST_CAPACITY ids.
cdef enum:
    STACK_IDS = 64
    FIRST_CAPACITY = 256


# The module is one compilation unit split by concern; each include is
# textual, in this order.
include "_buffers.pxi"
include "_tags.pxi"
include "_kernels.pxi"
include "_views.pxi"
include "_json.pxi"
include "_core.pxi"
include "_record_one.pxi"
include "_record_block.pxi"
include "_record_tagged.pxi"
