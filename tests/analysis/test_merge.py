"""``turbospark merge``: exact bytes, sequences kept apart, associativity, and refusals naming the files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.cli import main
from turbospark.analysis.capture import loads
from turbospark.analysis.capture_sequences import sequences

from placement_helpers import traced, write_capture

A = traced(3, 1, [[[0], [2]], [[1]]], pred=[[], [1]])
B = traced(3, 1, [[[1]], [[2], [2]]], pred=[[], [2, 0]])
C = traced(3, 1, [[[2], [2], [0]], []], pred=[[], []],
           seq=[[4, 4, 6], []], phase=[[0, 1, 1], []])


def merged(tmp_path: Path, docs: list, name: str = "m.json") -> str:
    paths = [write_capture(tmp_path / f"in{i}_{name}", doc) for i, doc in enumerate(docs)]
    out = tmp_path / name
    assert main(["merge", *paths, "-o", str(out)]) == 0
    return out.read_text()


def test_exact_bytes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    text = merged(tmp_path, [A, B, C])
    # A's passes are sequence 0, B's sequence 1; C's own ids 4 and 6 move up by 2 (the widths before it).
    assert text == (
        '{"num_layers":2,"num_experts":3,"top_k":1,"counts":[[2,1,3],[0,1,2]],'
        '"trace":[[0,2,1,2,2,0],[1,2,2]],"pred":[[],[1,2,0]],'
        '"seq":[[0,0,1,6,6,8],[0,1,1]],"phase":[[1,1,1,0,1,1],[1,1,1]]}')
    assert capfd.readouterr().out.endswith("merged 3 captures into " + str(tmp_path / "m.json") + "\n")
    capture = loads(text)
    seq, phase = sequences(capture)
    assert [row.tolist() for row in seq] == [[0, 0, 1, 6, 6, 8], [0, 1, 1]]


@pytest.mark.parametrize("seed", range(4))
def test_any_grouping_gives_the_same_bytes(tmp_path: Path, seed: int, capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(seed)
    docs = []
    for index in range(4):
        rows = [[[int(e)] for e in rng.integers(0, 4, size=rng.integers(0, 5))] for _ in range(2)]
        extra = {"pred": [[], [e for p in rows[1] for e in p]]}
        if index % 2:
            extra["seq"] = [rng.integers(0, 3, size=len(r)).tolist() for r in rows]
            extra["phase"] = [rng.integers(0, 2, size=len(r)).tolist() for r in rows]
        docs.append(traced(4, 1, rows, **extra))
    flat = merged(tmp_path, docs, "flat.json")
    for split in (1, 2, 3):
        left = docs[:split] if split > 1 else None
        right = docs[split:] if len(docs) - split > 1 else None
        parts = [json.loads(merged(tmp_path, left, f"l{split}.json"))] if left else docs[:split]
        parts += [json.loads(merged(tmp_path, right, f"r{split}.json"))] if right else docs[split:]
        assert merged(tmp_path, parts, f"g{split}.json") == flat
    nested = json.loads(merged(tmp_path, [docs[1], docs[2]], "mid.json"))
    assert merged(tmp_path, [docs[0], nested, docs[3]], "nested.json") == flat
    capfd.readouterr()


def test_counts_only_and_router_logits(tmp_path: Path) -> None:
    a = {"num_layers": 1, "num_experts": 2, "top_k": 1, "counts": [[1, 2]],
         "router_logits": {"layer": 0, "pass": 1, "values": [0.1, -2.5]}}
    b = {"num_layers": 1, "num_experts": 2, "top_k": 1, "counts": [[3, 0]],
         "router_logits": {"layer": 0, "pass": 0, "values": None}}
    assert merged(tmp_path, [a, b]) == (
        '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[4,2]],'
        '"router_logits":{"layer":0,"pass":1,"values":[0.1,-2.5]}}')


@pytest.mark.parametrize(
    "second, message",
    [
        (traced(4, 1, [[[0]], [[1]]]), "cannot merge {a} and {b}: different geometry "
         "(2 layers x 3 experts, top-1 against 2 layers x 4 experts, top-1)"),
        ({"num_layers": 2, "num_experts": 3, "top_k": 1, "counts": [[1, 0, 0], [0, 0, 0]]},
         "cannot merge {a} and {b}: {a} has trace, {b} has not"),
        (traced(3, 1, [[[0]], [[1]]]), "cannot merge {a} and {b}: {a} has predictions (pilot probe), {b} has not"),
    ],
)
def test_mismatched_captures_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str], second: dict, message: str) -> None:
    a, b = write_capture(tmp_path / "a.json", A), write_capture(tmp_path / "b.json", second)
    out = tmp_path / "m.json"
    assert main(["merge", a, b, "-o", str(out)]) == 2
    assert capfd.readouterr() == ("", "turbospark: " + message.format(a=a, b=b) + "\n")
    assert not out.exists()


def test_predictions_that_would_shift_are_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    short = traced(3, 1, [[[0]], [[1], [2]]], pred=[[], [1]])
    a, b = write_capture(tmp_path / "a.json", short), write_capture(tmp_path / "b.json", B)
    assert main(["merge", a, b, "-o", str(tmp_path / "m.json")]) == 2
    assert capfd.readouterr().err == (
        f"turbospark: cannot merge {a}: layer 1 holds 1 predictions for 2 passes, so the predictions "
        "of the files after it would not line up with their passes\n")
    # Last in line, a short prediction row shifts nothing.
    assert main(["merge", b, a, "-o", str(tmp_path / "m.json")]) == 0
    capfd.readouterr()


def test_needs_two_inputs(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.json", A)
    assert main(["merge", a, "-o", str(tmp_path / "m.json")]) == 2
    assert capfd.readouterr().err == "turbospark: merge needs at least two captures\n"
