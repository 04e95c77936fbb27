/* Read a small exact Python int without a function call.
 *
 * Expert ids are tiny ints, which CPython stores "compact" (one digit). This
 * reads them directly; anything else (big ints, other implementations) goes
 * through the public, slower PyLong_AsLongLongAndOverflow.
 */
#ifndef TURBOSPARK_FASTINT_H
#define TURBOSPARK_FASTINT_H
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
    if (size >= -1 && size <= 1) {
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

/* Copy leading small non-negative exact ints below ``limit`` from ``items``
 * into ``out``; return how many were copied (n when all of them were). Runs
 * no Python code, so the caller may write straight into a shared buffer. */
static inline Py_ssize_t ts_small_ints(PyObject *const *items, Py_ssize_t n,
                                       unsigned long long limit, uint32_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = items[i];
        long long value;
        if (!PyLong_CheckExact(op) || !ts_compact_int(op, &value) || value < 0
                || (unsigned long long)value >= limit) {
            return i;
        }
        out[i] = (uint32_t)value;
    }
    return n;
}

#endif
