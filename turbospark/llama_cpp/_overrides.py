"""``override_tensors``: llama.cpp's ``-ot REGEX=BUFFER`` for models llama-cpp-python loads.

``llama_model_params.tensor_buft_overrides`` is a NULL-terminated array of
``{const char * pattern; ggml_backend_buffer_type_t buft;}``; llama.cpp's
loader gives each weight tensor the buffer type of the first pattern that
``std::regex_search`` finds in its name (``src/llama-model-loader.cpp``),
and logs ``tensor NAME (... ) buffer type overridden to BUFT`` at debug
level. llama-cpp-python declares the field as an untyped pointer and has no
argument for it, so for the block this module patches
``llama_model_load_from_file`` to pass a copy of the parameters with the
array set (and the loader's log lines collected, ``overridden``).
Buffer-type names are resolved as ``common/arg.cpp`` does: each device's
default buffer type, by ``ggml_backend_buft_name`` ("CPU", "CUDA0", ...).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from typing import Any, Iterator, Sequence

__all__ = ["OverrideLoad", "override_tensors"]

_OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class OverrideLoad:
    """What ``override_tensors`` yields: the loader's override decisions, as llama.cpp logged them."""

    def __init__(self) -> None:
        self.overridden: dict[str, str] = {}  # tensor name -> buffer type name, per the loader's log
        self.log: list[str] = []


def buffer_types() -> dict[str, int]:
    """Each device's default buffer type by name ("CPU", ...), as llama.cpp's ``-ot`` parser lists them."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    found = {}
    for index in range(lib.ggml_backend_dev_count()):
        buft = lib.ggml_backend_dev_buffer_type(lib.ggml_backend_dev_get(index))
        if buft:
            found[lib.ggml_backend_buft_name(buft).decode()] = buft
    return found


@contextlib.contextmanager
def override_tensors(overrides: Sequence[tuple[str, str]]) -> Iterator[OverrideLoad]:
    """Load every llama-cpp-python model in the block with llama.cpp's tensor buffer-type overrides.

    Takes ``(regex, buffer_type)`` pairs, in ``-ot`` order (``"CPU"`` or a
    device buffer type such as ``"CUDA0"``); e.g. the pairs
    ``turbospark llama-plan`` prints. Yields an ``OverrideLoad`` whose
    ``overridden`` maps each tensor the loader overrode to the buffer type
    it logged (the loader's own decision, read from its log). Raises
    ``ValueError`` for a regex Python cannot compile or an unknown buffer
    type (naming the available ones), ``ImportError`` without
    llama-cpp-python. The log callback llama-cpp-python installed is put
    back on exit.
    """
    import llama_cpp
    import llama_cpp._logger as logger

    low = llama_cpp.llama_cpp
    if not overrides:
        raise ValueError("override_tensors needs at least one (regex, buffer_type) pair")
    available = buffer_types()
    for pattern, buft in overrides:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"override regex {pattern!r} does not compile: {exc}") from None
        if buft not in available:
            raise ValueError(f"unknown buffer type {buft!r} for {pattern!r}; available: {', '.join(sorted(available))}")
    keep = [pattern.encode() for pattern, _ in overrides]
    array = (_Override * (len(overrides) + 1))()
    for slot, (pattern, buft) in zip(array, zip(keep, (b for _, b in overrides))):
        slot.pattern, slot.buft = pattern, available[buft]
    result = OverrideLoad()

    def on_log(level: int, text: bytes, user_data: Any) -> None:
        line = text.decode("utf-8", "replace")
        result.log.append(line)
        match = _OVERRIDDEN.search(line)
        if match:
            result.overridden[match.group(1)] = match.group(2)
        logger.llama_log_callback(level, text, user_data)  # llama-cpp-python's own printing, unchanged

    callback = low.llama_log_callback(on_log)
    load = low.llama_model_load_from_file

    def llama_model_load_from_file(path: Any, params: Any) -> Any:
        own = type(params).from_buffer_copy(params)
        own.tensor_buft_overrides = ctypes.addressof(array)
        return load(path, own)

    low.llama_log_set(callback, ctypes.c_void_p(0))
    low.llama_model_load_from_file = llama_model_load_from_file
    try:
        yield result
    finally:
        low.llama_model_load_from_file = load
        low.llama_log_set(logger.llama_log_callback, ctypes.c_void_p(0))
        del keep, array, callback
