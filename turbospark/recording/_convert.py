"""Validation and conversion of user input, shared by both recorder cores.

The pure-Python core uses these for everything; the compiled core handles
lists, tuples and integer ndarrays itself and falls back to these for the
rare shapes of input (object arrays, buffers, ``__array__`` objects, ragged
nested lists, logit rows), so both cores accept and reject exactly the same
things with the same messages.
"""

from __future__ import annotations

import operator
import sys
from array import array
from typing import Any, Optional

import numpy as np

from . import _errors

_BOOLS = (bool, np.bool_)
PILOTS = (None, "next", "self")
# Layers and top_k index C arrays: keep them far from any platform's limits.
MAX_SIZE = 2**31 - 1
ONE_D = "1-D"
TWO_D = "a 2-D (n, top_k) array"


def whole(name: str, value: Any, minimum: int, maximum: Optional[int] = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; raise TypeError or ValueError naming ``name``."""
    if isinstance(value, _BOOLS):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {number}")
    return number


def core_arguments(
    num_layers: Any, num_experts: Any, top_k: Any, pilot: Any, logits_layer: Any, logits_pass: Any
) -> tuple[int, int, int, int, int]:
    """A recorder core's sizes, checked whatever calls it: (layers, experts, top_k, logits layer, logits pass).

    Raises TypeError/ValueError for a value out of range, and MemoryError when
    the count matrix (num_layers x num_experts counters of 8 bytes) cannot be
    addressed at all, so no product the core computes can overflow.
    """
    layers = whole("num_layers", num_layers, 0, MAX_SIZE)
    experts = whole("num_experts", num_experts, 1, 2**32)
    k = whole("top_k", top_k, 0, MAX_SIZE)
    if pilot not in PILOTS:
        raise ValueError(f"pilot must be None, 'next' or 'self', got {pilot!r}")
    logits_at = whole("router_logits layer", logits_layer, -1, layers - 1)
    pass_ = whole("router_logits pass", logits_pass, 0, 2**64 - 1)
    if layers * experts > sys.maxsize // 8:
        raise MemoryError(
            f"a count matrix of {layers} layers x {experts} experts does not fit in this process's address space"
        )
    return layers, experts, k, logits_at, pass_


def trace_cap(value: Any, trace: Any) -> Optional[int]:
    """A core's ``trace_cap``: None (unbounded) or the passes per layer the trace keeps, at least 1.

    Raises TypeError/ValueError for a non-integer or a value below 1, and
    ValueError when the trace is off: a cap on nothing would only hide a mistake.
    """
    if value is None:
        return None
    cap = whole("trace_cap", value, 1, 2**63 - 1)
    if not trace:
        raise ValueError(f"trace_cap={cap} needs the trace on (trace=True): it caps the trace's passes per layer")
    return cap


def check_layer(layer: Any, num_layers: int) -> int:
    """Return ``layer`` as an int in ``[0, num_layers)``; raise TypeError or IndexError."""
    if isinstance(layer, _BOOLS):
        raise _errors.layer_type(layer)
    try:
        index = operator.index(layer)
    except TypeError:
        raise _errors.layer_type(layer) from None
    if not 0 <= index < num_layers:
        raise _errors.layer_range(index, num_layers)
    return index


def check_id(value: Any, position: Any, num_experts: int) -> int:
    """Return one expert id as an int in ``[0, num_experts)``; raise TypeError or ValueError."""
    if isinstance(value, _BOOLS):
        raise _errors.id_type(value, position)
    try:
        expert = operator.index(value)
    except TypeError:
        raise _errors.id_type(value, position) from None
    if not 0 <= expert < num_experts:
        raise _errors.id_range(expert, position, num_experts)
    return expert


def is_array_like(obj: Any) -> bool:
    """True for objects numpy reads as arrays: ``__array__``, the array interface, buffers."""
    if hasattr(obj, "__array__") or hasattr(obj, "__array_interface__"):
        return True
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


_tensor_types: dict[type, bool] = {}


def is_tensor(obj: Any) -> bool:
    """True for a torch tensor (or subclass), found by its class's name: torch is never imported here."""
    kind = type(obj)
    found = _tensor_types.get(kind)
    if found is None:
        found = any(
            getattr(base, "__module__", None) == "torch" and base.__name__ == "Tensor" for base in kind.__mro__
        )
        _tensor_types[kind] = found
    return found


def tensor_array(tensor: Any, what: str = "expert ids") -> np.ndarray:
    """A CPU tensor's data as an ndarray sharing its memory; TypeError for another device or a float dtype."""
    device = tensor.device
    if device.type != "cpu":
        raise _errors.device(what, device)
    name = str(tensor.dtype).replace("torch.", "")
    if not (name == "bool" or name.startswith(("int", "uint"))):
        raise _errors.dtype(name)
    shared: np.ndarray = tensor.numpy()  # torch is not imported here: ``tensor`` is untyped
    return shared


def is_iterable_selection(obj: Any) -> bool:
    """True for iterables that are not text, which are read id by id."""
    return hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes))


def as_array(selected: Any, wanted: str) -> np.ndarray:
    """``selected`` as an integer (or object) ndarray of the wanted rank; raise TypeError or ValueError."""
    if isinstance(selected, np.ndarray):
        arr = selected
    elif is_tensor(selected):
        arr = tensor_array(selected)
    else:
        try:
            arr = np.asarray(selected)
        except ValueError:
            # Ragged nested lists: numpy cannot build a rectangle from them.
            raise _errors.ndim((len(selected),), wanted) from None
    if arr.dtype.kind == "f" and isinstance(selected, (list, tuple)):
        # numpy turns ints that fit neither int64 nor uint64 together (-1 and
        # 2**63) into float64; as Python ints they are ids to range-check.
        exact = np.empty(arr.shape, dtype=object)
        exact[...] = selected
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, _BOOLS) for v in exact.ravel().tolist()):
            arr = exact
    if arr.dtype.kind in "iu" and not isinstance(selected, np.ndarray) and _holds_bool(selected):
        # numpy reads True as 1; record() refuses a bool id, and so must a block.
        arr = np.array(selected, dtype=object)
    if arr.dtype.kind not in "iuO":
        raise _errors.dtype(str(arr.dtype))
    if arr.ndim != (1 if wanted == ONE_D else 2):
        raise _errors.ndim(arr.shape, wanted)
    return arr


def _holds_bool(selected: Any) -> bool:
    """Whether a list or tuple (of lists or tuples) holds a Python or numpy bool."""
    if not isinstance(selected, (list, tuple)):
        return False
    for item in selected:
        if isinstance(item, _BOOLS):
            return True
        if isinstance(item, (list, tuple)) and any(isinstance(value, _BOOLS) for value in item):
            return True
        if isinstance(item, np.ndarray) and item.dtype == np.bool_:
            return True
    return False


def mask_rows(mask: Any, rows: int) -> np.ndarray:
    """A private copy of a row mask as a bool ndarray of ``rows`` entries; raise TypeError or ValueError."""
    if is_tensor(mask):
        values = tensor_array(mask, "mask values")
    elif isinstance(mask, (np.ndarray, list, tuple)):
        values = np.asarray(mask)
    else:
        raise _errors.mask_type(mask)
    if values.dtype != np.bool_ and not (values.size == 0 and isinstance(mask, (list, tuple))):
        raise _errors.mask_type(mask)
    if values.ndim != 1 or values.shape[0] != rows:
        raise _errors.mask_shape(values.shape, rows)
    return np.array(values, dtype=np.bool_, copy=True)


def check_length(got: int, expected: int) -> None:
    """Raise ValueError for an empty selection, or one whose length is not the known top_k."""
    if got == 0:
        raise _errors.empty()
    if expected and got != expected:
        raise _errors.length(got, expected)


def position(shape: tuple[int, ...], flat: int, rows: Optional[list[int]] = None) -> Any:
    """The index of flat element ``flat`` as users see it: an int in 1-D, (row, column) in 2-D.

    ``rows`` maps the block's rows to the caller's (a masked block holds only some of them).
    """
    if len(shape) == 1:
        return flat
    row = flat // shape[1]
    return (row if rows is None else rows[row], flat % shape[1])


def block_ids(arr: np.ndarray, num_experts: int, mask: Any) -> np.ndarray:
    """``array_ids`` of the rows of a 2-D block that ``mask`` selects (all rows without a mask).

    A bad id is named by its row in the caller's block.
    """
    if mask is None:
        return array_ids(arr, num_experts)
    keep = np.flatnonzero(mask_rows(mask, arr.shape[0]))
    # Fancy indexing copies: the selected rows are read once, here.
    return array_ids(arr[keep], num_experts, keep.tolist())


def array_ids(arr: np.ndarray, num_experts: int, rows: Optional[list[int]] = None) -> np.ndarray:
    """Range-check an integer or object array of any shape; return its ids as C-ordered uint32.

    The caller's array is read once, into a private copy, and everything
    after (the check, the message, the result) comes from that copy: another
    thread may change the caller's array at any time.
    """
    if arr.dtype.kind == "O":
        flat_values = arr.ravel().tolist()
        for flat, value in enumerate(flat_values):
            check_id(value, position(arr.shape, flat, rows), num_experts)
        return np.array(flat_values, dtype=np.uint32).reshape(arr.shape)
    copy = np.array(arr, order="C", copy=True)
    bad = (copy < 0) | (copy >= num_experts)
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        raise _errors.id_range(int(copy.ravel()[flat]), position(copy.shape, flat, rows), num_experts)
    return copy.astype(np.uint32)


def sequence_ids(items: Any, num_experts: int) -> list[int]:
    """Check each id of a list or tuple in position order; return them as ints."""
    count = len(items)
    ids = []
    for index in range(count):
        # An id's __index__ may run code that shrinks the list being read.
        if index >= len(items):
            raise RuntimeError("the selection changed size while it was being recorded")
        ids.append(check_id(items[index], index, num_experts))
    return ids


def logit_row(logits: Any, num_experts: int) -> array[float]:
    """One router-logit row as float32 values; raise TypeError or ValueError.

    Takes numbers in any form numpy reads, and CPU tensors of any float
    dtype (bfloat16 included, which numpy cannot hold: widened by torch).
    """
    if is_tensor(logits):
        if logits.device.type != "cpu":
            raise _errors.device("router logits", logits.device)
        logits = logits.detach()  # a row that requires grad is still just numbers here
        if logits.is_floating_point() and logits.dtype.itemsize < 4:
            logits = logits.float()
    try:
        values = np.asarray(logits)
    except (TypeError, ValueError):
        raise _errors.logits_type(logits) from None
    if values.dtype.kind not in "iuf":
        raise _errors.logits_type(logits)
    if values.ndim != 1:
        raise _errors.logits_shape(values.shape)
    if values.shape[0] != num_experts:
        raise _errors.logits_length(values.shape[0], num_experts)
    with np.errstate(over="ignore"):
        return array("f", values.astype(np.float32).tobytes())


def logits_length(logits: Any) -> int:
    """``len(logits)``, or TypeError naming the value when it has no length."""
    try:
        return len(logits)
    except TypeError:
        raise _errors.logits_type(logits) from None
