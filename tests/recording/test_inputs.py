"""Accepted forms of input: each records exactly what the equivalent plain list records.

Both sides are compared as whole JSON documents with the trace and the pilot
probe on, so counts, pass order, the learned top_k and the predictions all
have to agree.
"""

from __future__ import annotations

import collections
import enum
from array import array
from typing import Any, Callable, Iterable

import numpy as np
import pytest
from conftest import require_module

E = 8
IDS = [3, 0, 7]
ROWS = [[3, 0, 7], [1, 1, 2]]
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
INT_ALIASES = ["byte", "ubyte", "short", "ushort", "intc", "uintc", "int_", "uint", "longlong", "ulonglong",
               "intp", "uintp"]


class Fresh:
    """A one-shot input (iterator, generator) made anew for each test."""

    def __init__(self, factory: Callable[[], Any], label: str) -> None:
        self.factory = factory
        self.label = label

    def __repr__(self) -> str:
        return self.label


def resolve(value: Any) -> Any:
    return value.factory() if isinstance(value, Fresh) else value


class ArrayOnly:
    """Stands in for a CPU torch tensor: numpy can read it only through ``__array__``."""

    def __init__(self, data: Any, dtype: Any = np.int64) -> None:
        self._data = np.array(data, dtype=dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._data if dtype is None else self._data.astype(dtype)


class TensorLike(ArrayOnly):
    """A closer stand-in for a tensor: ``__array__`` plus ``__len__``, which logit rows need."""

    def __len__(self) -> int:
        return len(self._data)


class OldStyleArray:
    """An ``__array__`` that predates numpy 2's ``copy`` keyword."""

    def __init__(self, data: Any) -> None:
        self._data = np.array(data)

    def __array__(self) -> np.ndarray:
        return self._data


class InterfaceOnly:
    """Exposes its memory through ``__array_interface__`` alone."""

    def __init__(self, data: Any, dtype: str = "<u2") -> None:
        self._keep = np.array(data, dtype=dtype)
        self.__array_interface__ = self._keep.__array_interface__


class Index:
    """An integer-like object: ``operator.index`` works on it."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class Expert(enum.IntEnum):
    ZERO = 0
    THREE = 3
    SEVEN = 7


class SubArray(np.ndarray):
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class TupleSub(tuple):  # type: ignore[type-arg]
    pass


def unaligned(values: list[int], dtype: str) -> np.ndarray:
    """A 1-D array of ``dtype`` whose data starts one byte off alignment."""
    raw = np.array(values, dtype=dtype)
    buffer = bytearray(raw.nbytes + 1)
    buffer[1:] = raw.tobytes()
    arr = np.frombuffer(buffer, dtype=dtype, offset=1)
    assert arr.itemsize == 1 or not arr.flags.aligned
    return arr


def read_only(values: list[int]) -> np.ndarray:
    arr = np.array(values)
    arr.flags.writeable = False
    return arr


ONE_D_FORMS: list[Any] = [
    tuple(IDS),
    ListSub(IDS),
    TupleSub(IDS),
    *[pytest.param([getattr(np, name)(v) for v in IDS], id=f"scalars-{name}") for name in INT_DTYPES + INT_ALIASES],
    pytest.param([np.int8(3), 0, np.uint64(7)], id="mixed-scalars"),
    pytest.param([Index(3), Index(0), Index(7)], id="__index__"),
    pytest.param([Expert.THREE, Expert.ZERO, Expert.SEVEN], id="IntEnum"),
    *[pytest.param(np.array(IDS, dtype=name), id=f"array-{name}") for name in INT_DTYPES + INT_ALIASES],
    *[pytest.param(np.array(IDS, dtype=name), id=f"swapped-{name}") for name in [">i2", ">i4", ">i8", ">u2", ">u4", ">u8"]],
    pytest.param(np.array([3, 9, 0, 9, 7, 9])[::2], id="strided"),
    pytest.param(np.array([7, 0, 3], dtype=np.int16)[::-1], id="reversed"),
    pytest.param(np.array([[3, 1], [0, 1], [7, 1]], dtype=np.uint32)[:, 0], id="column"),
    pytest.param(np.asfortranarray([[3, 0, 7], [1, 1, 1]], dtype=np.int8)[0], id="fortran-row"),
    pytest.param(np.array([3, 5, 0, 5, 7], dtype=">u8")[::2], id="strided-swapped"),
    # Unaligned native-order arrays (regression): the compiled core's
    # _plain_integer_array used np.ascontiguousarray, which does not realign,
    # so record() raised "empty selection" where the pure-Python core records them.
    pytest.param(unaligned(IDS, "<i4"), id="unaligned-i4"),
    pytest.param(unaligned(IDS, "<u8"), id="unaligned-u8"),
    pytest.param(unaligned(IDS, ">i2"), id="unaligned-swapped-i2"),
    pytest.param(read_only(IDS), id="read-only"),
    pytest.param(np.array(IDS).view(SubArray), id="ndarray-subclass"),
    pytest.param(np.array(IDS, dtype=object), id="object-array"),
    pytest.param(np.array([np.int64(3), np.uint8(0), 7], dtype=object), id="object-array-scalars"),
    *[pytest.param(array(code, IDS), id=f"array.array-{code}") for code in "bBhHiIlLqQ"],
    pytest.param(memoryview(array("I", IDS)), id="memoryview-I"),
    pytest.param(memoryview(np.array(IDS, dtype=np.int16)), id="memoryview-ndarray"),
    pytest.param(memoryview(bytes(IDS)), id="memoryview-bytes"),
    pytest.param(memoryview(array("q", [3, 1, 0, 1, 7]))[::2], id="memoryview-strided"),
    pytest.param(bytearray(IDS), id="bytearray"),
    pytest.param(ArrayOnly(IDS), id="__array__"),
    pytest.param(ArrayOnly(IDS, np.uint8), id="__array__-uint8"),
    pytest.param(OldStyleArray(IDS), id="__array__-no-copy-keyword"),
    pytest.param(InterfaceOnly(IDS), id="__array_interface__"),
    pytest.param(Fresh(lambda: (x for x in IDS), "generator"), id="generator"),
    pytest.param(Fresh(lambda: iter(IDS), "iter"), id="iterator"),
    pytest.param(Fresh(lambda: map(int, "307"), "map"), id="map"),
    pytest.param(Fresh(lambda: reversed([7, 0, 3]), "reversed"), id="reversed-list"),
    pytest.param(collections.deque(IDS), id="deque"),
]


def pair(make: Callable[..., Any], **options: Any) -> tuple[Any, Any]:
    """Two identically configured recorders: one fed plain lists, one fed the form under test."""
    settings = dict(trace=True, pilot="next")
    settings.update(options)
    return make(2, E, name="expected.json", **settings), make(2, E, name="actual.json", **settings)


@pytest.mark.parametrize("form", ONE_D_FORMS)
def test_record_accepts(make: Callable[..., Any], form: Any) -> None:
    expected, actual = pair(make)
    expected.record(1, IDS)
    actual.record(1, resolve(form))
    assert actual.to_json() == expected.to_json() == (
        '{"num_layers":2,"num_experts":8,"top_k":3,"counts":[[0,0,0,0,0,0,0,0],[1,0,0,1,0,0,0,1]],'
        '"trace":[[],[3,0,7]],"pred":[[],[]]}'
    )
    # The form is also accepted once top_k is known.
    expected.record(0, IDS)
    actual.record(0, resolve(form))
    assert actual.to_json() == expected.to_json()


@pytest.mark.parametrize("form", ONE_D_FORMS)
def test_record_prediction_accepts(make: Callable[..., Any], form: Any) -> None:
    expected, actual = pair(make)
    for hist, ids in ((expected, IDS), (actual, resolve(form))):
        hist.record_prediction(1, ids)
        hist.record(0, [1, 2, 3])
    assert actual.to_json() == expected.to_json() == (
        '{"num_layers":2,"num_experts":8,"top_k":3,"counts":[[0,1,1,1,0,0,0,0],[0,0,0,0,0,0,0,0]],'
        '"trace":[[1,2,3],[]],"pred":[[],[3,0,7]]}'
    )
    assert actual.predictions(1).tolist() == [IDS]


def test_range_is_read_as_its_ids(make: Callable[..., Any]) -> None:
    expected, actual = pair(make)
    expected.record(0, [2, 3, 4, 5])
    actual.record(0, range(2, 6))
    expected.record_prediction(1, [7, 6, 5, 4])
    actual.record_prediction(1, range(7, 3, -1))
    assert actual.to_json() == expected.to_json()


def test_mutating_the_input_afterwards_changes_nothing(make: Callable[..., Any]) -> None:
    hist = make(1, E, trace=True)
    ids = np.array(IDS)
    listed = list(IDS)
    hist.record(0, ids)
    hist.record(0, listed)
    ids[:] = 1
    listed[:] = [1, 1, 1]
    assert hist.trace(0).tolist() == [IDS, IDS]


def test_a_real_cpu_tensor(make: Callable[..., Any]) -> None:
    torch = require_module("torch")
    rows = torch.tensor(ROWS, dtype=torch.int64)
    hist = make(2, E, trace=True)
    hist.record(0, torch.tensor(IDS, dtype=torch.int32))
    hist.record(0, torch.tensor([3, 9, 0, 9, 7])[::2])  # a strided view
    hist.record_many(1, rows)
    hist.record_many(1, rows.t().contiguous().t())  # a column-major view
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":8,"top_k":3,"counts":[[2,0,0,2,0,0,0,2],[2,4,2,2,0,0,0,2]],'
        '"trace":[[3,0,7,3,0,7],[3,0,7,1,1,2,3,0,7,1,1,2]]}'
    )


# --- more ids than the compiled core keeps on its stack ------------------------


def model_json(num_layers: int, num_experts: int, passes: Iterable[tuple[int, list[int]]]) -> str:
    """The reference's JSON for plain ``record`` calls with the trace on (a tiny independent model)."""
    counts = [[0] * num_experts for _ in range(num_layers)]
    trace: list[list[int]] = [[] for _ in range(num_layers)]
    top_k = 0
    for layer, ids in passes:
        for expert in ids:
            counts[layer][expert] += 1
        top_k = top_k or len(ids)
        trace[layer].extend(ids)

    def rows(table: list[list[int]]) -> str:
        return ",".join("[" + ",".join(map(str, row)) + "]" for row in table)

    return (
        f'{{"num_layers":{num_layers},"num_experts":{num_experts},"top_k":{top_k},'
        f'"counts":[{rows(counts)}],"trace":[{rows(trace)}]}}'
    )


LONG_FORMS = {
    "list": list,
    "tuple": tuple,
    "int64": lambda ids: np.array(ids, dtype=np.int64),
    "uint16": lambda ids: np.array(ids, dtype=np.uint16),
    "strided": lambda ids: np.repeat(np.array(ids, dtype=np.int32), 2)[::2],
    "swapped": lambda ids: np.array(ids, dtype=">u4"),
    "object": lambda ids: np.array(ids, dtype=object),
    "array.array": lambda ids: array("H", ids),
    "generator": lambda ids: (i for i in ids),
    "scalars": lambda ids: [np.uint32(i) for i in ids],
}


@pytest.mark.parametrize("form", sorted(LONG_FORMS))
@pytest.mark.parametrize("n", [64, 65, 100, 1000])
def test_long_selections(make: Callable[..., Any], form: str, n: int) -> None:
    experts = 300
    ids = [(i * 37) % experts for i in range(n)]
    hist = make(2, experts, trace=True)
    convert = LONG_FORMS[form]
    hist.record(1, convert(ids))
    hist.record(1, convert(ids[::-1]))
    assert hist.to_json() == model_json(2, experts, [(1, ids), (1, ids[::-1])])
    assert hist.top_k == n
    assert hist.trace(1).tolist() == [ids, ids[::-1]]


@pytest.mark.parametrize("form", sorted(LONG_FORMS))
def test_long_predictions(make: Callable[..., Any], form: str) -> None:
    ids = list(range(199, -1, -1))
    hist = make(2, 200, trace=True, pilot="self")
    hist.record_prediction(1, LONG_FORMS[form](ids))
    assert hist.predictions(1).tolist() == [ids]
    assert hist.to_json().endswith(',"trace":[[],[]],"pred":[[],[' + ",".join(map(str, ids)) + "]]}")


# --- record_many -------------------------------------------------------------


def fortran(rows: list[list[int]], dtype: Any = np.int64) -> np.ndarray:
    arr = np.asfortranarray(np.array(rows, dtype=dtype))
    assert arr.flags.f_contiguous and not arr.flags.c_contiguous
    return arr


def unaligned_2d(rows: list[list[int]], dtype: str) -> np.ndarray:
    flat = unaligned([v for row in rows for v in row], dtype)
    return flat.reshape(len(rows), len(rows[0]))


TWO_D_FORMS: list[Any] = [
    pytest.param([tuple(row) for row in ROWS], id="list-of-tuples"),
    pytest.param(tuple(tuple(row) for row in ROWS), id="tuple-of-tuples"),
    pytest.param([np.array(row, dtype=np.uint8) for row in ROWS], id="list-of-arrays"),
    pytest.param([[np.int16(v) for v in row] for row in ROWS], id="list-of-scalars"),
    pytest.param([array("I", row) for row in ROWS], id="list-of-array.array"),
    *[pytest.param(np.array(ROWS, dtype=name), id=f"array-{name}") for name in INT_DTYPES],
    *[pytest.param(np.array(ROWS, dtype=name), id=f"swapped-{name}") for name in [">i2", ">i4", ">u8"]],
    *[pytest.param(fortran(ROWS, name), id=f"fortran-{name}") for name in ["int8", "uint32", "int64", ">i4"]],
    pytest.param(np.array([[3, 1], [0, 1], [7, 2]]).T, id="transposed"),
    pytest.param(np.array([[3, 9, 0, 9, 7], [9, 9, 9, 9, 9], [1, 9, 1, 9, 2]])[::2, ::2], id="strided"),
    pytest.param(np.array([[7, 0, 3], [2, 1, 1]], dtype=np.uint16)[:, ::-1], id="reversed-columns"),
    pytest.param(unaligned_2d(ROWS, "<i4"), id="unaligned"),
    pytest.param(unaligned_2d(ROWS, ">u8"), id="unaligned-swapped"),
    pytest.param(np.array(ROWS, dtype=object), id="object"),
    pytest.param(np.array(ROWS).view(SubArray), id="ndarray-subclass"),
    pytest.param(ArrayOnly(ROWS), id="__array__"),
    pytest.param(OldStyleArray(ROWS), id="__array__-no-copy-keyword"),
    pytest.param(InterfaceOnly(ROWS, "<i8"), id="__array_interface__"),
    pytest.param(memoryview(np.array(ROWS, dtype=np.int32)), id="memoryview"),
]


@pytest.mark.parametrize("form", TWO_D_FORMS)
def test_record_many_accepts(make: Callable[..., Any], form: Any) -> None:
    expected, actual = pair(make)
    expected.record_many(0, ROWS)
    actual.record_many(0, form)
    assert actual.to_json() == expected.to_json() == (
        '{"num_layers":2,"num_experts":8,"top_k":3,"counts":[[1,2,1,1,0,0,0,1],[0,0,0,0,0,0,0,0]],'
        '"trace":[[3,0,7,1,1,2],[]],"pred":[[],[]]}'
    )
    expected.record_many(1, ROWS)
    actual.record_many(1, form)
    assert actual.to_json() == expected.to_json()


# --- router-logit rows -------------------------------------------------------

LOGITS = [0.5, -1.25, 3.0, 2.0, 0.0, -0.0, 1024.0, 0.125]


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(tuple(LOGITS), id="tuple"),
        pytest.param(np.array(LOGITS, dtype=np.float64), id="float64"),
        pytest.param(np.array(LOGITS, dtype=np.float32), id="float32"),
        pytest.param(np.array(LOGITS, dtype=np.float16), id="float16"),
        pytest.param(np.array(LOGITS, dtype=">f4"), id="swapped-float32"),
        pytest.param(np.repeat(LOGITS, 2)[::2], id="strided"),
        pytest.param([np.float32(v) for v in LOGITS], id="float32-scalars"),
        pytest.param(array("f", LOGITS), id="array.array-f"),
        pytest.param(array("d", LOGITS), id="array.array-d"),
        pytest.param(memoryview(array("f", LOGITS)), id="memoryview"),
        pytest.param(TensorLike(LOGITS, np.float32), id="__array__-and-__len__"),
    ],
)
def test_router_logits_accepts(make: Callable[..., Any], form: Any) -> None:
    expected = make(1, E, router_logits=(0, 0), name="expected.json")
    actual = make(1, E, router_logits=(0, 0), name="actual.json")
    expected.record_router_logits(0, LOGITS)
    actual.record_router_logits(0, form)
    assert actual.to_json() == expected.to_json()
    assert expected.to_json().endswith('"values":[0.5,-1.25,3,2,0,-0,1024,0.125]}}')


def test_integer_logits_are_numbers(make: Callable[..., Any]) -> None:
    hist = make(1, 4, router_logits=(0, 0))
    hist.record_router_logits(0, np.array([1, -2, 3, 2**24 + 1], dtype=np.int64))
    # 2**24 + 1 is not an f32; it rounds to 2**24 as the reference's f32 would.
    assert hist.to_json().endswith('"values":[1,-2,3,16777216]}}')


@pytest.mark.parametrize(
    "kind", [np.byte, np.ubyte, np.short, np.ushort, np.intc, np.uintc, np.int_, np.uint, np.longlong, np.ulonglong]
)
def test_lists_of_numpy_integer_scalars_of_every_type(make: Any, kind: Any) -> None:
    # list(arr) gives numpy scalars; the compiled core reads them in place.
    hist = make(1, 128, trace=True)
    hist.record(0, [kind(v) for v in (127, 0, 5)])
    with pytest.raises(ValueError) as info:
        hist.record(0, [kind(1), kind(2), kind(-1 if np.dtype(kind).kind == "i" else 128)])
    shown = -1 if np.dtype(kind).kind == "i" else 128
    assert str(info.value) == f"expert id {shown} at position 2 is out of range for 128 experts"
    assert hist.trace(0).tolist() == [[127, 0, 5]]
    assert hist.counts[0].sum() == 3
