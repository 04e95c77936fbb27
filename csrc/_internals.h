/* The compiled core's reliance on CPython internals and the OS, in one place.
 *
 * Everything here is a shortcut with a general fallback; none changes a
 * result, only how fast one is reached:
 *  - ts_compact_int: reads a one-digit ("compact") int without a call. Saves
 *    a PyLong_AsLongLongAndOverflow call per id. Relies on the
 *    PyUnstable_Long_* API (3.12+) or on ob_digit/Py_SIZE (3.9-3.11); PyPy
 *    and the limited API take the public call.
 *  - ts_init_small_ints / ts_record_ints: ids 0..256 known by address, since
 *    CPython keeps those ints as singletons in one array. Saves the type,
 *    size and digit loads per id. Relies on that layout, which is checked
 *    element by element at import; the shortcut stays off if it does not hold.
 *  - ts_prefault: madvise(MADV_POPULATE_WRITE) a window ahead of a trace's
 *    writer. Saves one page fault per 4 KiB page (costlier than the recording
 *    on a VM). Relies on Linux 5.14+; elsewhere it reports -1 and the caller
 *    stops asking.
 */
/* Read a small exact Python int without a function call.
 *
 * Expert ids are tiny ints, which CPython stores "compact" (one digit). This
 * reads them directly; anything else (big ints, other implementations) goes
 * through the public, slower PyLong_AsLongLongAndOverflow.
 */
#ifndef TURBOSPARK_INTERNALS_H
#define TURBOSPARK_INTERNALS_H
#include <Python.h>
#include <stdint.h>

#if defined(PYPY_VERSION) || defined(Py_LIMITED_API)
static inline int ts_compact_int(PyObject *op, long long *value) {
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(op, &overflow);
    return overflow == 0;
}
#elif PY_VERSION_HEX >= 0x030C0000
static inline int ts_compact_int(PyObject *op, long long *value) {
    if (PyUnstable_Long_IsCompact((PyLongObject *)op)) {
        *value = (long long)PyUnstable_Long_CompactValue((PyLongObject *)op);
        return 1;
    }
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(op, &overflow);
    return overflow == 0;
}
#else
static inline int ts_compact_int(PyObject *op, long long *value) {
    Py_ssize_t size = Py_SIZE(op);
    if ((size_t)(size + 1) <= 2) {  /* size is -1, 0 or 1: one digit at most */
        *value = (long long)size * (long long)((PyLongObject *)op)->ob_digit[0];
        return 1;
    }
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(op, &overflow);
    return overflow == 0;
}
#endif

/* Fault in [from, to) bytes of a buffer ahead of its writer, in one call.
 * A trace is written front to back into fresh memory; with one page fault per
 * 4 KiB page, the faults cost more than the recording itself on a virtual
 * machine. Populating a window ahead of the write pointer trades one system
 * call for many faults, at the price of at most one window of resident
 * memory not yet written. Returns 0, or -1 when the kernel lacks the call
 * (the caller then stops asking). */
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
static inline int ts_prefault(void *base, size_t from, size_t to) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    static uintptr_t page = 0;
    if (page == 0) {
        long size = sysconf(_SC_PAGESIZE);
        page = size > 0 ? (uintptr_t)size : 4096;
    }
    uintptr_t start = ((uintptr_t)base + from) & ~(page - 1);
    uintptr_t end = ((uintptr_t)base + to) & ~(page - 1);
    if (end <= start) {
        return 0;
    }
    return madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0 ? 0 : -1;
#else
    (void)base;
    (void)from;
    (void)to;
    return -1;
#endif
}

/* A small non-negative exact int below ``limit`` as an index, else -1. */
static inline Py_ssize_t ts_small_index(PyObject *op, Py_ssize_t limit) {
    long long value;
    if (PyLong_CheckExact(op) && ts_compact_int(op, &value) && value >= 0 && value < (long long)limit) {
        return (Py_ssize_t)value;
    }
    return -1;
}

/* CPython keeps the ints 0..256 as singletons laid out in one array. An id
 * that is one of them is known by its address alone: no type, size or digit
 * to load. ts_init_small_ints() checks that layout at import time, element by
 * element, and leaves the shortcut off if it does not hold (another
 * implementation, a future CPython); everything else takes the general path. */
static const char *ts_small_base = NULL;
static uintptr_t ts_small_span = 0;
static unsigned ts_small_shift = 0;

static inline int ts_init_small_ints(void) {
    PyObject *zero = PyLong_FromLong(0);
    PyObject *one = PyLong_FromLong(1);
    if (zero == NULL || one == NULL) {
        Py_XDECREF(zero);
        Py_XDECREF(one);
        return -1;
    }
    intptr_t stride = (char *)one - (char *)zero;
    Py_DECREF(zero);
    Py_DECREF(one);
    unsigned shift = 0;
    while (shift < 16 && ((intptr_t)1 << shift) < stride) {
        shift++;
    }
    if (stride <= 0 || ((intptr_t)1 << shift) != stride) {
        return 0;
    }
    const char *base = (const char *)zero;
    for (long k = 0; k <= 256; k++) {
        PyObject *value = PyLong_FromLong(k);
        if (value == NULL) {
            return -1;
        }
        int same = (const char *)value == base + k * stride;
        Py_DECREF(value);
        if (!same) {
            return 0;
        }
    }
    ts_small_base = base;
    ts_small_shift = shift;
    ts_small_span = (uintptr_t)257 << shift;
    return 0;
}

/* Validate, store and count leading ids of ``items``: each a small
 * non-negative exact int below ``limit``, copied to ``out`` and counted in
 * ``row`` (unless NULL). Returns n when all were; otherwise takes back the
 * counts it added and returns the position of the first id that needs the
 * general path. Runs no Python code, so ``out`` may be a shared buffer's
 * spare room. */
static inline Py_ssize_t ts_record_ints_into(PyObject *const *items, Py_ssize_t n, unsigned long long limit,
                                             uint32_t *out, uint64_t *row, const int counting) {
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        PyObject *op = items[i];
        uintptr_t offset = (uintptr_t)((const char *)op - ts_small_base);
        unsigned long long value;
        if (offset < ts_small_span) {
            value = offset >> ts_small_shift;
        } else {
            long long general;
            if (!PyLong_CheckExact(op) || !ts_compact_int(op, &general) || general < 0) {
                break;
            }
            value = (unsigned long long)general;
        }
        if (value >= limit) {
            break;
        }
        out[i] = (uint32_t)value;
        if (counting) {
            row[value]++;
        }
    }
    if (counting && i < n) {
        for (Py_ssize_t j = 0; j < i; j++) {
            row[out[j]]--;
        }
    }
    return i;
}

/* Two copies of the loop, with and without counting (a constant the compiler
 * folds), rather than a branch per id. */
static inline Py_ssize_t ts_record_ints(PyObject *const *items, Py_ssize_t n, unsigned long long limit,
                                        uint32_t *out, uint64_t *row) {
    if (row != NULL) {
        return ts_record_ints_into(items, n, limit, out, row, 1);
    }
    return ts_record_ints_into(items, n, limit, out, NULL, 0);
}

#endif
