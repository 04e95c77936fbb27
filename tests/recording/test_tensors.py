"""CPU torch tensors and row masks as recorder input: read in place, same results and messages as ndarrays.

Runs on each core (compiled, pure Python, the package's choice). Without
torch these tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import require_module

torch = require_module("torch")

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
BLOCK = [[3, 1], [0, 2], [5, 4], [2, 2]]


def _twin(cls: Any, tmp_path: Any, name: str, **options: Any) -> Any:
    return cls(str(tmp_path / name), 2, 6, trace=True, pilot="next", **options)


def _fail(call: Any) -> tuple[str, str]:
    with pytest.raises((TypeError, ValueError, IndexError)) as info:
        call()
    return type(info.value).__name__, str(info.value)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_every_integer_dtype_records_as_an_ndarray_does(cls: Any, tmp_path: Any, dtype: str) -> None:
    ours, ref = _twin(cls, tmp_path, "t.json"), _twin(cls, tmp_path, "a.json")
    block = np.array(BLOCK, dtype=dtype)
    tensor = torch.from_numpy(block.copy())
    try:
        ours.record(0, tensor[0])
        ref.record(0, block[0])
        ours.record_many(0, tensor)
        ref.record_many(0, block)
        ours.record_prediction(1, tensor[1])
        ref.record_prediction(1, block[1])
        ours.record_prediction_many(1, tensor)
        ref.record_prediction_many(1, block)
        assert ours.to_json() == ref.to_json() == (
            '{"num_layers":2,"num_experts":6,"top_k":2,"counts":[[1,2,3,2,1,1],[0,0,0,0,0,0]],'
            '"trace":[[3,1,3,1,0,2,5,4,2,2],[]],"pred":[[],[0,2,3,1,0,2,5,4,2,2]]}'
        )
    finally:
        ours.discard()
        ref.discard()


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(24).reshape(4, 6)[:, ::3] % 6,           # strided columns
        lambda: (torch.arange(8).reshape(2, 4) % 6).t(),              # transposed
        lambda: (torch.arange(40).reshape(5, 8) % 6)[1:, 2:4],       # offset view
        lambda: torch.tensor([[1, 2]]).expand(3, 2),                  # zero row stride
    ],
)
def test_any_strides_are_read_in_place(cls: Any, tmp_path: Any, make: Any) -> None:
    tensor = make()
    ours, ref = _twin(cls, tmp_path, "t.json"), _twin(cls, tmp_path, "a.json")
    try:
        ours.record_many(0, tensor)
        ref.record_many(0, tensor.contiguous().numpy().tolist())
        ours.record(1, tensor[-1])
        ref.record(1, tensor[-1].tolist())
        assert ours.to_json() == ref.to_json()
        assert ours.trace(0).tolist() == tensor.tolist()
    finally:
        ours.discard()
        ref.discard()


@pytest.mark.parametrize(
    ("tensor", "ndarray"),
    [
        (lambda: torch.tensor([1, 9]), lambda: np.array([1, 9])),
        (lambda: torch.tensor([1, -1], dtype=torch.int8), lambda: np.array([1, -1], dtype=np.int8)),
        (lambda: torch.tensor([1.0, 2.0]), lambda: np.array([1.0, 2.0], dtype=np.float32)),
        (lambda: torch.tensor([True, False]), lambda: np.array([True, False])),
        (lambda: torch.tensor([[1, 2]]), lambda: np.array([[1, 2]])),
        (lambda: torch.tensor(3), lambda: np.array(3)),
        (lambda: torch.tensor([], dtype=torch.int64), lambda: np.array([], dtype=np.int64)),
    ],
)
def test_bad_tensors_get_the_ndarray_message(cls: Any, tmp_path: Any, tensor: Any, ndarray: Any) -> None:
    hist = _twin(cls, tmp_path, "t.json")
    try:
        assert _fail(lambda: hist.record(0, tensor())) == _fail(lambda: hist.record(0, ndarray()))
        assert hist.to_json() == '{"num_layers":2,"num_experts":6,"top_k":0,"counts":[[0,0,0,0,0,0],[0,0,0,0,0,0]],"trace":[[],[]],"pred":[[],[]]}'
    finally:
        hist.discard()


def test_bad_id_in_a_tensor_block_is_named_by_row_and_column(cls: Any, tmp_path: Any) -> None:
    hist = _twin(cls, tmp_path, "t.json")
    try:
        assert _fail(lambda: hist.record_many(0, torch.tensor([[1, 2], [3, 6]]).t())) == (
            "ValueError",
            "expert id 6 at position (1, 1) is out of range for 6 experts",
        )
        assert _fail(lambda: hist.record_prediction_many(1, torch.tensor([[1, 2], [-3, 0]], dtype=torch.int16))) == (
            "ValueError",
            "expert id -3 at position (1, 0) is out of range for 6 experts",
        )
        assert int(hist.passes.sum()) == 0 and hist.predictions(1).shape == (0, 0)
    finally:
        hist.discard()


@pytest.mark.parametrize("call", ["record", "record_prediction", "record_many", "record_prediction_many"])
def test_a_tensor_on_another_device_points_to_the_device_path(cls: Any, tmp_path: Any, call: str) -> None:
    ids = torch.tensor([[1, 2]] if call.endswith("many") else [1, 2], device="meta")
    hist = _twin(cls, tmp_path, "t.json")
    try:
        assert _fail(lambda: getattr(hist, call)(1, ids)) == (
            "TypeError",
            "expert ids are a tensor on device meta, and the recorder reads host memory: record device "
            "tensors through turbospark.torch, which stages them without a host sync (or pass a CPU copy)",
        )
    finally:
        hist.discard()


def test_tensor_subclasses_are_read_too(cls: Any, tmp_path: Any) -> None:
    class Routed(torch.Tensor):
        pass

    hist = _twin(cls, tmp_path, "t.json")
    try:
        hist.record(0, torch.tensor([4, 5]).as_subclass(Routed))
        hist.record_many(0, torch.tensor([[0, 1]]).as_subclass(Routed))
        assert hist.trace(0).tolist() == [[4, 5], [0, 1]]
    finally:
        hist.discard()


# -- masks ---------------------------------------------------------------------

MASKS = [
    lambda rows: np.array(rows),
    lambda rows: torch.tensor(rows),
    lambda rows: np.repeat(np.array(rows), 2)[::2],  # strided
    list,
]


@pytest.mark.parametrize("make_mask", MASKS)
@pytest.mark.parametrize("block_of", [np.array, torch.tensor, lambda b: np.array(b, dtype=object)])
def test_a_mask_records_only_the_rows_it_keeps(cls: Any, tmp_path: Any, make_mask: Any, block_of: Any) -> None:
    padded = [[3, 1], [-1, -1], [5, 4], [-1, 99]]
    keep = [True, False, True, False]
    ours, ref = _twin(cls, tmp_path, "m.json"), _twin(cls, tmp_path, "r.json")
    try:
        ours.record_many(0, block_of(padded), mask=make_mask(keep))
        ours.record_prediction_many(1, block_of(padded), mask=make_mask(keep))
        ref.record_many(0, [[3, 1], [5, 4]])
        ref.record_prediction_many(1, [[3, 1], [5, 4]])
        assert ours.to_json() == ref.to_json()
        assert ours.trace(0).tolist() == [[3, 1], [5, 4]]
    finally:
        ours.discard()
        ref.discard()


def test_a_mask_keeping_a_padded_row_is_refused_whole(cls: Any, tmp_path: Any) -> None:
    hist = _twin(cls, tmp_path, "m.json")
    try:
        block = np.array([[3, 1], [-1, -1], [5, 4]])
        assert _fail(lambda: hist.record_many(0, block, mask=np.array([True, True, False]))) == (
            "ValueError",
            "expert id -1 at position (1, 0) is out of range for 6 experts",
        )
        assert _fail(lambda: hist.record_many(0, block, mask=np.array([True, False]))) == (
            "ValueError",
            "mask must be 1-D with one entry per row (3), got shape (2,)",
        )
        assert _fail(lambda: hist.record_many(0, block, mask=np.array([1, 0, 1]))) == (
            "TypeError",
            "mask must be a 1-D boolean array or CPU bool tensor, got ndarray array([1, 0, 1])",
        )
        assert _fail(lambda: hist.record_many(0, block, mask="yes")) == (
            "TypeError",
            "mask must be a 1-D boolean array or CPU bool tensor, got str 'yes'",
        )
        assert _fail(lambda: hist.record_many(0, block, mask=torch.tensor([True, False, True], device="meta")))[1] == (
            "mask values are a tensor on device meta, and the recorder reads host memory: record device "
            "tensors through turbospark.torch, which stages them without a host sync (or pass a CPU copy)"
        )
        assert int(hist.passes.sum()) == 0 and hist.top_k == 0
        hist.record_many(0, block, mask=np.zeros(3, dtype=bool))  # nothing kept: nothing recorded
        assert int(hist.passes.sum()) == 0 and hist.top_k == 0
    finally:
        hist.discard()


def test_random_masked_blocks_equal_their_filtered_copies(cls: Any, tmp_path: Any) -> None:
    rng = np.random.default_rng(7)
    ours = cls(str(tmp_path / "m.json"), 3, 70, 4, trace=True, pilot="self")
    ref = cls(str(tmp_path / "r.json"), 3, 70, 4, trace=True, pilot="self")
    try:
        for step in range(60):
            rows = int(rng.integers(0, 40))
            block = rng.integers(0, 70, size=(rows, 4)).astype(rng.choice(["int16", "uint32", "int64"]))
            keep = rng.random(rows) < 0.6
            block[~keep] = 0 if block.dtype.kind == "u" else -1
            layer = step % 3
            source = torch.from_numpy(block.astype(np.int64)) if step % 2 else block
            ours.record_many(layer, source, mask=torch.from_numpy(keep) if step % 4 == 1 else keep)
            ours.record_prediction_many(layer, source, mask=keep)
            ref.record_many(layer, block[keep])
            ref.record_prediction_many(layer, block[keep])
        assert ours.to_json() == ref.to_json()
    finally:
        ours.discard()
        ref.discard()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_a_logit_row_tensor_of_any_float_dtype_is_captured(cls: Any, tmp_path: Any, dtype: str) -> None:
    hist = cls(str(tmp_path / "l.json"), 1, 4, router_logits=(0, 0))
    try:
        row = torch.tensor([1.5, -2.0, 0.25, 3.0], dtype=getattr(torch, dtype), requires_grad=True)
        hist.record_router_logits(0, row)
        assert hist.to_json().endswith('"router_logits":{"layer":0,"pass":0,"values":[1.5,-2,0.25,3]}}')
    finally:
        hist.discard()


def test_a_logit_row_on_another_device_points_to_the_device_path(cls: Any, tmp_path: Any) -> None:
    hist = cls(str(tmp_path / "l.json"), 1, 4, router_logits=(0, 0))
    try:
        assert _fail(lambda: hist.record_router_logits(0, torch.zeros(4, device="meta"))) == (
            "TypeError",
            "router logits are a tensor on device meta, and the recorder reads host memory: record device "
            "tensors through turbospark.torch, which stages them without a host sync (or pass a CPU copy)",
        )
    finally:
        hist.discard()
