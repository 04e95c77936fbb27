"""``turbospark place`` / ``export`` (sglang, routed-experts) / ``analyze --placement``: formats, out-of-sample figures, batches, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turbospark.outputs.replay import load_routed_experts
from turbospark.cli import main
from turbospark.placement.formats import parse_trtllm, read_placement
from turbospark.placement.samples import batch_counts

from placement_helpers import traced, write_capture
from turbospark.placement.dispatch import ROUND_ROBIN_HINT, ROUND_ROBIN_LAYER, STATIC_UNKNOWN

# Layer 0 routes like test_global_with_replicas_by_hand (counts 1, 9, 4, 4), top-2;
# layer 1 never routes.
PASSES = [[1, 0], [1, 2], [1, 3], [1, 2], [1, 3], [1, 2], [1, 3], [1, 2], [1, 3]]
DOC = traced(4, 2, [PASSES, []])
ROUND_ROBIN = ROUND_ROBIN_LAYER.format(hint=ROUND_ROBIN_HINT)
DISPATCH_LINES = ("  in sample by dispatch model (trivial -> placed; optimised for even): even 0.000 -> 0.000, "
                  "static - -> -, round-robin 0.111 -> 0.000\n"
                  f"  static dispatch: {STATIC_UNKNOWN}\n"
                  f"  round-robin dispatch: {ROUND_ROBIN}\n")
IDLE_LINE = "  1 MoE layers without passes (1): the trivial placement (slot s holds expert s mod E)\n"


def test_place_json_document(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    out = tmp_path / "p.json"
    assert main(["place", path, "--gpus", "2", "--slots", "6", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["inputs"] == {"capture": path, "num_layers": 2, "num_experts": 4, "top_k": 2, "gpus": 2,
                             "slots": 6, "nodes": 1, "groups": None, "fit": None, "batch": None, "batches": None}
    assert doc["physical_to_logical_map"] == [[1, 1, 1, 3, 2, 0], [0, 1, 2, 3, 0, 1]]
    # Layer 1 has no load: the trivial placement (the published replication would give every
    # spare slot to expert 0, its first maximum).
    assert doc["replica_counts"] == [[1, 3, 1, 1], [2, 2, 1, 1]]
    layer = doc["layers"][0]
    # Trivial map 0 1 2 | 3 0 1: expert 0 and 1 have two replicas: 0.5 + 4.5 + 4 | 4 + 0.5 + 4.5.
    assert layer["before"]["in_sample"] == {"imbalance": 0.0, "balancedness": 1.0, "max_load": 9.0, "mean_load": 9.0}
    assert layer["after"]["in_sample"] == {"imbalance": 0.0, "balancedness": 1.0, "max_load": 9.0, "mean_load": 9.0}
    assert layer["published_max_load"] == 10.0
    assert layer["after"]["out_of_sample"] is None and layer["fit_passes"] == 9 and layer["test_passes"] is None
    assert doc["layers"][1]["after"]["in_sample"]["imbalance"] is None
    # Round-robin (one block, offset 0): expert 1's 9 tokens go 5 to slot 1 and 4 to slot 5 of the
    # trivial map, GPU loads 1 + 5 + 4 | 4 + 4 = 10 | 8; the placement holds all three copies on GPU 0.
    assert layer["imbalance"] == {"even": 0.0, "static": None, "round-robin": 0.0}
    assert layer["trivial_imbalance"] == {"even": 0.0, "static": None, "round-robin": 1 / 9}
    assert doc["layers"][1]["imbalance"] == {"even": None, "static": None, "round-robin": None}
    assert doc["dispatch"] == {"model": "even", "source_ranks": 1, "static": None, "why": STATIC_UNKNOWN,
                               "round_robin": ROUND_ROBIN}
    assert doc["summary"] == {"routed_layers": 1,
                              "before": {"in_sample": 0.0, "out_of_sample": None, "batch_in_sample": None, "batch_out_of_sample": None},
                              "after": {"in_sample": 0.0, "out_of_sample": None, "batch_in_sample": None, "batch_out_of_sample": None},
                              "imbalance": {"even": 0.0, "static": None, "round-robin": 0.0},
                              "trivial_imbalance": {"even": 0.0, "static": None, "round-robin": 1 / 9}}
    assert capfd.readouterr().out == (
        "placement: 2 layers x 4 experts on 6 slots, 2 GPUs; mean imbalance (max - mean) / mean over 1 routed layers:\n"
        "  in sample: 0.000 trivial -> 0.000 placed\n" + DISPATCH_LINES + IDLE_LINE +
        f"wrote {out} (json)\n")


def test_sglang_and_trtllm_formats_exact_and_parsed_back(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "sglang"]) == 0
    captured = capfd.readouterr()
    assert captured.out == '{"physical_to_logical_map":[[1,1,1,3,2,0],[0,1,2,3,0,1]]}\n'
    assert captured.err.startswith("placement: 2 layers x 4 experts")
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "trtllm"]) == 0
    text = capfd.readouterr().out
    # Every MoE layer, keyed by its index; layer 1 (no passes) holds the trivial placement.
    assert text == ("initial_global_assignments:\n  0: [1, 1, 1, 3, 2, 0]\n  1: [0, 1, 2, 3, 0, 1]\n"
                    "layer_updates_per_iter: 0\nnum_slots: 6\n")
    assert parse_trtllm(text) == ({0: [1, 1, 1, 3, 2, 0], 1: [0, 1, 2, 3, 0, 1]}, 6)
    phy2log, gpus = read_placement(text, 2, 4, 2)
    assert phy2log.tolist() == [[1, 1, 1, 3, 2, 0], [0, 1, 2, 3, 0, 1]] and gpus == 2
    try:
        import yaml  # only when already installed: the format must be plain YAML
    except ImportError:
        return
    assert yaml.safe_load(text) == {"initial_global_assignments": {0: [1, 1, 1, 3, 2, 0], 1: [0, 1, 2, 3, 0, 1]},
                                    "layer_updates_per_iter": 0, "num_slots": 6}


def test_export_sglang_logical_count(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["export", path, "--to", "sglang"]) == 0
    assert capfd.readouterr().out == '{"logical_count":[[1,9,4,4],[0,0,0,0]]}\n'


def test_fit_and_batches_by_hand(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Fit on the first half (4 of 9 passes... int(0.5 * 9) = 4), judge on the other 5.
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["place", path, "--gpus", "2", "--fit", "0.5", "--batch", "2"]) == 0
    doc = json.loads(capfd.readouterr().out)
    layer = doc["layers"][0]
    assert (layer["fit_passes"], layer["test_passes"]) == (4, 5)
    # Fit counts 1, 4, 2, 1: 4 -> GPU 0, 2 -> GPU 1, 1 (expert 0) -> GPU 1, 1 (expert 3) -> GPU 0
    # (GPU 1 full): map [1, 3 | 2, 0], 5 | 3 in sample.
    assert doc["physical_to_logical_map"][0] == [1, 3, 2, 0]
    assert layer["after"]["in_sample"]["imbalance"] == 0.25
    # Test passes (1,3)(1,2)(1,3)(1,2)(1,3): counts 0, 5, 2, 3 -> 8 | 2: worse out of sample.
    assert layer["after"]["out_of_sample"]["imbalance"] == 0.6
    # Batches of 2 consecutive passes: fit (1,0)(1,2) -> 2|2, (1,3)(1,2) -> 3|1; mean of 0 and 0.5.
    assert layer["after"]["batch_in_sample"] == {"imbalance": 0.25, "batches": 2}
    # Test: (1,3)(1,2) -> 3|1 twice; the fifth pass is a partial batch, left out.
    assert layer["after"]["batch_out_of_sample"] == {"imbalance": 0.5, "batches": 2}
    assert doc["inputs"]["batches"] == "consecutive passes"


def test_batches_of_concurrent_sequences() -> None:
    ids = np.array([[0], [1], [0], [2], [1], [3]])
    seq = np.array([5, 7, 5, 9, 7, 9])
    decode = np.ones(6, dtype=np.int64)
    # Continuous batching, B=2: sequences 5 and 7 take the two rows at iteration 0 and run
    # two steps each; 9 takes the first freed row at iteration 2. Iterations: (0, 1), (0, 1), (2), (3).
    assert batch_counts(ids, 4, 2, (seq, decode)).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert batch_counts(ids, 4, 4, None).tolist() == [[2, 1, 1, 0]]
    # A sequence's prompt passes are its first step; here each has one, so the steps are unchanged.
    phase = np.array([0, 0, 1, 0, 1, 1])
    assert batch_counts(ids, 4, 2, (seq, phase)).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    # Two prompt passes share one step (one prefill), then one decode pass per step.
    prompt_heavy = np.array([[0], [0], [1], [2]])
    assert batch_counts(prompt_heavy, 4, 1, (np.array([3, 3, 3, 3]), np.array([0, 0, 1, 1]))).tolist() == [
        [2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]


def test_a_freed_row_takes_the_next_sequence() -> None:
    # Sequences 0 (3 passes), 1 (1 pass), 2 (2 passes), B=2: 2 starts when 1 ends, at iteration 1.
    ids = np.array([[0], [1], [0], [2], [0], [2]])
    seq, decode = np.array([0, 1, 0, 2, 0, 2]), np.ones(6, dtype=np.int64)
    assert batch_counts(ids, 3, 2, (seq, decode)).tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 1]]


def test_batches_use_the_seq_key(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = traced(4, 2, [PASSES, []], seq=[[0, 1, 0, 1, 0, 1, 0, 1, 0], []],
                 phase=[[1] * 9, []])
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["place", path, "--gpus", "2", "--batch", "2"]) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["inputs"]["batches"] == "concurrent sequences"
    # Batch j = j-th pass of sequences 0 and 1: passes (0,1), (2,3), (4,5), (6,7), then (8) alone.
    assert out["layers"][0]["after"]["batch_in_sample"]["batches"] == 5


def test_fit_cut_is_exact(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # --fit 0.29 on 100 passes fits floor(29/100 x 100) = 29 (int(0.29 * 100) gave 28).
    path = write_capture(tmp_path / "c.json", traced(4, 2, [[[1, 0]] * 100, []]))
    assert main(["place", path, "--gpus", "2", "--fit", "0.29"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["inputs"]["fit"] == 0.29
    assert [(row["fit_passes"], row["test_passes"], row["split"]) for row in doc["layers"]] == [
        (29, 71, "passes"), (0, 0, "passes")]


def test_fit_on_a_tagged_capture_takes_whole_sequences(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Sequences 4 and 8 run side by side; by position the fit half would be 4's prompt and 8's prompt.
    # By sequence: the first floor(0.5 x 2) = 1 sequence (4, seen first) is fit, all its passes.
    passes = [[1, 0], [1, 0], [2, 3], [2, 3], [1, 2], [2, 3], [1, 2], [2, 3]]
    doc = traced(4, 2, [passes, []], seq=[[4, 4, 8, 8, 4, 8, 4, 8], []], phase=[[0, 0, 0, 0, 1, 1, 1, 1], []])
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["place", path, "--gpus", "2", "--fit", "0.5", "--batch", "1"]) == 0
    captured = capfd.readouterr()
    out = json.loads(captured.out)
    layer = out["layers"][0]
    assert (layer["fit_passes"], layer["test_passes"], layer["split"]) == (4, 4, "sequences")
    # Fit passes (1,0)(1,0)(1,2)(1,2): counts 2, 4, 2, 0; trivial map 0 1 | 2 3 loads 6 | 2.
    assert layer["before"]["in_sample"] == {"imbalance": 0.5, "balancedness": 2 / 3, "max_load": 6.0, "mean_load": 4.0}
    # Batches of one row: sequence 4's prompt step (both prompt passes), then its decode steps, one each.
    assert layer["after"]["batch_in_sample"]["batches"] == 3
    assert layer["after"]["batch_out_of_sample"]["batches"] == 3
    assert captured.err.splitlines()[1].startswith("  in sample (first 0.5 of sequences): ")
    assert captured.err.splitlines()[2].startswith("  out of sample (the remaining sequences): ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "2", "--slots", "3"], "--slots 3 is fewer than the 4 experts: every expert needs a slot"),
        (["--gpus", "4", "--slots", "6"], "--slots 6 not divisible by --gpus 4"),
        (["--gpus", "4", "--nodes", "2", "--groups", "1"], "--groups 1 is not divisible by --nodes 2"),
        (["--gpus", "2", "--fit", "0.5"], "--fit needs the capture's trace (record with trace=True): "
         "counts alone do not say which passes came first"),
        (["--gpus", "2", "--batch", "4"], "--batch needs the capture's trace (record with trace=True): "
         "counts alone do not say which passes were served together"),
    ],
)
def test_bad_inputs_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    doc = {key: DOC[key] for key in ("num_layers", "num_experts", "top_k", "counts")}
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["place", path] + argv) == 2
    assert capfd.readouterr() == ("", f"turbospark: {message}\n")


def test_on_a_terminal_without_o_only_the_summary_is_printed(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = write_capture(tmp_path / "c.json", DOC)
    summary = ("placement: 2 layers x 4 experts on 6 slots, 2 GPUs; mean imbalance (max - mean) / mean over 1 "
               "routed layers:\n  in sample: 0.000 trivial -> 0.000 placed\n" + DISPATCH_LINES + IDLE_LINE)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["place", path, "--gpus", "2", "--slots", "6"]) == 0
    assert capfd.readouterr() == (
        summary + "placement not written (json): give -o FILE to save it, or -o - to print it here\n", "")
    # Beside an SGLang file printed to stdout, the flags name a FILE.json to save it as.
    flags = ("SGLang: --tp 2 --ep-size 2 --moe-a2a-backend deepep --ep-num-redundant-experts 2 "
             "--init-expert-location FILE.json "
             "(6 slots = 4 experts + 2 redundant; 2 MoE rows)\n"
             "  SGLang's dispatch: static (the default with DeepEP) gives imbalance unknown (no per-rank captures), "
             "--ep-dispatch-algorithm dynamic about 0.000 (optimised for even)\n")
    # -o - prints the document even on a terminal; the summary goes to stderr.
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "sglang", "-o", "-"]) == 0
    assert capfd.readouterr() == ('{"physical_to_logical_map":[[1,1,1,3,2,0],[0,1,2,3,0,1]]}\n', summary + flags)
    # Not a terminal (a pipe, a redirect): the document on stdout, the summary on stderr, as before.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "sglang"]) == 0
    assert capfd.readouterr() == ('{"physical_to_logical_map":[[1,1,1,3,2,0],[0,1,2,3,0,1]]}\n', summary + flags)


def test_bad_fraction_is_an_argument_error(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["place", "x.json", "--gpus", "2", "--fit", "1.5"])
    assert info.value.code == 2
    assert "must be strictly between 0 and 1, got 1.5" in capfd.readouterr().err


def test_analyze_with_a_placement(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    placement = tmp_path / "s.json"
    placement.write_text('{"physical_to_logical_map":[[2,1,1,3,1,0],[0,1,2,3,0,1]]}')
    assert main(["analyze", path, "--placement", str(placement)]) == 2
    assert capfd.readouterr().err == (f"turbospark: {placement}: this placement file does not say "
                                      "how many GPUs it is for: give --gpus\n")
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    # Slots 2 1 1 | 3 1 0: expert 1 has a copy on each of slots 1, 2, 4; even and round-robin
    # (9 ids of expert 1 in one block: 3 per copy) both give 4 + 3 + 3 | 4 + 3 + 1 = 10 | 8.
    none = {"even": None, "static": None, "round-robin": None}
    assert doc["placement"] == {
        "file": str(placement), "gpus": 2, "slots": 6, "dispatch": "even", "source_ranks": 1, "static": None,
        "why": STATIC_UNKNOWN, "round_robin": ROUND_ROBIN_LAYER.format(hint=""), "layers": [
            {"layer": 0, "imbalance": {"even": 1 / 9, "static": None, "round-robin": 1 / 9}, "balancedness": 0.9,
             "max_load": 10.0, "mean_load": 9.0, "trivial_imbalance": {"even": 0.0, "static": None, "round-robin": 1 / 9}},
            {"layer": 1, "imbalance": none, "balancedness": None, "max_load": 0.0, "mean_load": 0.0,
             "trivial_imbalance": none}],
        "mean_imbalance": {"even": 1 / 9, "static": None, "round-robin": 1 / 9},
        "mean_trivial_imbalance": {"even": 0.0, "static": None, "round-robin": 1 / 9}}
    # Static under the even-spread assumption (4.5 + 2 + 0.5 + 2 tokens from each rank): rank 0 has
    # no copy of experts 0 and 3 (slots 5, 3), rank 1 none of expert 2 (slot 0): 8.5 | 9.5, 1/18;
    # the trivial map 0 1 2 | 3 0 1 keeps every token local but expert 3's from rank 0 and
    # expert 2's from rank 1: 9 | 9.
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--json", "--dispatch", "static"]) == 0
    doc = json.loads(capfd.readouterr().out)["placement"]
    assert doc["layers"][0]["imbalance"] == {"even": 1 / 9, "static": 1 / 18, "round-robin": 1 / 9}
    assert doc["layers"][0]["trivial_imbalance"] == {"even": 0.0, "static": 0.0, "round-robin": 1 / 9}
    assert (doc["dispatch"], doc["static"], doc["why"]) == (
        "static", "assumed: each expert's tokens spread evenly over the 2 source ranks (one capture)", None)
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[-7:] == ["layer  imbalance  balancedness", "    0      0.111         0.900",
                          "    1          -             -  (no load)", "mean imbalance over 1 loaded layers: 0.111",
                          "  in sample by dispatch model (mean, trivial -> this file): even 0.000 -> 0.111, "
                          "static - -> -, round-robin 0.111 -> 0.111", f"  static dispatch: {STATIC_UNKNOWN}",
                          f"  round-robin dispatch: {ROUND_ROBIN_LAYER.format(hint='')}"]
    placement.write_text('{"physical_to_logical_map":[[2,1,1,3,1,1],[0,1,2,3,0,1]]}')
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2"]) == 2
    assert capfd.readouterr().err == f"turbospark: {placement}: expert 0 of layer 0 has no slot in the placement\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("initial_global_assignments:\n  0: [1, 1, 1, 3, 2, 0]\nnum_slots: 6\nbogus: 1\n",
         "line 4 is not part of a TensorRT-LLM EPLB file: 'bogus: 1'"),
        ("initial_global_assignments:\n  0: [1, 1, 1, 3]\nnum_slots: 6\n", "layer 0 lists 4 experts, not num_slots=6"),
        ("initial_global_assignments:\n  5: [1, 1, 1, 3, 2, 0]\nnum_slots: 6\n",
         "layer 5 of the placement is outside the capture's 2 MoE layers (decoder layers 0..1)"),
        ('{"physical_to_logical_map":[[0,1,2,3]]}', "the placement has 1 rows, the capture 2 MoE layers"),
        # A MoE layer missing from the YAML: TensorRT-LLM's build would stop on it.
        ("initial_global_assignments:\n  0: [1, 1, 1, 3]\nnum_slots: 4\n",
         "the placement has no row for layer 1 (1 of the capture's 2 MoE layers missing): "
         "TensorRT-LLM's build fails with KeyError on it"),
        ('{"physical_to_logical_map":[[0,1],[0,1]]}', "the placement has 2 slots per layer, fewer than the capture's 4 experts"),
        ('{"physical_to_logical_map":[[0,1,2,9],[0,1,2,3]]}', "the placement holds expert id 9, outside 0..3"),
        ('{"physical_to_logical_map":[[0,1,2,3.5],[0,1,2,3]]}', "physical_to_logical_map must hold integers only, found 3.5"),
        ('{"physical_to_logical_map":[[0,1,2,3,0,1],[0,1,2,3,0,1]]}', "6 slots do not divide over 4 GPUs"),
        # Ids beyond int64 name themselves (once an OverflowError traceback, exit 1).
        ('{"physical_to_logical_map":[[0,1,2,99999999999999999999],[0,1,2,3]]}',
         "the placement holds expert id 99999999999999999999, outside 0..3"),
        ("initial_global_assignments:\n  0: [0, 1, 2, 99999999999999999999]\n  1: [0, 1, 2, 3]\nnum_slots: 4\n",
         "the placement holds expert id 99999999999999999999, outside 0..3"),
        ('{"physical_to_logical_map":[[0,1,null,3],[0,1,2,3]]}', "physical_to_logical_map must hold integers only, found None"),
        # Empty rows (once numpy's "zero-size array to reduction operation minimum which has no identity").
        ('{"physical_to_logical_map":[[],[]]}', "the placement's rows are empty: every layer needs a slot for each expert"),
        ("initial_global_assignments: {}\nnum_slots: 0\n",
         "the placement's rows are empty: every layer needs a slot for each expert"),
        ('{"physical_to_logical_map":[[0,1,2,3],[0,1,2,3]],"inputs":{"gpus":' + "9" * 100 + "}}",
         "4 slots do not divide over " + "9" * 57 + "... GPUs"),
        ("x" * 1000, "line 1 is not part of a TensorRT-LLM EPLB file: '" + "x" * 56 + "..."),
        ('{"a":1,"b":[2]}', "a JSON object without physical_to_logical_map (keys: 'a', 'b'): a placement file is "
         "turbospark place's JSON, SGLang's {\"physical_to_logical_map\": ...} or TensorRT-LLM's EPLB YAML"),
        ("[1, 2]", "a JSON list, not a placement: a placement file is turbospark place's JSON, "
         "SGLang's {\"physical_to_logical_map\": ...} or TensorRT-LLM's EPLB YAML"),
    ],
)
def test_bad_placement_files_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    placement = tmp_path / "bad.txt"
    placement.write_text(text)
    gpus = [] if "inputs" in text else ["--gpus", "4" if "divide" in message else "2"]
    assert main(["analyze", path, "--placement", str(placement), *gpus]) == 2
    assert capfd.readouterr() == ("", f"turbospark: {placement}: {message}\n")


def test_a_capture_given_as_the_placement_is_named_not_echoed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    # An 80 KB capture was once echoed whole to stderr as a line that is not TensorRT-LLM YAML.
    big = write_capture(tmp_path / "big.json", traced(4, 2, [PASSES * 2000, []]))
    assert Path(big).stat().st_size > 70_000
    assert main(["analyze", path, "--placement", big, "--gpus", "2"]) == 2
    assert capfd.readouterr() == ("", (
        f"turbospark: {big}: this is a capture, not a placement: a placement file is turbospark place's JSON, "
        "SGLang's {\"physical_to_logical_map\": ...} or TensorRT-LLM's EPLB YAML (make one with turbospark place)\n"))


def test_gpus_without_a_placement_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", write_capture(tmp_path / "c.json", DOC), "--gpus", "2"]) == 2
    assert capfd.readouterr() == ("", "turbospark: --gpus only applies to a --placement file\n")


def test_malformed_sequence_keys_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    doc = traced(4, 2, [PASSES, []], seq=[[0, 1], []], phase=[[1, 1], []])
    path = write_capture(tmp_path / "c.json", doc)
    assert main(["place", path, "--gpus", "2", "--batch", "2"]) == 2
    assert capfd.readouterr().err == f"turbospark: cannot read {path}: seq[0] has 2 entries, expected one per pass of the layer (9)\n"


def test_geometry_refusals_name_both_sides(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    placement = tmp_path / "p.json"
    # An 8-GPU file under 2 GPUs (SGLang would load it under --ep-size 16 without a word).
    placement.write_text('{"physical_to_logical_map":[[0,1,2,3],[0,1,2,3]],"inputs":{"gpus":4}}')
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2"]) == 2
    assert capfd.readouterr().err == (f"turbospark: {placement}: the placement was made for 4 GPUs "
                                      "(its inputs.gpus), not --gpus 2\n")
    # Rows for 3 dense layers first: --first-moe-layer 3 drops them, without it the count is refused.
    placement.write_text('{"physical_to_logical_map":' + json.dumps([[0, 1, 2, 3]] * 5) + "}")
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--first-moe-layer", "2"]) == 2
    assert capfd.readouterr().err == (f"turbospark: {placement}: the placement has 5 rows, the capture 2 "
                                      "MoE layers after 2 dense layers (--first-moe-layer)\n")
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2", "--first-moe-layer", "3",
                 "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["placement"]["slots"] == 4


def test_files_for_the_engines_say_what_they_need(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    yaml_path, json_path = tmp_path / "eplb.yaml", tmp_path / "sglang.json"
    # Layer 1 has no passes: it still gets a row (the trivial placement), keyed by decoder layer 3 + 1.
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "trtllm", "--first-moe-layer", "3",
                 "-o", str(yaml_path)]) == 0
    assert yaml_path.read_text() == ("initial_global_assignments:\n  3: [1, 1, 1, 3, 2, 0]\n  4: [0, 1, 2, 3, 0, 1]\n"
                                     "layer_updates_per_iter: 0\nnum_slots: 6\n")
    lines = capfd.readouterr().out.splitlines()
    assert lines[-4:] == [
        "  1 MoE layers without passes (1): the trivial placement (slot s holds expert s mod E)",
        f"TensorRT-LLM: moe_config: {{load_balancer: {yaml_path}}} with enable_attention_dp: true, trtllm-serve "
        "--tp_size 2 --ep_size 2 (6 slots = 4 experts + 2 redundant; keys are decoder layers 3..4)",
        "  with MTP (nextn) layers give --mtp-layers M: TensorRT-LLM keys them 5 and up and fails the build "
        "(KeyError) without a row",
        f"wrote {yaml_path} (trtllm)"]
    assert read_placement(yaml_path.read_text(), 2, 4, 2, 3)[0].tolist() == [[1, 1, 1, 3, 2, 0], [0, 1, 2, 3, 0, 1]]
    assert main(["place", path, "--gpus", "2", "--slots", "6", "--format", "sglang", "--first-moe-layer", "1",
                 "-o", str(json_path)]) == 0
    assert json_path.read_text() == '{"physical_to_logical_map":[[0,1,2,3,0,1],[1,1,1,3,2,0],[0,1,2,3,0,1]]}\n'
    lines = capfd.readouterr().out.splitlines()
    assert lines[-3:] == [
        f"SGLang: --tp 2 --ep-size 2 --moe-a2a-backend deepep --ep-num-redundant-experts 2 "
        f"--init-expert-location {json_path} "
        "(6 slots = 4 experts + 2 redundant; 1 trivial rows for the dense layers, then 2 MoE rows)",
        "  SGLang's dispatch: static (the default with DeepEP) gives imbalance unknown (no per-rank captures), "
        "--ep-dispatch-algorithm dynamic about 0.000 (optimised for even)",
        f"wrote {json_path} (sglang)"]
    # SGLang parses an --init-expert-location not ending in .json as JSON text: refused before writing.
    assert main(["place", path, "--gpus", "2", "--format", "sglang", "-o", str(tmp_path / "map.txt")]) == 2
    assert capfd.readouterr().err == (f"turbospark: -o {tmp_path / 'map.txt'}: SGLang reads --init-expert-location "
                                      "as a file only when its name ends in .json; name it like placement.json\n")
    assert not (tmp_path / "map.txt").exists()


def test_export_routed_experts_writes_the_npz_and_says_what_it_holds(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    out = tmp_path / "routed.npz"
    assert main(["export", path, "--to", "routed-experts", "-o", str(out)]) == 0
    assert capfd.readouterr() == (f"wrote {out}: 1 sequence, 9 tokens x 2 layers (1 routed) x top-2, uint8, fill 255\n", "")
    replay = load_routed_experts(out)
    assert replay.routed_experts[:, 0].tolist() == PASSES
    assert replay.routed_experts[:, 1].tolist() == [[255, 255]] * 9  # layer 1 never routes
    assert (replay.cu_seqlens.tolist(), replay.routed_layers.tolist(), replay.tagged) == ([0, 9], [0], False)
    # sglang still writes counts.
    assert main(["export", path, "--to", "sglang"]) == 0
    assert capfd.readouterr().out == '{"logical_count":[[1,9,4,4],[0,0,0,0]]}\n'


@pytest.mark.parametrize("output", [None, "-"])
def test_export_routed_experts_needs_a_file(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                            output: str | None) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["export", path, "--to", "routed-experts", *(["-o", output] if output else [])]) == 2
    assert capfd.readouterr() == ("", "turbospark: --to routed-experts writes a binary .npz: give -o FILE "
                                      "(like routed_experts.npz)\n")


def test_export_routed_experts_refuses_a_counts_only_capture(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "counts.json"
    path.write_text('{"num_layers":1,"num_experts":2,"top_k":1,"counts":[[0,1]]}')
    out = tmp_path / "routed.npz"
    assert main(["export", str(path), "--to", "routed-experts", "-o", str(out)]) == 2
    assert capfd.readouterr() == ("", f"turbospark: {path} has counts but no trace: routed experts need the order "
                                      "of the passes (record with trace=True, or TURBOSPARK_ROUTER_TRACE=1)\n")
    assert not out.exists()


def test_export_routed_experts_cannot_write(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    target = tmp_path / "missing" / "routed.npz"
    assert main(["export", path, "--to", "routed-experts", "-o", str(target)]) == 2
    assert capfd.readouterr().err.startswith(f"turbospark: cannot write {target}: ")


@pytest.mark.parametrize("inputs, shown", [([4], "[4]"), ("x", "'x'"), (3, "3")])
def test_a_placement_whose_inputs_is_not_an_object_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                          inputs: Any, shown: str) -> None:
    # It gave an AttributeError traceback ('list' object has no attribute 'get').
    path = write_capture(tmp_path / "c.json", DOC)
    placement = tmp_path / "p.json"
    placement.write_text('{"physical_to_logical_map":[[0,1,2,3],[0,1,2,3]],"inputs":%s}' % json.dumps(inputs))
    message = f"turbospark: {placement}: the placement's inputs must be an object, got {shown}\n"
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2"]) == 2
    assert capfd.readouterr() == ("", message)
    assert main(["place", path, "--gpus", "2", "--from", str(placement)]) == 2
    assert capfd.readouterr() == ("", message)


def test_a_placement_whose_gpus_is_not_a_positive_integer_exit_2(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    placement = tmp_path / "p.json"
    placement.write_text('{"physical_to_logical_map":[[0,1,2,3],[0,1,2,3]],"inputs":{"gpus":"2"}}')
    assert main(["analyze", path, "--placement", str(placement)]) == 2
    assert capfd.readouterr() == ("", f"turbospark: {placement}: the placement's inputs.gpus must be a positive "
                                      "integer, got '2'\n")
    # A null inputs reads as no inputs, as before: --gpus then says how many.
    placement.write_text('{"physical_to_logical_map":[[0,1,2,3],[0,1,2,3]],"inputs":null}')
    assert main(["analyze", path, "--placement", str(placement), "--gpus", "2"]) == 0
    capfd.readouterr()
