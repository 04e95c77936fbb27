# Views of the caller's ids (an integer ndarray or a CPU tensor), and the
# kernels that read them once into the recorder's own memory.
#
# Included by _recorder.pyx. A view is a pointer, an element type and up to
# two dimensions with byte strides; a 1-D selection is one row. Every kernel
# reads each id once, validates the value it read and stores that same value:
# an error names the id as read, and the caller's memory is never read again
# (another thread, or a device copy still landing, may change it meanwhile).

from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

cdef extern from "_dlpack.h":
    ctypedef struct ts_DLDevice:
        int32_t device_type
    ctypedef struct ts_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct ts_DLTensor:
        void* data
        ts_DLDevice device
        int32_t ndim
        ts_DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct ts_DLPackVersion:
        uint32_t major
    ctypedef struct ts_DLPackExchangeAPIHeader:
        ts_DLPackVersion version
    ctypedef struct ts_DLPackExchangeAPI:
        ts_DLPackExchangeAPIHeader header
        int (*dltensor_from_py_object_no_sync)(void* py_object, ts_DLTensor* out) noexcept
    cdef int TS_DLPACK_MAJOR, TS_DL_CPU, TS_DL_INT, TS_DL_UINT, TS_DL_BOOL

cdef extern from "Python.h":
    PyObject* _type_of "(PyObject*)Py_TYPE"(object)


ctypedef struct IdView:
    const char* data
    int itemsize
    bint is_signed
    bint is_bool
    int ndim          # as the caller passed it; a 1-D view is one row
    Py_ssize_t rows
    Py_ssize_t width
    Py_ssize_t row_stride   # bytes
    Py_ssize_t stride       # bytes, between the ids of a row


cdef enum:
    # What _on_view does with the ids (see _kernel).
    CONVERT = 0        # validate and copy the rows (those a mask keeps) to out
    RECORD = 1         # one row: validate, copy and count into a count row
    CONVERT_COUNT = 2  # contiguous rows: validate, copy (unless out is NULL), count into four tables


# -- torch tensors, found without importing torch ----------------------------
# torch.Tensor's class carries a DLPack exchange table (DLPack 1.2+, torch
# 2.10+): one C call describes a tensor without creating a Python object,
# where reading data_ptr(), dtype, shape and stride() costs ~0.5 us. The
# table is looked up once per class; the last class seen is compared by
# pointer. Other tensor classes (subclasses, older torch) take the Python
# path in _convert.tensor_array.
cdef PyObject* _tensor_type = NULL
cdef ts_DLPackExchangeAPI* _tensor_api = NULL
cdef dict _tensor_tables = {}


cdef ts_DLPackExchangeAPI* _exchange_table(object kind) except? NULL:
    """The DLPack exchange table of the exact class torch.Tensor, or NULL."""
    global _tensor_type, _tensor_api
    cdef size_t found
    cdef ts_DLPackExchangeAPI* api
    address = _tensor_tables.get(kind)
    if address is None:
        found = 0
        if getattr(kind, "__module__", None) == "torch" and getattr(kind, "__name__", None) == "Tensor":
            capsule = getattr(kind, "__dlpack_c_exchange_api__", None)
            if capsule is not None and PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
                api = <ts_DLPackExchangeAPI*>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
                if api.header.version.major == TS_DLPACK_MAJOR and api.dltensor_from_py_object_no_sync != NULL:
                    found = <size_t>api
        _tensor_tables[kind] = found  # keeps the class alive for the pointer below
        address = found
    api = <ts_DLPackExchangeAPI*><size_t>address
    if api != NULL:
        _tensor_type = <PyObject*>kind
        _tensor_api = api
    return api


cdef inline bint _is_known_tensor(object obj) noexcept:
    return _type_of(obj) == _tensor_type and _tensor_type != NULL


cdef int _tensor_view(object obj, IdView* view, str what) except -1:
    """Describe a torch.Tensor (``_is_known_tensor``) in ``view``: 1, or 0 to take the Python path.

    Raises TypeError for a tensor on another device or of a non-integer,
    non-bool dtype, as the Python path would.
    """
    cdef ts_DLTensor dl
    cdef int bits
    if _tensor_api.dltensor_from_py_object_no_sync(<void*>obj, &dl) != 0:
        PyErr_Clear()  # the Python path raises its own, clearer error
        return 0
    if dl.device.device_type != TS_DL_CPU:
        raise _errors.device(what, obj.device)
    bits = dl.dtype.bits
    if dl.dtype.lanes != 1 or not (
            ((dl.dtype.code == TS_DL_INT or dl.dtype.code == TS_DL_UINT)
             and (bits == 8 or bits == 16 or bits == 32 or bits == 64))
            or (dl.dtype.code == TS_DL_BOOL and bits == 8)):
        raise _errors.dtype(str(obj.dtype).replace("torch.", ""))
    view.data = <const char*>dl.data + dl.byte_offset
    view.itemsize = bits // 8
    view.is_signed = dl.dtype.code == TS_DL_INT
    view.is_bool = dl.dtype.code == TS_DL_BOOL
    view.ndim = dl.ndim
    if dl.ndim == 1:
        view.rows = 1
        view.row_stride = 0
        view.width = <Py_ssize_t>dl.shape[0]
        view.stride = <Py_ssize_t>dl.strides[0] * view.itemsize
    elif dl.ndim == 2:
        view.rows = <Py_ssize_t>dl.shape[0]
        view.row_stride = <Py_ssize_t>dl.strides[0] * view.itemsize
        view.width = <Py_ssize_t>dl.shape[1]
        view.stride = <Py_ssize_t>dl.strides[1] * view.itemsize
    return 1


cdef inline bint _array_view(object obj, IdView* view, int ndim) noexcept:
    """Describe an exact ndarray of ``ndim`` dimensions and a native, aligned integer dtype; else 0."""
    cdef cnp.ndarray arr
    cdef int typenum
    if not cnp.PyArray_CheckExact(obj):
        return 0
    arr = <cnp.ndarray>obj
    typenum = cnp.PyArray_TYPE(arr)
    if (cnp.PyArray_NDIM(arr) != ndim or not cnp.PyTypeNum_ISINTEGER(typenum) or typenum == cnp.NPY_BOOL
            or not cnp.PyArray_ISNOTSWAPPED(arr) or not cnp.PyArray_ISALIGNED(arr)):
        return 0
    view.data = <const char*>cnp.PyArray_DATA(arr)
    view.itemsize = cnp.PyArray_ITEMSIZE(arr)
    view.is_signed = cnp.PyTypeNum_ISSIGNED(typenum)
    view.is_bool = False
    view.ndim = ndim
    if ndim == 1:
        view.rows = 1
        view.row_stride = 0
        view.width = cnp.PyArray_DIM(arr, 0)
        view.stride = cnp.PyArray_STRIDE(arr, 0)
    else:
        view.rows = cnp.PyArray_DIM(arr, 0)
        view.row_stride = cnp.PyArray_STRIDE(arr, 0)
        view.width = cnp.PyArray_DIM(arr, 1)
        view.stride = cnp.PyArray_STRIDE(arr, 1)
    return 1


cdef inline bint _fast_view(object obj, IdView* view, int ndim) except -1:
    """An integer ndarray or known tensor of ``ndim`` dimensions, described without Python code; else 0."""
    if _array_view(obj, view, ndim):
        return 1
    if _is_known_tensor(obj) and _tensor_view(obj, view, "expert ids"):
        return view.ndim == ndim and not view.is_bool
    return 0


# -- kernels -----------------------------------------------------------------

cdef Py_ssize_t _convert_rows(const int_t* first, const IdView* v, const uint8_t* keep, uint32_t* out,
                              uint64_t num_experts, uint64_t* bad) noexcept nogil:
    """Copy the ids of the rows ``keep`` selects (all when NULL) to ``out``, packed.

    Returns the caller's flat index (row * width + column) of the first
    out-of-range id, its bits in ``bad``; else -1.
    """
    cdef const char* row
    cdef int_t value
    cdef Py_ssize_t r, c
    cdef Py_ssize_t k = 0
    for r in range(v.rows):
        if keep != NULL and not keep[r]:
            continue
        row = <const char*>first + r * v.row_stride
        for c in range(v.width):
            value = (<const int_t*>(row + c * v.stride))[0]
            if value < 0 or <uint64_t>value >= num_experts:
                bad[0] = <uint64_t>value
                return r * v.width + c
            out[k] = <uint32_t>value
            k += 1
    return -1


cdef inline Py_ssize_t _kernel(const int_t* data, int op, const IdView* v, const uint8_t* keep, uint32_t* out,
                               uint64_t* counts, uint64_t num_experts, uint64_t* bad) noexcept nogil:
    if op == CONVERT:
        return _convert_rows(data, v, keep, out, num_experts, bad)
    if op == RECORD:
        return _record_strided(data, v.width, v.stride, out, counts, num_experts, bad)
    return _convert_count(data, v.rows * v.width, out, num_experts, counts, bad)


cdef int _on_view(const IdView* v, int op, const uint8_t* keep, uint32_t* out, uint64_t* counts,
                  uint64_t num_experts) except -1:
    """Run ``_kernel`` on the element type of ``v``; raise ValueError naming a bad id as it was read."""
    cdef uint64_t bad = 0
    cdef Py_ssize_t at = -1
    cdef object value
    cdef const void* data = v.data
    if v.itemsize == 8:
        if v.is_signed:
            at = _kernel(<const int64_t*>data, op, v, keep, out, counts, num_experts, &bad)
        else:
            at = _kernel(<const uint64_t*>data, op, v, keep, out, counts, num_experts, &bad)
    elif v.itemsize == 4:
        if v.is_signed:
            at = _kernel(<const int32_t*>data, op, v, keep, out, counts, num_experts, &bad)
        else:
            at = _kernel(<const uint32_t*>data, op, v, keep, out, counts, num_experts, &bad)
    elif v.itemsize == 2:
        if v.is_signed:
            at = _kernel(<const int16_t*>data, op, v, keep, out, counts, num_experts, &bad)
        else:
            at = _kernel(<const uint16_t*>data, op, v, keep, out, counts, num_experts, &bad)
    else:
        if v.is_signed:
            at = _kernel(<const int8_t*>data, op, v, keep, out, counts, num_experts, &bad)
        else:
            at = _kernel(<const uint8_t*>data, op, v, keep, out, counts, num_experts, &bad)
    if at < 0:
        return 0
    if v.is_signed:
        value = <int64_t>bad
    else:
        value = bad
    if v.ndim == 1:
        raise _errors.id_range(value, at, num_experts)
    raise _errors.id_range(value, (at // v.width, at % v.width), num_experts)


cdef inline bint _contiguous(const IdView* v) noexcept:
    return v.stride == v.itemsize and (v.rows == 1 or v.row_stride == v.width * v.itemsize)


# -- row masks -----------------------------------------------------------------

cdef Py_ssize_t _mask_copy(object mask, Py_ssize_t rows, uint8_t* keep) except -1:
    """Copy a row mask into ``keep`` (``rows`` bytes, 0 or 1); return how many rows it selects."""
    cdef IdView view
    cdef cnp.ndarray arr
    cdef Py_ssize_t r, chosen = 0
    cdef bint fast = False
    if cnp.PyArray_CheckExact(mask):
        arr = <cnp.ndarray>mask
        if (cnp.PyArray_TYPE(arr) == cnp.NPY_BOOL and cnp.PyArray_NDIM(arr) == 1
                and cnp.PyArray_DIM(arr, 0) == rows):
            view.data = <const char*>cnp.PyArray_DATA(arr)
            view.stride = cnp.PyArray_STRIDE(arr, 0)
            fast = True
    elif _is_known_tensor(mask) and _tensor_view(mask, &view, "mask values"):
        fast = view.is_bool and view.ndim == 1 and view.width == rows
    if not fast:
        arr = _convert.mask_rows(mask, rows)  # raises for a bad mask; a private contiguous copy
        view.data = <const char*>cnp.PyArray_DATA(arr)
        view.stride = 1
    for r in range(rows):
        keep[r] = (<const uint8_t*>(view.data + r * view.stride))[0] != 0
        chosen += keep[r]
    return chosen
