"""The routed-experts export (outputs/replay.py, docs/replay.md): exact layouts by hand, dtype rules,
the exact round trip to each layer's trace and seq, the file's checks, and the docs' worked example."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.outputs.replay import (
    FORMAT, RoutedExperts, id_dtype, load_routed_experts, routed_experts, save_routed_experts, to_bytes,
)
from turbospark.cli import main

from placement_helpers import traced as placement_traced
from readme_blocks import block_after, exec_block, working_directory

F = 255  # the uint8 fill


def capture(doc: dict[str, Any]) -> turbospark.Capture:
    return turbospark.loads(json.dumps(doc))


def traced(experts: int, top_k: int, rows: list[list[list[int]]], seq: Any = None, phase: Any = None) -> dict[str, Any]:
    """A capture document: per layer a list of passes (top_k ids each), optional seq/phase rows."""
    return placement_traced(experts, top_k, rows, **({} if seq is None else {"seq": seq, "phase": phase}))


# Two sequences (7, 9) interleaved; layer 1 dense; layer 2 routes only one of sequence 9's tokens.
INTERLEAVED = traced(4, 2, [[[0, 1], [2, 3], [1, 0], [2, 0]], [], [[3, 2], [0, 1], [1, 0]]],
                     seq=[[7, 9, 7, 9], [], [7, 9, 7]], phase=[[0, 0, 1, 1], [], [0, 0, 1]])


def test_two_interleaved_sequences_a_dense_layer_and_an_uneven_layer_by_hand() -> None:
    replay = routed_experts(capture(INTERLEAVED))
    assert replay.routed_experts.dtype == np.uint8 and replay.fill == F
    assert replay.routed_experts.tolist() == [
        [[0, 1], [F, F], [3, 2]],  # sequence 7, token 0
        [[1, 0], [F, F], [1, 0]],  # sequence 7, token 1
        [[2, 3], [F, F], [0, 1]],  # sequence 9, token 0
        [[2, 0], [F, F], [F, F]],  # sequence 9, token 1: layer 2 never routed it
    ]
    assert replay.cu_seqlens.tolist() == [0, 2, 4] and replay.cu_seqlens.dtype == np.int64
    assert replay.seq_ids.tolist() == [7, 9]
    assert replay.phase.tolist() == [0, 1, 0, 1] and replay.phase.dtype == np.int8
    assert replay.routed_layers.tolist() == [0, 2]
    assert replay.pass_seq.tolist() == [0, 1, 0, 1, 0, 1, 0] and replay.pass_seq.dtype == np.uint8
    assert replay.pass_offsets.tolist() == [0, 4, 4, 7]
    assert (replay.num_experts, replay.tagged, replay.num_layers, replay.top_k, replay.num_seqs) == (4, True, 3, 2, 2)
    assert replay.sequence(1).tolist() == [[[2, 3], [F, F], [0, 1]], [[2, 0], [F, F], [F, F]]]


def test_sequences_are_in_ascending_id_order_and_a_layer_may_route_more_than_another() -> None:
    # Sequence 5 appears first but 2 sorts first; layer 1 holds three of sequence 2's passes, layer 0 one.
    doc = traced(3, 1, [[[0], [1]], [[2], [1], [0], [2]]], seq=[[5, 2], [2, 2, 5, 2]], phase=[[1, 0], [0, 0, 1, 1]])
    replay = routed_experts(capture(doc))
    assert replay.seq_ids.tolist() == [2, 5]
    assert replay.cu_seqlens.tolist() == [0, 3, 4]
    assert replay.routed_experts[:, :, 0].tolist() == [[1, 2], [F, 1], [F, 2], [0, 0]]
    # Token 1 and 2 of sequence 2 take layer 1's phase: layer 0 never routed them.
    assert replay.phase.tolist() == [0, 0, 1, 1]


def test_an_untagged_capture_is_one_sequence_with_unknown_phase() -> None:
    doc = traced(3, 2, [[[2, 0], [2, 1]], [[1, 1]]])
    replay = routed_experts(capture(doc))
    assert replay.routed_experts.tolist() == [[[2, 0], [1, 1]], [[2, 1], [F, F]]]
    assert (replay.cu_seqlens.tolist(), replay.seq_ids.tolist(), replay.phase.tolist()) == ([0, 2], [0], [-1, -1])
    assert replay.tagged is False
    assert [replay.layer(layer)[1:] for layer in range(2)] == [(None, None), (None, None)]


def test_a_capture_without_passes_has_no_sequences() -> None:
    for doc in (traced(4, 2, [[], []]), traced(4, 2, [[], []], seq=[[], []], phase=[[], []])):
        replay = routed_experts(capture(doc))
        assert replay.routed_experts.shape == (0, 2, 2)
        assert (replay.cu_seqlens.tolist(), replay.seq_ids.tolist(), replay.routed_layers.tolist()) == ([0], [], [])
        back = load_routed_experts(_saved(replay))
        assert back.num_seqs == 0 and back.layer(0)[0].shape == (0, 2)


def test_a_counts_only_capture_is_refused() -> None:
    with pytest.raises(ValueError, match="need the capture's trace"):
        routed_experts(turbospark.loads('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[0,1]]}'))


@pytest.mark.parametrize(("experts", "dtype", "fill"), [
    (1, np.uint8, 255), (128, np.uint8, 255), (255, np.uint8, 255), (256, np.uint16, 65535),
    (65535, np.uint16, 65535), (65536, np.uint32, 2**32 - 1)])
def test_the_smallest_dtype_whose_maximum_is_never_an_expert(experts: int, dtype: Any, fill: int) -> None:
    assert id_dtype(experts) == np.dtype(dtype)
    # The highest expert id and the fill, side by side in one file.
    doc = traced(experts, 1, [[[experts - 1]], [[0], [0]]])
    replay = routed_experts(capture(doc))
    assert replay.routed_experts.dtype == np.dtype(dtype) and replay.fill == fill
    assert replay.routed_experts[:, :, 0].tolist() == [[experts - 1, 0], [fill, 0]]
    assert load_routed_experts(_saved(replay)).routed_experts.tolist() == replay.routed_experts.tolist()


def test_id_dtype_bounds() -> None:
    assert id_dtype(0) == np.uint8 and id_dtype(2**32 - 1) == np.uint32
    with pytest.raises(ValueError, match="do not fit uint32"):
        id_dtype(2**32)
    with pytest.raises(ValueError, match="non-negative"):
        id_dtype(-1)


def test_pass_seq_widens_past_256_sequences() -> None:
    seq = list(range(257))
    doc = traced(2, 1, [[[s % 2] for s in seq]], seq=[seq], phase=[[0] * 257])
    replay = routed_experts(capture(doc))
    assert replay.pass_seq.dtype == np.uint16 and replay.pass_seq.tolist() == seq
    assert replay.cu_seqlens.tolist() == list(range(258))


def _saved(replay: RoutedExperts) -> io.BytesIO:
    return io.BytesIO(to_bytes(replay))


def _random_capture(rng: np.random.Generator, tagged: bool) -> dict[str, Any]:
    layers, experts, top_k = 4, 9, 3
    rows, seq, phase = [], [], []
    for layer in range(layers):
        passes = 0 if layer == 1 else int(rng.integers(0, 40))  # layer 1 dense
        rows.append([rng.choice(experts, top_k, replace=False).tolist() for _ in range(passes)])
        ids = rng.choice([3, 11, 12, 40], passes).tolist()
        seq.append(ids)
        phase.append([int(p) for p in rng.integers(0, 2, passes)])
    return traced(experts, top_k, rows, seq if tagged else None, phase if tagged else None)


@pytest.mark.parametrize("tagged", [True, False])
def test_round_trip_rebuilds_every_layer_trace_and_seq_exactly(tmp_path: Path, tagged: bool) -> None:
    rng = np.random.default_rng(18)
    for trial in range(20):
        source = capture(_random_capture(rng, tagged))
        path = tmp_path / f"r{trial}.npz"
        save_routed_experts(routed_experts(source), path)
        back = load_routed_experts(path)
        for layer in range(source.num_layers):
            ids, seq, phase = back.layer(layer)
            assert ids.dtype == np.int64 and np.array_equal(ids, source.trace[layer])  # type: ignore[index]
            if tagged:
                assert source.seq is not None and np.array_equal(seq, source.seq[layer])
                assert seq is not None and seq.dtype == np.int64
            else:
                assert seq is None and phase is None
        # The per-token arrays describe the same passes: every id the trace holds, nothing else.
        ids = back.routed_experts
        assert int((ids != back.fill).sum()) == sum(int(t.size) for t in source.trace)  # type: ignore[union-attr]


def test_phase_round_trips_when_the_layers_agree() -> None:
    doc = traced(4, 1, [[[0], [1], [2]], [[3], [2], [1]]], seq=[[1, 2, 1], [1, 2, 1]], phase=[[0, 0, 1], [0, 0, 1]])
    back = load_routed_experts(_saved(routed_experts(capture(doc))))
    assert [back.layer(layer)[2].tolist() for layer in range(2)] == [[0, 0, 1], [0, 0, 1]]  # type: ignore[union-attr]


def test_the_file_is_an_npz_of_plain_arrays() -> None:
    data = to_bytes(routed_experts(capture(INTERLEAVED)))
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(["format", "routed_experts", "cu_seqlens", "seq_ids", "phase",
                                            "routed_layers", "pass_seq", "pass_offsets", "fill",
                                            "num_experts", "tagged"])
        assert str(npz["format"]) == FORMAT == "turbospark-routed-experts/1"
        assert (npz["fill"].dtype, int(npz["fill"]), int(npz["num_experts"]), bool(npz["tagged"])) == (
            np.uint8, 255, 4, True)
        assert all(npz[key].dtype.byteorder in "<|=" for key in npz.files)
    # Uncompressed (np.savez): each array is stored, not deflated.
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}


def _tampered(**changes: Any) -> io.BytesIO:
    with np.load(io.BytesIO(to_bytes(routed_experts(capture(INTERLEAVED)))), allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    arrays.update(changes)
    for key in [key for key, value in changes.items() if value is None]:
        del arrays[key]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize(("changes", "message"), [
    ({"cu_seqlens": None}, "missing cu_seqlens"),
    ({"format": np.array("other/1")}, "format is"),
    ({"routed_experts": np.zeros((4, 3, 2), np.int32)}, "3-D uint8/uint16/uint32"),
    ({"routed_experts": np.zeros((4, 3, 2), np.uint16) + 65535, "fill": np.array(65535, np.uint16)},
     "not the layout for 4 experts"),
    ({"cu_seqlens": np.array([0, 3, 4])}, "more passes of a sequence than"),
    ({"cu_seqlens": np.array([0, 1, 4])}, "more passes of a sequence than"),
    ({"cu_seqlens": np.array([0, 2, 5])}, "cu_seqlens must rise from 0"),
    ({"seq_ids": np.array([9, 7])}, "seq_ids must be 2 ascending"),
    ({"phase": np.array([0, 1, 2, 1], np.int8)}, "phase must be 4 int8"),
    ({"pass_seq": np.array([0, 1, 0, 1, 0, 1, 2], np.uint8)}, "outside 0..1"),
    ({"pass_offsets": np.array([0, 4, 5, 7])}, "routed_layers must list"),
    ({"routed_layers": np.array([0])}, "routed_layers must list"),
    ({"tagged": np.array(1)}, "tagged must be a bool scalar"),
])
def test_load_names_what_is_inconsistent(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_routed_experts(_tampered(**changes))


def test_an_id_where_no_pass_was_recorded_is_refused() -> None:
    ids = routed_experts(capture(INTERLEAVED)).routed_experts.copy()
    ids[3, 2] = [1, 2]  # sequence 9, token 1, layer 2: no pass there
    with pytest.raises(ValueError, match="and the fill 255 everywhere else"):
        load_routed_experts(_tampered(routed_experts=ids))


def test_not_an_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(INTERLEAVED))
    with pytest.raises(ValueError, match=r"not a routed-experts file \(an .npz\)"):
        load_routed_experts(path)
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match="a single .npy array"):
        load_routed_experts(tmp_path / "one.npy")
    whole = to_bytes(routed_experts(capture(INTERLEAVED)))
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="not a routed-experts file"):
        load_routed_experts(tmp_path / "cut.npz")


# ---------------------------------------------------------------- the docs' worked example


def _docs(marker: str) -> str:
    return block_after(f"test: {marker}")


def test_the_docs_example_prints_what_the_page_shows(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "capture.json").write_text(_docs("replay-capture"))
    assert json.loads(_docs("replay-capture")) == INTERLEAVED
    command = _docs("replay-cli").split()
    assert command[:2] == ["turbospark", "export"]
    with working_directory(tmp_path):
        assert main(command[1:]) == 0
        assert capfd.readouterr().out == _docs("replay-cli-output")
        assert exec_block(_docs("replay-read"), "docs/replay.md") == _docs("replay-read-output")
