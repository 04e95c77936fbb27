"""``turbospark merge``: exact bytes, sequences kept apart, associativity, and refusals naming the files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turbospark.cli import main
from turbospark.capture.reader import loads
from turbospark.capture.sequences import sequences

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


def assert_groupings_agree(tmp_path: Path, docs: list) -> str:
    """Merge four ``docs`` flat and in every split and nesting; asserts the bytes agree, returns them."""
    flat = merged(tmp_path, docs, "flat.json")
    for split in (1, 2, 3):
        left = docs[:split] if split > 1 else None
        right = docs[split:] if len(docs) - split > 1 else None
        parts = [json.loads(merged(tmp_path, left, f"l{split}.json"))] if left else docs[:split]
        parts += [json.loads(merged(tmp_path, right, f"r{split}.json"))] if right else docs[split:]
        assert merged(tmp_path, parts, f"g{split}.json") == flat
    nested = json.loads(merged(tmp_path, [docs[1], docs[2]], "mid.json"))
    assert merged(tmp_path, [docs[0], nested, docs[3]], "nested.json") == flat
    return flat


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
    assert_groupings_agree(tmp_path, docs)
    capfd.readouterr()


def counts_only(counts: list, seq: list | None = None, phase: list | None = None) -> dict:
    """A one-layer, top-1 counts-only capture document, with sequence tags when given."""
    doc = {"num_layers": 1, "num_experts": 2, "top_k": 1, "counts": [counts]}
    if seq is not None:
        doc.update(seq=[seq], phase=[phase])
    return doc


def test_counts_only_with_and_without_seq_associate(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # The case: merge(A, merge(B, C)) once tagged B's and C's passes as one sequence.
    tagged = counts_only([1, 1], [5, 5], [0, 1])
    docs = [tagged, counts_only([2, 0]), counts_only([0, 1]), counts_only([1, 0], [0], [1])]
    # One input has no sequence tags, so no grouping carries any.
    assert assert_groupings_agree(tmp_path, docs) == '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[4,2]]}'
    assert merged(tmp_path, [docs[0], json.loads(merged(tmp_path, docs[1:3], "bc.json"))], "abc.json") == \
        merged(tmp_path, docs[:3], "flat3.json") == '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[3,2]]}'
    a, b = write_capture(tmp_path / "a.json", tagged), write_capture(tmp_path / "b.json", docs[1])
    capfd.readouterr()
    assert main(["merge", a, b, "-o", str(tmp_path / "ab.json")]) == 0
    assert capfd.readouterr() == (
        f"merged 2 captures into {tmp_path / 'ab.json'}\n",
        f"turbospark: note: {b} hold no sequence tags (seq/phase), so the merged counts-only capture carries none\n")


def test_counts_only_all_tagged_keep_their_sequences(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    docs = [counts_only([1, 1], [5, 5], [0, 1]), counts_only([2, 0], [0, 1], [1, 1]),
            counts_only([0, 0], [], []), counts_only([1, 0], [3], [1])]
    # Widths 6, 2, 0, 4: offsets 0, 6, 8, 8.
    assert assert_groupings_agree(tmp_path, docs) == (
        '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[4,1]],"seq":[[5,5,6,7,11]],"phase":[[0,1,1,1,1]]}')
    capfd.readouterr()


def requests(*entries: tuple[str, int, int, int]) -> list[dict]:
    """A vLLM-style ``requests`` map: (request, attempt, start, prompt) per sequence id, in order."""
    return [{"seq": i, "request": r, "attempt": a, "start": s, "prompt": p} for i, (r, a, s, p) in enumerate(entries)]


# Rank 0 maps 3 sequence ids but its passes reach only id 1 (a request its last write had no passes of yet):
# its width is its map's 3, not 2, so rank 1's ids start at 3 and every merged id keeps its own entry.
RANK0 = traced(3, 1, [[[0], [2], [1]], [[1]]], seq=[[0, 1, 1], [0]], phase=[[0, 0, 1], [1]],
               requests=requests(("0-aaaaaaaa", 0, 0, 1), ("1-bbbbbbbb", 0, 0, 2), ("2-cccccccc", 0, 32, 40)))
RANK1 = traced(3, 1, [[[2]], [[0], [0]]], seq=[[1], [0, 1]], phase=[[1], [0, 0]],
               requests=requests(("0-dddddddd", 0, 0, 5), ("0-dddddddd", 1, 3, 5)))


def test_requests_maps_are_kept_and_shifted_by_their_length(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    text = merged(tmp_path, [RANK0, RANK1])
    assert text == (
        '{"num_layers":2,"num_experts":3,"top_k":1,"counts":[[1,1,2],[2,1,0]],"trace":[[0,2,1,2],[1,0,0]],'
        '"seq":[[0,1,1,4],[0,3,4]],"phase":[[0,0,1,1],[1,0,0]],'
        '"requests":[{"seq":0,"request":"0-aaaaaaaa","attempt":0,"start":0,"prompt":1},'
        '{"seq":1,"request":"1-bbbbbbbb","attempt":0,"start":0,"prompt":2},'
        '{"seq":2,"request":"2-cccccccc","attempt":0,"start":32,"prompt":40},'
        '{"seq":3,"request":"0-dddddddd","attempt":0,"start":0,"prompt":5},'
        '{"seq":4,"request":"0-dddddddd","attempt":1,"start":3,"prompt":5}]}')
    capture = loads(text)
    assert [r.request for r in capture.requests] == ["0-aaaaaaaa", "1-bbbbbbbb", "2-cccccccc", "0-dddddddd",
                                                     "0-dddddddd"]
    # Every grouping agrees, the map included (a merged map's length is the sum of its inputs').
    third = traced(3, 1, [[], [[2]]], seq=[[], [0]], phase=[[], [1]], requests=requests(("9-eeeeeeee", 0, 0, 1)))
    fourth = dict(RANK0, requests=requests(("0-aaaaaaaa", 0, 0, 1), ("1-bbbbbbbb", 0, 0, 2), ("x", 0, 0, 0),
                                           ("y", 1, 2, 3), ("z", 0, 0, 0)))
    flat = loads(assert_groupings_agree(tmp_path, [RANK0, RANK1, third, fourth]))
    assert [r.request for r in flat.requests][5:] == ["9-eeeeeeee", "0-aaaaaaaa", "1-bbbbbbbb", "x", "y", "z"]
    # The last file's ids moved up by 3 + 2 + 1.
    assert flat.seq[0].tolist() == [0, 1, 1, 4, 6, 7, 7]
    capfd.readouterr()


def test_counts_only_requests_maps_and_an_idle_rank(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    busy = dict(counts_only([1, 1], [0, 1], [0, 1]), requests=requests(("a-00000000", 0, 0, 1), ("b-00000000", 0, 0, 1)))
    # An idle rank writes no passes and no seq/phase, and an empty map: it takes no ids and keeps the tags.
    idle = dict(counts_only([0, 0]), requests=[])
    assert assert_groupings_agree(tmp_path, [busy, idle, busy, idle]) == (
        '{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[2,2]],"seq":[[0,1,2,3]],"phase":[[0,1,0,1]],'
        '"requests":[{"seq":0,"request":"a-00000000","attempt":0,"start":0,"prompt":1},'
        '{"seq":1,"request":"b-00000000","attempt":0,"start":0,"prompt":1},'
        '{"seq":2,"request":"a-00000000","attempt":0,"start":0,"prompt":1},'
        '{"seq":3,"request":"b-00000000","attempt":0,"start":0,"prompt":1}]}')
    capfd.readouterr()


@pytest.mark.parametrize(("second", "message"), [
    (traced(3, 1, [[[2]], []], seq=[[0], []], phase=[[1], []]),
     "cannot merge {0} and {1}: {0} has a requests map (the vLLM plugin's), {1} has not"),
    (dict(counts_only([1, 0]), num_experts=3, num_layers=2, counts=[[1, 0, 0], [0, 0, 0]], trace=[[0], []],
          requests=requests(("q", 0, 0, 1))),
     "cannot merge {1}: it has a requests map but its passes carry no seq tags, so the map describes none of them"),
])
def test_requests_maps_that_cannot_merge_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str], second: dict,
                                                 message: str) -> None:
    paths = [write_capture(tmp_path / f"r{i}.json", doc) for i, doc in enumerate([RANK0, second])]
    assert main(["merge", *paths, "-o", str(tmp_path / "m.json")]) == 2
    assert capfd.readouterr().err == "turbospark: " + message.format(*paths) + "\n"
    assert not (tmp_path / "m.json").exists()


def test_pilot_distance_is_kept(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    a = traced(3, 1, [[[0]], [], [[1]]], pred=[[], [], [2]], pilot_distance=[0, 0, 2])
    b = traced(3, 1, [[[2]], [], [[1]]], pred=[[], [], [1]], pilot_distance=[0, 0, 2])
    assert merged(tmp_path, [a, b]) == (
        '{"num_layers":3,"num_experts":3,"top_k":1,"counts":[[1,0,1],[0,0,0],[0,2,0]],'
        '"trace":[[0,2],[],[1,1]],"pred":[[],[],[2,1]],"seq":[[0,1],[],[0,1]],"phase":[[1,1],[],[1,1]],'
        '"pilot_distance":[0,0,2]}')
    assert loads(merged(tmp_path, [a, b])).pilot_distance == (0, 0, 2)
    capfd.readouterr()


@pytest.mark.parametrize("other, shown", [
    ([0, 0, 3], "[0,0,3]"),
    (None, "none: every prediction one layer ahead"),
])
def test_different_pilot_distances_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                          other: list | None, shown: str) -> None:
    a = traced(3, 1, [[[0]], [], [[1]]], pred=[[], [], [2]], pilot_distance=[0, 0, 2])
    b = traced(3, 1, [[[2]], [], [[1]]], pred=[[], [], [1]])
    if other is not None:
        b["pilot_distance"] = other
    pa, pb = write_capture(tmp_path / "a.json", a), write_capture(tmp_path / "b.json", b)
    out = tmp_path / "m.json"
    assert main(["merge", pa, pb, "-o", str(out)]) == 2
    assert capfd.readouterr() == (
        "", f"turbospark: cannot merge {pa} and {pb}: different pilot_distance ([0,0,2] against {shown})\n")
    assert not out.exists()


def test_sequence_ids_beyond_int64_are_refused_before_writing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    top = 2**63 - 1
    # Ids up to int64's largest load, and merge while the shifted ids still fit.
    a = counts_only([1, 1], [0, 1], [1, 1])
    b = counts_only([1, 0], [top - 2], [1])
    assert merged(tmp_path, [a, b]) == (
        f'{{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[2,1]],"seq":[[0,1,{top}]],"phase":[[1,1,1]]}}')
    assert loads(merged(tmp_path, [a, b])).seq[0].tolist() == [0, 1, top]
    c = counts_only([0, 1], [top - 1], [0])
    pa, pc = write_capture(tmp_path / "a.json", a), write_capture(tmp_path / "c.json", c)
    out = tmp_path / "over.json"
    capfd.readouterr()
    assert main(["merge", pa, pc, "-o", str(out)]) == 2
    assert capfd.readouterr() == ("", (
        f"turbospark: cannot merge {pc}: its sequence id {top - 1} shifted by 2 (the widths of the captures "
        f"before it) is {top + 1}, beyond the largest id a capture holds ({top}); merge fewer captures, "
        "or captures with smaller sequence ids\n"))
    assert not out.exists()


def test_counts_beyond_int64_are_refused_before_writing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    top = 2**63 - 1
    pa = write_capture(tmp_path / "a.json", counts_only([top - 1, 0]))
    pb = write_capture(tmp_path / "b.json", counts_only([2, 0]))
    out = tmp_path / "m.json"
    assert main(["merge", pa, pb, "-o", str(out)]) == 2
    assert capfd.readouterr() == ("", f"turbospark: cannot merge {pb}: layer 0, expert 0 would count {top + 1}, "
                                      f"beyond int64 ({top})\n")
    assert not out.exists()


def test_counts_only_tags_that_would_not_line_up_are_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Each input holds one selection of a top-2 pass, 0 whole passes; summed they make one pass with no tag.
    half = {"num_layers": 1, "num_experts": 2, "top_k": 2, "counts": [[1, 0]], "seq": [[]], "phase": [[]]}
    pa, pb = write_capture(tmp_path / "a.json", half), write_capture(tmp_path / "b.json", half)
    assert main(["merge", pa, pb, "-o", str(tmp_path / "m.json")]) == 2
    assert capfd.readouterr() == ("", "turbospark: cannot merge: layer 0 holds 2 selections in all, 1 passes of "
                                      "top_k=2, but the inputs tag 0: some input's selections are not whole passes, "
                                      "so the merged seq would not line up with its passes\n")
    assert not (tmp_path / "m.json").exists()


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
