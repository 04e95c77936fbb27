/* The parts of DLPack (https://github.com/dmlc/dlpack, Apache-2.0) that the
 * recorder reads: a DLTensor, and the "__dlpack_c_exchange_api__" function
 * table (DLPack 1.2+) through which a framework such as torch (2.10 and
 * later) fills a DLTensor describing one of its tensors in a C call, without
 * creating any Python object. Layouts copied from dlpack.h 1.3; only the
 * major version must match for them to hold. */
#ifndef TURBOSPARK_DLPACK_H
#define TURBOSPARK_DLPACK_H
#include <stdint.h>

#define TS_DLPACK_MAJOR 1
#define TS_DL_CPU 1
#define TS_DL_INT 0
#define TS_DL_UINT 1
#define TS_DL_BOOL 6

typedef struct { uint32_t major; uint32_t minor; } ts_DLPackVersion;
typedef struct { int32_t device_type; int32_t device_id; } ts_DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } ts_DLDataType;

typedef struct {
    void *data;
    ts_DLDevice device;
    int32_t ndim;
    ts_DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} ts_DLTensor;

typedef struct ts_DLPackExchangeAPIHeader {
    ts_DLPackVersion version;
    struct ts_DLPackExchangeAPIHeader *prev_api;
} ts_DLPackExchangeAPIHeader;

typedef struct {
    ts_DLPackExchangeAPIHeader header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, ts_DLTensor *out);
    void *current_work_stream;
} ts_DLPackExchangeAPI;

#endif
