"""Engine steps in a transformers capture: one step per forward call of the model (docs/transformers.md).

``generate`` makes one prompt forward (or one per chunk of ``prefill_chunk_size``, tested with the
chunked prefill in test_transformers.py) and one forward per later token; a plain forward call is one
step. Calls inside the model's own forward are not steps of their own, and a forward that raised
leaves the next one a step.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import require_module

torch = require_module("torch")
require_module("transformers")

import turbospark  # noqa: E402
from turbospark.transformers import capture  # noqa: E402

from hf_models import ARCHITECTURES, build  # noqa: E402

NAMES = sorted(ARCHITECTURES)
PROMPT = torch.tensor([[1, 5, 9, 13, 7, 22]])
LENGTHS = [6, 3, 5, 2]


def _left_padded() -> tuple[Any, Any]:
    width = max(LENGTHS)
    generator = torch.Generator().manual_seed(7)
    ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        ids[row, width - n:] = torch.randint(3, 64, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids, mask


def _per_layer(name: str, steps: list[int]) -> list[list[int]]:
    routed = ARCHITECTURES[name][3]
    return [steps if layer in routed else [0] * len(steps) for layer in range(3)]


@pytest.mark.parametrize("name", NAMES)
def test_generate_marks_one_prefill_step_then_one_step_per_decode_forward(name: str, tmp_path: Any) -> None:
    model = build(name)
    ids, mask = _left_padded()
    path = tmp_path / "c.json"
    new = 5
    forwards = []
    counter = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    with capture(model, path, trace=True) as rec:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False)
        generated = len(forwards)
        # Teacher-forced over the whole output, no mask: one forward, every one of its 4 x 11 rows.
        model(out)
    counter.remove()
    assert out.shape == (4, 6 + new) and generated == new  # the prompt forward and 4 decode forwards
    cap = turbospark.load(path)
    # Step 0 is the prompt forward's real tokens (sum of the prompt lengths: padding is not recorded),
    # each decode step the batch of 4 (nothing finishes before max_new_tokens: min_new_tokens).
    assert cap.step_passes.tolist() == _per_layer(name, [sum(LENGTHS)] + [4] * (new - 1) + [4 * (6 + new)])
    assert cap.step_passes.sum(axis=1).tolist() == rec.passes.tolist()


def test_a_plain_forward_is_one_step_and_the_parquet_export_carries_it(tmp_path: Any) -> None:
    pq = require_module("pyarrow.parquet")
    from turbospark.outputs.parquet import export_parquet

    model = build("qwen3_moe")  # layer 1 dense: a zero in every step
    ids, mask = _left_padded()
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
            model(PROMPT)
    cap = turbospark.load(path)
    assert cap.step_passes.tolist() == [[16, 6], [0, 0], [16, 6]]
    export_parquet([(str(path), cap)], str(tmp_path / "out"))
    table = pq.ParquetFile(tmp_path / "out" / "rank=0" / "layer=2" / "part-0.parquet").read()
    assert table.column("step").to_pylist() == [0] * 16 + [1] * 6
    assert table.column("seq").to_pylist() == [0] * 6 + [1] * 3 + [2] * 5 + [3] * 2 + [4] * 6


def test_a_call_that_routes_no_token_is_no_step(tmp_path: Any) -> None:
    model = build("mixtral")
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        with torch.no_grad():
            model(input_ids=PROMPT[:, :2], attention_mask=torch.zeros(1, 2, dtype=torch.long))  # all padding
            model(PROMPT)
    assert turbospark.load(path).step_passes.tolist() == [[6]] * 3


def test_the_model_called_inside_its_own_forward_is_one_step(tmp_path: Any) -> None:
    model = build("mixtral")
    path = tmp_path / "c.json"
    forward = type(model).forward
    entered = []

    def nested(*args: Any, **kwargs: Any) -> Any:
        if not entered:
            entered.append(1)
            model(PROMPT)  # a forward call of the model inside its own forward
        return forward(model, *args, **kwargs)

    with capture(model, path, trace=True):
        with torch.no_grad():
            model.forward = nested
            model(PROMPT)
            del model.forward
            model(PROMPT[:, :4])
    assert entered and turbospark.load(path).step_passes.tolist() == [[12, 4]] * 3


def test_a_forward_that_raised_leaves_the_next_call_a_step(tmp_path: Any) -> None:
    model = build("olmoe")
    path = tmp_path / "c.json"
    with capture(model, path, trace=True):
        with torch.no_grad():
            with pytest.raises(IndexError):
                model(torch.tensor([[1, 5, 999]]))  # outside the 64-token vocabulary: the embedding raises
            model(PROMPT)
    assert turbospark.load(path).step_passes.tolist() == [[6]] * 3


def test_the_device_path_marks_the_same_steps(tmp_path: Any, monkeypatch: Any) -> None:
    """The DeviceRecorder route (forced on the CPU), counts-only and staged: each step's rows reach the
    recorder before its mark."""
    from turbospark.transformers import _sink

    monkeypatch.setattr(_sink, "uses_device_path", lambda device: True)
    model = build("granitemoe")
    ids, mask = _left_padded()
    for trace in (False, True):
        path = tmp_path / f"{trace}.json"
        with capture(model, path, trace=trace):
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert turbospark.load(path).step_passes.tolist() == [[16, 4, 4]] * 3
