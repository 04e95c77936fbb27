"""Rejected calls: the exact exception, a message naming the offending value, and nothing recorded.

Order of checks (``_recorder_py`` docstring): closed recorder, layer type,
layer range, container type or dtype, shape, empty selection, length
against the known ``top_k``, then each id in position order (type, then
range). Every rejection is checked against the whole JSON before and after,
and a recorder that had not learned ``top_k`` must still not have learned it.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable

import numpy as np
import pytest

E = 4  # experts in every recorder here
BIG = 2**64 - 1


@pytest.fixture(params=["fresh", "learned"])
def hist(request: pytest.FixtureRequest, make: Callable[..., Any]) -> Any:
    """A 2-layer, 4-expert recorder with every option on: top_k unknown ("fresh") or learned as 2."""
    recorder = make(2, E, trace=True, pilot="next", router_logits=(0, 0))
    if request.param == "learned":
        recorder.record(1, [3, 1])
        recorder.record_prediction(1, [2, 1])
    return recorder


def rejected(hist: Any, exc: type, fragment: str, call: Callable[[], Any]) -> BaseException:
    """Assert ``call`` raises ``exc`` naming ``fragment`` and leaves the recorder exactly as it was."""

    def state() -> Any:
        layers = range(hist.num_layers)
        # predictions() is shaped by top_k, or by the first prediction's length
        # while top_k is unknown: a rejected call must have learned neither.
        shapes = [hist.predictions(layer).shape for layer in layers] if hist.pilot_enabled() else None
        return hist.to_json(), hist.top_k, hist.passes.tolist(), shapes

    before = state()
    with pytest.raises(exc) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    assert state() == before
    return info.value


class Fresh:
    """A one-shot iterator made anew for every test that uses it."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __repr__(self) -> str:
        return f"iter({self.items!r})"


def resolve(selected: Any) -> Any:
    return iter(selected.items) if isinstance(selected, Fresh) else selected


ONE_D_METHODS = ["record", "record_prediction"]
ALL_METHODS = ["record", "record_prediction", "record_many", "record_router_logits"]
GOOD = {
    "record": [0, 1],
    "record_prediction": [0, 1],
    "record_many": [[0, 1]],
    "record_router_logits": [0.0] * E,
}


# --- the layer -------------------------------------------------------------


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("layer", [2, 3, -1, -2, 2**63, 2**64, 2**70, -(2**70), np.int64(2), np.uint64(BIG)])
def test_a_layer_out_of_range_is_an_index_error(hist: Any, method: str, layer: Any) -> None:
    error = rejected(hist, IndexError, f"layer {int(layer)} is out of range", lambda: getattr(hist, method)(layer, GOOD[method]))
    assert str(error) == f"layer {int(layer)} is out of range for a recorder of 2 layers"


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize(
    ("layer", "shown"),
    [
        (0.0, "float 0.0"),
        (1.5, "float 1.5"),
        ("0", "str '0'"),
        (None, "NoneType None"),
        (True, "bool True"),
        (False, "bool False"),
        (np.bool_(False), "bool np.False_"),
        (np.float64(0), "float64 np.float64(0.0)"),
        ([0], "list [0]"),
        (np.array([0]), "ndarray array([0])"),
    ],
)
def test_a_non_integer_layer_is_a_type_error(hist: Any, method: str, layer: Any, shown: str) -> None:
    error = rejected(hist, TypeError, shown, lambda: getattr(hist, method)(layer, GOOD[method]))
    assert str(error) == f"layer must be an integer, got {shown}"


def test_numpy_integer_layers_are_accepted(make: Callable[..., Any]) -> None:
    hist = make(3, E, trace=True)
    for layer in (np.int8(2), np.uint64(2), np.int64(0)):
        hist.record(layer, [1])
    assert hist.to_json() == (
        '{"num_layers":3,"num_experts":4,"top_k":1,"counts":[[0,1,0,0],[0,0,0,0],[0,2,0,0]],'
        '"trace":[[1],[],[1,1]]}'
    )


def test_the_layer_is_checked_before_the_selection(hist: Any) -> None:
    rejected(hist, IndexError, "layer 7", lambda: hist.record(7, "not ids"))
    rejected(hist, TypeError, "got float 0.5", lambda: hist.record(0.5, [99]))
    rejected(hist, IndexError, "layer -1", lambda: hist.record_many(-1, None))
    rejected(hist, IndexError, "layer 2", lambda: hist.record_router_logits(2, None))


@pytest.mark.parametrize("accessor", ["trace", "predictions"])
def test_accessors_check_the_layer(hist: Any, accessor: str) -> None:
    with pytest.raises(IndexError, match="layer 2 is out of range for a recorder of 2 layers"):
        getattr(hist, accessor)(2)
    with pytest.raises(IndexError, match="layer -1 is out of range"):
        getattr(hist, accessor)(-1)
    with pytest.raises(TypeError, match="layer must be an integer, got bool True"):
        getattr(hist, accessor)(True)
    with pytest.raises(TypeError, match=r"got float 0\.0"):
        getattr(hist, accessor)(0.0)


# --- one pass's ids (record, record_prediction) ------------------------------


def _range_message(value: int, position: Any) -> str:
    return f"expert id {value} at position {position} is out of range for {E} experts"


OUT_OF_RANGE = [
    ([4, 0], 4, 0),
    ([0, -1], -1, 1),
    ((0, 4), 4, 1),
    ([2**32, 0], 2**32, 0),
    ([2**63, 0], 2**63, 0),
    ([2**64, 0], 2**64, 0),
    ([2**70, 0], 2**70, 0),
    ([-(2**70), 0], -(2**70), 0),
    ([np.uint64(BIG), 0], BIG, 0),
    ([np.int8(-1), 0], -1, 0),
    ([np.uint8(4), 0], 4, 0),
    ([5, -1], 5, 0),  # position order: the first bad id is named
    ([5, "x"], 5, 0),  # ... even when a later one has the wrong type
    (np.array([0, 4]), 4, 1),
    (np.array([5, -1]), 5, 0),
    (np.array([-1, 0], dtype=np.int8), -1, 0),
    (np.array([0, 200], dtype=np.uint8), 200, 1),
    (np.array([0, BIG], dtype=np.uint64), BIG, 1),
    (np.array([0, 2**63], dtype=np.uint64), 2**63, 1),
    (np.array([0, -(2**63)], dtype=np.int64), -(2**63), 1),
    (np.array([0, 4], dtype=">i4"), 4, 1),
    (np.arange(10)[::5] * 4 + 4, 4, 0),  # strided
    (np.array([0, 4], dtype=object), 4, 1),
    (np.array([0, 2**70], dtype=object), 2**70, 1),
    (Fresh([0, 4]), 4, 1),
    (range(3, 5), 4, 1),
    (array("q", [0, -1]), -1, 1),
    (array("Q", [BIG, 0]), BIG, 0),
    (memoryview(array("i", [0, 9])), 9, 1),
]


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(("selected", "value", "position"), OUT_OF_RANGE)
def test_an_id_out_of_range_is_a_value_error(hist: Any, method: str, selected: Any, value: int, position: int) -> None:
    selected = resolve(selected)
    error = rejected(hist, ValueError, str(value), lambda: getattr(hist, method)(0 if method == "record" else 1, selected))
    assert str(error) == _range_message(value, position)


def test_an_iterator_is_consumed_only_once(make: Callable[..., Any]) -> None:
    hist = make(1, E, trace=True)
    hist.record(0, iter([1, 2]))
    assert hist.to_json() == '{"num_layers":1,"num_experts":4,"top_k":2,"counts":[[0,1,1,0]],"trace":[[1,2]]}'


NOT_INTEGERS = [
    ([0.0, 1], "float 0.0", 0),
    ([0, 1.0], "float 1.0", 1),
    ([0, "1"], "str '1'", 1),
    ([None, 1], "NoneType None", 0),
    ([True, 1], "bool True", 0),
    ([0, False], "bool False", 1),
    ([np.bool_(True), 0], "bool np.True_", 0),
    ([np.float64(1.0), 0], "float64 np.float64(1.0)", 0),
    ([np.float32(1.0), 0], "float32 np.float32(1.0)", 0),
    ([1 + 0j, 0], "complex (1+0j)", 0),
    ([0, [1]], "list [1]", 1),
    ([[0, 1], 0], "list [0, 1]", 0),  # a nested list given to record
    (("a", 5), "str 'a'", 0),  # type before range: "a" is reached first
    (np.array([0, None], dtype=object), "NoneType None", 1),
    (np.array([0, 1.5], dtype=object), "float 1.5", 1),
    (np.array([True, 0], dtype=object), "bool True", 0),
    (Fresh([0, 0.5]), "float 0.5", 1),
]


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(("selected", "shown", "position"), NOT_INTEGERS)
def test_a_non_integer_id_is_a_type_error(hist: Any, method: str, selected: Any, shown: str, position: int) -> None:
    selected = resolve(selected)
    error = rejected(hist, TypeError, shown, lambda: getattr(hist, method)(1, selected))
    assert str(error) == f"expert ids must be integers, got {shown} at position {position}"


NON_INTEGER_ARRAYS = [
    (np.array([0.0, 1.0]), "float64"),
    (np.array([0, 1], dtype=np.float16), "float16"),
    (np.array([0, 1], dtype=np.float32), "float32"),
    (np.array([0, 1], dtype=np.complex128), "complex128"),
    (np.array([True, False]), "bool"),
    (np.array(["0", "1"]), "<U1"),
    (np.array([0, 1], dtype="m8[s]"), "timedelta64[s]"),
    (np.array([], dtype=np.float64), "float64"),  # the dtype is checked before emptiness
    (array("f", [0.0, 1.0]), "float32"),
    (array("d", [0.0, 1.0]), "float64"),
    (memoryview(array("d", [0.0, 1.0])), "float64"),
    (b"\x00\x01", "|S2"),
]


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(("selected", "dtype"), NON_INTEGER_ARRAYS)
def test_a_non_integer_array_is_a_type_error(hist: Any, method: str, selected: Any, dtype: str) -> None:
    error = rejected(hist, TypeError, dtype, lambda: getattr(hist, method)(1, selected))
    assert str(error) == f"selected expert ids must be integers, got an array of dtype {dtype}"


class FloatTensor:
    """Stands in for a CPU float tensor: only ``__array__``."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array([0.0, 1.0], dtype=np.float32)


@pytest.mark.parametrize("method", ONE_D_METHODS)
def test_an_array_like_of_floats_is_a_type_error(hist: Any, method: str) -> None:
    rejected(hist, TypeError, "dtype float32", lambda: getattr(hist, method)(1, FloatTensor()))


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(
    ("selected", "shown"),
    [
        ("01", "str '01'"),
        ("", "str ''"),
        (5, "int 5"),
        (0, "int 0"),
        (None, "NoneType None"),
        (1.5, "float 1.5"),
    ],
)
def test_a_selection_that_is_not_a_sequence_is_a_type_error(hist: Any, method: str, selected: Any, shown: str) -> None:
    error = rejected(hist, TypeError, shown, lambda: getattr(hist, method)(1, selected))
    assert str(error) == f"selected expert ids must be a sequence of ints or an integer array, got {shown}"


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(
    ("selected", "shape"),
    [
        (np.array([[0, 1]]), "(1, 2)"),
        (np.array([[0], [1]]), "(2, 1)"),
        (np.zeros((1, 1, 2), dtype=np.int64), "(1, 1, 2)"),
        (np.array(1), "()"),
        (np.int64(1), "()"),  # a numpy scalar is array-like, 0-D
        (memoryview(np.array([[0, 1]])), "(1, 2)"),
    ],
)
def test_a_selection_of_the_wrong_rank_is_a_value_error(hist: Any, method: str, selected: Any, shape: str) -> None:
    error = rejected(hist, ValueError, shape, lambda: getattr(hist, method)(1, selected))
    assert str(error) == f"selected expert ids must be 1-D, got shape {shape}"


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(
    "selected",
    [[], (), np.array([], dtype=np.int64), np.array([], dtype=np.uint8), Fresh([]), range(0), array("I"),
     np.array([], dtype=object), memoryview(b"")],
    ids=["list", "tuple", "int64", "uint8", "iter", "range", "array", "object", "memoryview"],
)
def test_an_empty_selection_is_a_value_error(hist: Any, method: str, selected: Any) -> None:
    selected = resolve(selected)
    error = rejected(hist, ValueError, "empty selection", lambda: getattr(hist, method)(1, selected))
    assert str(error) == "empty selection: a routed pass selects at least one expert"


@pytest.mark.parametrize("method", ONE_D_METHODS)
@pytest.mark.parametrize(
    ("selected", "got"),
    [([0], 1), ([0, 1, 2], 3), ((0, 1, 2, 3), 4), (np.array([0, 1, 2]), 3), (np.array([1], dtype=np.uint8), 1),
     (range(3), 3), ([9], 1), ([0, 1, 99], 3), (np.array([0, 1, -5]), 3), ([0, "x", 1.5], 3)],
)
def test_a_length_other_than_top_k_is_a_value_error(
    make: Callable[..., Any], method: str, selected: Any, got: int
) -> None:
    # Learned, or given to the constructor: either way the length is checked before the ids.
    learned = make(2, E, trace=True, pilot="next")
    learned.record(0, [3, 3])
    given = make(2, E, 2, trace=True, pilot="next")
    for hist in (learned, given):
        error = rejected(hist, ValueError, f"has {got} expert ids", lambda: getattr(hist, method)(1, selected))
        assert str(error) == f"selection has {got} expert ids but top_k is 2"


def test_a_first_prediction_fixes_the_length_before_top_k_is_known(make: Callable[..., Any]) -> None:
    hist = make(2, E, trace=True, pilot="next")
    hist.record_prediction(1, [0, 1, 2])
    assert hist.top_k == 0
    error = rejected(hist, ValueError, "has 2 expert ids", lambda: hist.record(0, [0, 1]))
    assert str(error) == "selection has 2 expert ids but top_k is 3"
    hist.record(0, [0, 1, 2])
    assert hist.top_k == 3


def test_a_prediction_with_the_probe_off_is_still_checked(make: Callable[..., Any]) -> None:
    hist = make(2, E, trace=True)
    rejected(hist, ValueError, "expert id 4 at position 0", lambda: hist.record_prediction(1, [4]))
    rejected(hist, TypeError, "got float 0.5", lambda: hist.record_prediction(1, [0.5]))
    rejected(hist, IndexError, "layer 2", lambda: hist.record_prediction(2, [0]))
    # ... and a valid one with the probe off learns nothing: top_k is still open.
    hist.record_prediction(1, [0, 1, 2])
    hist.record(0, [1])
    assert hist.to_json() == '{"num_layers":2,"num_experts":4,"top_k":1,"counts":[[0,1,0,0],[0,0,0,0]],"trace":[[1],[]]}'


@pytest.mark.parametrize("method", ONE_D_METHODS)
def test_long_selections_are_checked_too(make: Callable[..., Any], method: str) -> None:
    # More ids than the compiled core keeps on its stack: the heap path.
    hist = make(2, 100, trace=True, pilot="next")
    for n in (65, 80, 300):
        ids = [i % 100 for i in range(n)]
        ids[n - 3] = 100
        for selected in (ids, tuple(ids), np.array(ids), np.array(ids, dtype=np.uint16)[::-1][::-1]):
            error = rejected(hist, ValueError, "expert id 100", lambda: getattr(hist, method)(1, selected))
            assert str(error) == f"expert id 100 at position {n - 3} is out of range for 100 experts"
        ids[n - 3] = 2.0
        rejected(hist, TypeError, f"got float 2.0 at position {n - 3}", lambda: getattr(hist, method)(1, ids))


# --- a block of passes (record_many) -----------------------------------------


@pytest.mark.parametrize(
    ("selected", "shape"),
    [
        ([0, 1], "(2,)"),
        ((0, 1), "(2,)"),
        (np.array([0, 1]), "(2,)"),
        (np.zeros((1, 1, 2), dtype=np.int64), "(1, 1, 2)"),
        ([[[0, 1]]], "(1, 1, 2)"),
        (np.array(3), "()"),
        ([[0, 1], [2]], "(2,)"),  # ragged: numpy cannot make a rectangle of it
        ([[0], [1, 2]], "(2,)"),
        (((0, 1), (2,)), "(2,)"),
        ([[0, 1], 2], "(2,)"),
    ],
)
def test_record_many_wants_two_dimensions(hist: Any, selected: Any, shape: str) -> None:
    error = rejected(hist, ValueError, shape, lambda: hist.record_many(0, selected))
    assert str(error) == f"selected expert ids must be a 2-D (n, top_k) array, got shape {shape}"


@pytest.mark.parametrize(
    "selected",
    [np.zeros((2, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.int32), np.empty((3, 0), dtype=object)],
    ids=["2x0", "0x0", "object-3x0"],
)
def test_record_many_rejects_empty_rows(hist: Any, selected: Any) -> None:
    error = rejected(hist, ValueError, "empty selection", lambda: hist.record_many(0, selected))
    assert str(error) == "empty selection: a routed pass selects at least one expert"


@pytest.mark.parametrize(
    ("selected", "dtype"),
    [
        (np.zeros((1, 2)), "float64"),
        ([[0.0, 1]], "float64"),
        ([[True, False]], "bool"),
        (np.ones((2, 2), dtype=bool), "bool"),
        ([["0", "1"]], "<U1"),
        ([[0, "1"]], "<U21"),
        (np.zeros((1, 2), dtype=np.float32), "float32"),
    ],
)
def test_record_many_rejects_non_integer_arrays(hist: Any, selected: Any, dtype: str) -> None:
    error = rejected(hist, TypeError, dtype, lambda: hist.record_many(0, selected))
    assert str(error) == f"selected expert ids must be integers, got an array of dtype {dtype}"


@pytest.mark.parametrize(
    ("selected", "shown"),
    [("01", "str '01'"), (5, "int 5"), (None, "NoneType None"), (range(2), "range range(0, 2)"), ({0: 1}, "dict {0: 1}")],
)
def test_record_many_rejects_what_is_not_an_array(hist: Any, selected: Any, shown: str) -> None:
    error = rejected(hist, TypeError, shown, lambda: hist.record_many(0, selected))
    assert str(error) == f"selected expert ids must be a sequence of ints or an integer array, got {shown}"


def test_record_many_rejects_an_iterator_naming_it(hist: Any) -> None:
    # record takes an iterator of ids; record_many needs the whole rectangle up front.
    rejected(hist, TypeError, "got generator", lambda: hist.record_many(0, (row for row in [[0, 1]])))


@pytest.mark.parametrize(
    ("selected", "value", "position"),
    [
        ([[0, 1], [2, 4]], 4, (1, 1)),
        ([[-1, 0], [0, 0]], -1, (0, 0)),
        ([[0, 1], [5, -1]], 5, (1, 0)),  # the first bad id in row-major order
        (np.array([[0, 1], [2, 4]]), 4, (1, 1)),
        (np.asfortranarray([[0, 1], [4, 2]]), 4, (1, 0)),  # positions are logical, not memory order
        (np.array([[0, 1], [4, 2]]).T, 4, (0, 1)),
        (np.array([[0, BIG]], dtype=np.uint64), BIG, (0, 1)),
        (np.array([[0, -128]], dtype=np.int8), -128, (0, 1)),
        (np.array([[0, 4]], dtype=">u2"), 4, (0, 1)),
        ([[0, 2**64]], 2**64, (0, 1)),
        ([[0, 2**70]], 2**70, (0, 1)),
        ([[0, -(2**70)]], -(2**70), (0, 1)),
        (np.array([[0, 2**70]], dtype=object), 2**70, (0, 1)),
        ([np.array([0, 1]), np.array([9, 0])], 9, (1, 0)),
    ],
)
def test_record_many_names_the_first_id_out_of_range(hist: Any, selected: Any, value: int, position: Any) -> None:
    error = rejected(hist, ValueError, str(value), lambda: hist.record_many(0, selected))
    assert str(error) == _range_message(value, position)


@pytest.mark.parametrize(
    ("row", "value"), [([0, 2**63], 2**63), ([0, BIG], BIG), ([0, 2**63 + 5], 2**63 + 5), ([0, np.uint64(BIG)], BIG)]
)
def test_record_many_names_an_int_between_int64_and_uint64(hist: Any, row: list[Any], value: int) -> None:
    # Regression: numpy infers float64 for a list mixing such an int with a
    # small one, and record_many used to fail with TypeError "got an array of
    # dtype float64" although every id is an int; record() on the same row
    # names the id (ValueError), as record_many does for 2**64 and above.
    error = rejected(hist, ValueError, str(value), lambda: hist.record_many(0, [row]))
    assert str(error) == _range_message(value, (0, 1))


@pytest.mark.parametrize(("selected", "expected"), [([[]], "empty selection"), ([], "got shape (0,)")])
def test_record_many_of_empty_lists_is_a_value_error(hist: Any, selected: Any, expected: str) -> None:
    # Regression (same root as above): numpy makes [] and [[]] float64, and
    # record_many used to report a float dtype for a list holding no floats,
    # where record(0, []) and an empty integer array raise ValueError.
    rejected(hist, ValueError, expected, lambda: hist.record_many(0, selected))


@pytest.mark.parametrize(
    ("selected", "shown", "position"),
    [
        ([[0, None]], "NoneType None", (0, 1)),
        (np.array([[0, "x"]], dtype=object), "str 'x'", (0, 1)),
        (np.array([[0, 1], [1.5, 0]], dtype=object), "float 1.5", (1, 0)),
        (np.array([[0, True]], dtype=object), "bool True", (0, 1)),
        ([[0, 1], [None, 9]], "NoneType None", (1, 0)),  # type error reached before the bad 9
    ],
)
def test_record_many_names_the_first_non_integer(hist: Any, selected: Any, shown: str, position: Any) -> None:
    error = rejected(hist, TypeError, shown, lambda: hist.record_many(0, selected))
    assert str(error) == f"expert ids must be integers, got {shown} at position {position}"


@pytest.mark.parametrize(
    ("selected", "got"),
    [([[0, 1, 2]], 3), ([[0]], 1), (np.zeros((3, 1), dtype=np.int64), 1), (np.zeros((0, 3), dtype=np.int64), 3),
     ([[0, 1, 9]], 3)],
)
def test_record_many_checks_the_width_against_top_k(make: Callable[..., Any], selected: Any, got: int) -> None:
    hist = make(2, E, trace=True)
    hist.record(1, [0, 1])
    error = rejected(hist, ValueError, f"has {got} expert ids", lambda: hist.record_many(0, selected))
    assert str(error) == f"selection has {got} expert ids but top_k is 2"


def test_record_many_commits_nothing_when_a_late_row_is_bad(make: Callable[..., Any]) -> None:
    hist = make(2, E, trace=True, pilot="next")
    rows = np.zeros((1000, 2), dtype=np.int64)
    rows[999, 1] = 4
    error = rejected(hist, ValueError, "expert id 4", lambda: hist.record_many(0, rows))
    assert str(error) == _range_message(4, (999, 1))
    assert hist.trace(0).shape == (0, 0)


# --- the router-logit row ----------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])  # the requested row is (0, 0); layer 1 is never captured
@pytest.mark.parametrize(("logits", "got"), [([0.0] * 3, 3), ([0.0] * 5, 5), ([], 0), (np.zeros(3, dtype=np.float32), 3), ("abc", 3)])
def test_a_logit_row_of_the_wrong_length_is_always_a_value_error(hist: Any, layer: int, logits: Any, got: int) -> None:
    error = rejected(hist, ValueError, f"has {got} values", lambda: hist.record_router_logits(layer, logits))
    assert str(error) == f"a router-logit row has {got} values but num_experts is {E}"


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize(("logits", "shown"), [(5, "int 5"), (None, "NoneType None"), (1.5, "float 1.5")])
def test_a_logit_row_without_a_length_is_always_a_type_error(hist: Any, layer: int, logits: Any, shown: str) -> None:
    error = rejected(hist, TypeError, shown, lambda: hist.record_router_logits(layer, logits))
    assert str(error) == f"router logits must be numbers, got {shown}"


def test_a_logit_generator_is_a_type_error(hist: Any) -> None:
    rejected(hist, TypeError, "got generator", lambda: hist.record_router_logits(0, (x for x in [0.0] * E)))


@pytest.mark.parametrize(
    ("logits", "shown"),
    [
        (["a", "b", "c", "d"], "list ['a', 'b', 'c', 'd']"),
        ([0.0, None, 1.0, 2.0], "list [0.0, None, 1.0, 2.0]"),
        ("abcd", "str 'abcd'"),
        ([True, False, True, False], "list [True, False, True, False]"),
        ([1j, 0, 0, 0], "list [1j, 0, 0, 0]"),
        ([0, 1, 2, 2**70], f"list [0, 1, 2, {2**70}]"),
        (np.zeros(E, dtype=bool), "ndarray array([False, False, False, False])"),
        (np.array(["1"] * E), "ndarray"),
    ],
)
def test_non_numeric_logits_at_the_requested_pass_are_a_type_error(hist: Any, logits: Any, shown: str) -> None:
    error = rejected(hist, TypeError, shown, lambda: hist.record_router_logits(0, logits))
    assert str(error).startswith(f"router logits must be numbers, got {shown}")


def test_a_rejected_row_does_not_use_up_the_capture(make: Callable[..., Any]) -> None:
    hist = make(1, E, router_logits=(0, 0))
    with pytest.raises(TypeError):
        hist.record_router_logits(0, ["x"] * E)
    with pytest.raises(ValueError):
        hist.record_router_logits(0, [1.0] * (E + 1))
    hist.record_router_logits(0, [1.5, 2, -3, 0.25])
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":4,"top_k":0,"counts":[[0,0,0,0]],'
        '"router_logits":{"layer":0,"pass":0,"values":[1.5,2,-3,0.25]}}'
    )


def test_a_two_dimensional_logit_row_is_named_by_its_shape(make: Callable[..., Any]) -> None:
    # Regression: a (4, 1) array passes the len() check and used to be
    # rejected with "a router-logit row has 4 values but num_experts is 4", a
    # message that contradicts itself and does not name the wrong shape.
    hist = make(1, E, router_logits=(0, 0))
    error = rejected(hist, ValueError, "(4, 1)", lambda: hist.record_router_logits(0, np.zeros((E, 1))))
    assert str(error) == "a router-logit row must be 1-D, got shape (4, 1)"


# --- a closed recorder ---------------------------------------------------------


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("arguments", ["good", "bad"])
def test_a_closed_recorder_refuses_every_call_first(hist: Any, method: str, arguments: str) -> None:
    hist.discard()
    args = (0, GOOD[method]) if arguments == "good" else ("bad layer", "bad ids")
    error = rejected(hist, ValueError, "closed", lambda: getattr(hist, method)(*args))
    assert str(error) == "the recorder is closed; it records nothing more"


class Shrinking:
    """An id whose ``__index__`` removes the last id of the list it is in."""

    def __init__(self, owner: list[Any], value: int) -> None:
        self.owner = owner
        self.value = value

    def __index__(self) -> int:
        self.owner.pop()
        return self.value


def test_a_selection_that_shrinks_while_read_records_nothing(make: Callable[..., Any]) -> None:
    # A bug this test caught, now fixed: the length
    # is checked on the list, then the ids are read from the same live list;
    # when an id's __index__ shrinks it, the Python core records a 2-id pass
    # against top_k 3 (the trace is then no longer a whole number of passes).
    # The compiled core raises RuntimeError and records nothing.
    hist = make(1, E, 3, trace=True)
    selected: list[Any] = [0, 1, 2]
    selected[0] = Shrinking(selected, 0)
    rejected(hist, RuntimeError, "changed size", lambda: hist.record(0, selected))


def test_logits_are_not_looked_at_when_no_row_was_requested(make: Callable[..., Any]) -> None:
    # As the reference's: free when no row was requested, whatever it is given.
    hist = make(2, E, trace=True)
    for layer, logits in ((0, [0.0] * E), (7, None), ("x", "abc"), (0, np.zeros((2, 2)))):
        assert hist.record_router_logits(layer, logits) is None
    assert hist.to_json() == '{"num_layers":2,"num_experts":4,"top_k":0,"counts":[[0,0,0,0],[0,0,0,0]],"trace":[[],[]]}'


def test_a_float16_logit_row_is_captured(make: Callable[..., Any]) -> None:
    hist = make(1, E, router_logits=(0, 0))
    hist.record_router_logits(0, np.array([1.5, -2, 0.099975586, 65504], dtype=np.float16))
    assert hist.to_json().endswith('"router_logits":{"layer":0,"pass":0,"values":[1.5,-2,0.099975586,65504]}}')
