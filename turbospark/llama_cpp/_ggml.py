"""The ggml declarations the capture needs, made once and checked against the loaded library.

llama-cpp-python exposes the eval callback (``cb_eval`` in the context
parameters) but neither ``struct ggml_tensor`` nor any ggml call, so the
callback's ``struct ggml_tensor *`` is an opaque address to it. This module
declares the struct as ggml.h lays it out (the ggml llama-cpp-python
0.3.36 vendors) and binds ``ggml_backend_tensor_get`` and a few checking
calls on the libggml llama-cpp-python already loaded (``llama_cpp._ggml``).

The layout is checked before any capture uses it, and refused with a message
naming the library and its version when it does not match:
- ``ggml_tensor_overhead()`` must equal ``sizeof(struct ggml_object)`` (32
  bytes on every 64-bit ABI ggml supports) plus the declared struct's size;
- ``ggml_type_name(GGML_TYPE_I32)`` and ``(GGML_TYPE_F32)`` must be "i32"
  and "f32" (the enum values the capture reads ids and logits by);
- on the first tensor the callback sees, ``ggml_get_name(t)`` must return
  the address of the declared ``name`` field and ``ggml_nbytes(t)`` the
  size the declared ``ne``/``nb`` give (``check_tensor``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from typing import Any

__all__ = ["Ggml", "GgmlTensor", "LayoutError", "ggml"]

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26
# sizeof(struct ggml_object): size_t offs, size; pointer next; enum type; char padding[4].
_OBJECT_SIZE = 32


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` from ggml.h (llama-cpp-python 0.3.36's vendored ggml)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


NAME_OFFSET = GgmlTensor.name.offset


class LayoutError(RuntimeError):
    """The loaded ggml does not lay out ``struct ggml_tensor`` as declared here."""


@dataclasses.dataclass
class Ggml:
    """The bound calls, the library they came from and its version."""

    library: str
    version: str
    tensor_get: Any  # ggml_backend_tensor_get(tensor, data, offset, size)
    nbytes: Any  # ggml_nbytes(tensor)
    get_name: Any  # ggml_get_name(tensor)
    checked_tensor: bool = False

    def check_tensor(self, address: int) -> None:
        """Check the declared field offsets on one real tensor (once); LayoutError when they are wrong."""
        if self.checked_tensor:
            return
        tensor = GgmlTensor.from_address(address)
        name_at = self.get_name(address)
        if name_at != address + NAME_OFFSET:
            raise self._mismatch(f"ggml_get_name() points {name_at - address} bytes into the tensor, "
                                 f"the declared name field is at {NAME_OFFSET}")
        span = _span(tensor)
        got = self.nbytes(address)
        if tensor.type in (GGML_TYPE_F32, GGML_TYPE_I32) and got != span:
            raise self._mismatch(f"ggml_nbytes() is {got} for a tensor whose declared ne/nb span {span} bytes")
        self.checked_tensor = True

    def _mismatch(self, what: str) -> LayoutError:
        return LayoutError(
            f"turbospark.llama_cpp cannot read this ggml's tensors ({self.library}, ggml {self.version}): {what}; "
            "the capture declares struct ggml_tensor as llama-cpp-python 0.3.36's ggml lays it out, "
            "install that version (pip install 'llama-cpp-python==0.3.36') or one with the same layout"
        )


def _span(tensor: GgmlTensor) -> int:
    """Bytes from a 4-byte-element tensor's first element to the end of its last (what ggml_nbytes gives)."""
    if any(tensor.ne[i] <= 0 for i in range(GGML_MAX_DIMS)):
        return 0
    return 4 + sum((tensor.ne[i] - 1) * tensor.nb[i] for i in range(GGML_MAX_DIMS))


@functools.lru_cache(maxsize=None)
def ggml() -> Ggml:
    """The ggml calls, bound once; ImportError without llama-cpp-python, LayoutError on a layout mismatch."""
    try:
        from llama_cpp import _ggml as loaded
    except ImportError as exc:
        raise ImportError(
            "turbospark.llama_cpp needs llama-cpp-python (pip install 'turbospark[llama-cpp]')"
        ) from exc
    lib = loaded.libggml
    library = getattr(lib, "_name", "libggml")
    version_call = lib.ggml_version
    version_call.restype = ctypes.c_char_p
    version_call.argtypes = []
    version = (version_call() or b"?").decode("ascii", "replace")
    overhead = lib.ggml_tensor_overhead
    overhead.restype = ctypes.c_size_t
    overhead.argtypes = []
    type_name = lib.ggml_type_name
    type_name.restype = ctypes.c_char_p
    type_name.argtypes = [ctypes.c_int]
    tensor_get = lib.ggml_backend_tensor_get
    tensor_get.restype = None
    tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    nbytes = lib.ggml_nbytes
    nbytes.restype = ctypes.c_size_t
    nbytes.argtypes = [ctypes.c_void_p]
    get_name = lib.ggml_get_name
    get_name.restype = ctypes.c_void_p  # the address: check_tensor compares it with the field's
    get_name.argtypes = [ctypes.c_void_p]
    bound = Ggml(library, version, tensor_get, nbytes, get_name)
    expected = _OBJECT_SIZE + ctypes.sizeof(GgmlTensor)
    if overhead() != expected:
        raise bound._mismatch(
            f"ggml_tensor_overhead() is {overhead()} bytes, the declared struct gives {expected} "
            f"({_OBJECT_SIZE} for ggml_object + {ctypes.sizeof(GgmlTensor)} for ggml_tensor)"
        )
    for code, name in ((GGML_TYPE_F32, b"f32"), (GGML_TYPE_I32, b"i32")):
        if type_name(code) != name:
            raise bound._mismatch(f"ggml type {code} is {type_name(code)!r}, expected {name!r}")
    return bound
