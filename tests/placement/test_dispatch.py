"""Dispatch models (even, SGLang static, TensorRT-LLM round-robin): exact small cases by hand,
per-rank captures through the CLI, the docs' worked example, never worse than the published map."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark.cli import main
from turbospark.placement import place
from turbospark.placement.dispatch import SGLANG_SEED, DISPATCH, dispatch_loads, routing, static_layer_loads, static_slots
from turbospark.placement._static import _Layer, divisor_placement, static_search
from turbospark.placement.dispatch import imbalance, replica_counts

from placement_helpers import traced, write_capture

DOCS = Path(__file__).resolve().parents[2] / "docs" / "placement.md"
MAP = np.array([[0, 1, 2, 0]])  # expert 0 on slot 0 (GPU 0) and slot 3 (GPU 1)
RANKS = routing([np.array([[5, 2, 1]]), np.array([[3, 1, 5]])])


def test_three_models_by_hand() -> None:
    # even: 4 + 3 | 6 + 4. static: rank 0 sends 5 + 2 local, expert 2's 1 token to GPU 1; rank 1
    # keeps 3 + 5 local and sends expert 1's token to GPU 0. round-robin: rank 0's 5 tokens of
    # expert 0 go 3 | 2 (offset 0), rank 1's 3 go 1 | 2 (offset 1).
    assert dispatch_loads("even", MAP, RANKS, 2).tolist() == [[7.0, 10.0]]
    assert dispatch_loads("static", MAP, RANKS, 2).tolist() == [[8.0, 9.0]]
    assert dispatch_loads("round-robin", MAP, RANKS, 2).tolist() == [[7.0, 10.0]]
    one = routing([np.array([[8, 3, 6]])])
    assert dispatch_loads("static", MAP, one, 2) is None
    # Assumed even spread: each rank sends 4, 1.5, 3; rank 0 sends expert 2 to GPU 1, rank 1 expert 1 to GPU 0.
    assert dispatch_loads("static", MAP, one, 2, assume_even=True).tolist() == [[4 + 1.5 + 1.5, 3 + 4 + 3]]


def test_static_fair_choice_is_sglangs() -> None:
    # Expert 0 on GPUs 0 and 1, expert 1 on GPUs 2 and 3 (one slot per GPU): ranks without a copy
    # share the expert's two slots one each, in the order random.Random(42)'s shuffles give.
    slots = static_slots(np.array([[0, 0, 1, 1]]), 2, 4)
    assert slots.tolist() == [[[0, 3], [1, 2], [1, 2], [0, 3]]]
    # The lowest local slot wins when a GPU holds two copies.
    assert static_slots(np.array([[1, 0, 0, 1]]), 2, 2).tolist() == [[[1, 0], [2, 3]]]


def test_round_robin_blocks_of_1024_ids() -> None:
    # Experts 0 and 1 each on slots (0, 2) and (1, 3). 1,025 ids of expert 0: block 0 sends 512 to
    # each copy; the one id of block 1 goes to replica (0 + 1) mod 2, slot 2 (GPU 1).
    layout = np.array([[0, 1, 0, 1]])
    traced_flow = routing([np.array([[1025, 0]])], [[np.zeros((1025, 1), dtype=np.int64)]])
    assert dispatch_loads("round-robin", layout, traced_flow, 2).tolist() == [[512.0, 513.0]]
    # From counts alone the 1,025 tokens are one block: ceil(1025 / 2) to replica 0.
    assert dispatch_loads("round-robin", layout, routing([np.array([[1025, 0]])]), 2).tolist() == [[513.0, 512.0]]


def test_unknown_model_and_rank_count_named() -> None:
    with pytest.raises(ValueError, match="^--dispatch must be one of even, static, round-robin, got 'random'$"):
        dispatch_loads("random", MAP, RANKS, 2)
    with pytest.raises(ValueError, match="^2 per-rank captures for --gpus 4"):
        dispatch_loads("even", np.array([[0, 1, 2, 0]]), RANKS, 4)
    with pytest.raises(ValueError, match="^--dispatch static needs per-source-rank counts"):
        place(np.array([[8, 3, 6]]), 2, 4, dispatch="static")


def test_docs_worked_example_prints_what_it_shows() -> None:
    text = DOCS.read_text()
    code = re.search(r"<!-- test: dispatch-example -->\s*```python\n(.*?)```", text, re.S).group(1)
    shown = re.search(r"<!-- test: dispatch-output -->\s*```\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOCS), "exec"), {})
    assert out.getvalue() == shown


def _rank_docs() -> list[dict]:
    # Rank 0 routes experts (5, 2, 1) tokens, rank 1 (3, 1, 5), top-1; one layer.
    return [traced(3, 1, [[[0]] * 5 + [[1]] * 2 + [[2]]]), traced(3, 1, [[[0]] * 3 + [[1]] + [[2]] * 5])]


def test_place_with_per_rank_captures(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    paths = [write_capture(tmp_path / f"r{i}.json", doc) for i, doc in enumerate(_rank_docs())]
    out = tmp_path / "p.json"
    assert main(["place", *paths, "--gpus", "2", "--slots", "4", "--dispatch", "static", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["inputs"]["capture"] == paths
    assert doc["dispatch"] == {"model": "static", "source_ranks": 2,
                               "static": "measured: one capture per source rank (2 ranks, rank i = file i)",
                               "why": None, "round_robin": "assumed: each layer's passes are one kernel call "
                               "(per-step calls restart the blocks and raise the figure)"}
    # Totals (8, 3, 6): the greedy gives expert 0 the spare slot: 4 | 4 with 3 and 6 to pack.
    phy2log = np.array(doc["physical_to_logical_map"])
    loads = {m: dispatch_loads(m, phy2log, routing([np.array([[5, 2, 1]]), np.array([[3, 1, 5]])]), 2)[0]
             for m in DISPATCH}
    layer = doc["layers"][0]["imbalance"]
    for model in DISPATCH:
        assert layer[model] == pytest.approx((loads[model].max() - 8.5) / 8.5, abs=0)
    # The trivial map 0 1 | 2 0: static 5 + 2 + 1 | 1 + 3 + 5, as the worked example.
    assert doc["layers"][0]["trivial_imbalance"] == {"even": 1.5 / 8.5, "static": 0.5 / 8.5, "round-robin": 1.5 / 8.5}
    capfd.readouterr()
    # Not G captures, or captures that do not fit together: exit 2 naming both.
    assert main(["place", *paths, "--gpus", "4", "--slots", "4"]) == 2
    assert capfd.readouterr().err == ("turbospark: 2 per-rank captures for --gpus 4: give one capture, "
                                      "or one per source rank (4)\n")
    other = write_capture(tmp_path / "x.json", traced(4, 1, [[[0]]]))
    assert main(["place", paths[0], other, "--gpus", "2", "--slots", "4"]) == 2
    assert capfd.readouterr().err == (f"turbospark: {other} (1 layers x 4 experts, top-1) does not fit "
                                      f"{paths[0]} (1 layers x 3 experts, top-1)\n")
    assert main(["place", *paths, "--gpus", "2", "--slots", "4", "--fit", "0.5"]) == 2
    assert capfd.readouterr().err == "turbospark: --fit and --batch take one capture, not several per-rank captures\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(DISPATCH), st.integers(1, 3), st.integers(0, 2))
def test_never_worse_than_published_under_its_model(seed: int, model: str, per_gpu_extra: int, skew: int) -> None:
    rng = np.random.default_rng(seed)
    gpus, experts, layers = 4, 8, 3
    slots = gpus * (experts // gpus + per_gpu_extra)
    scale = rng.permutation(np.arange(1, experts + 1, dtype=np.float64) ** -skew)
    ranks = [rng.poisson(50 * scale, size=(layers, experts)) for _ in range(gpus)]
    flow = routing(ranks)
    p = place(flow.counts.sum(axis=0), gpus, slots, dispatch=model, flow=flow)
    # Every expert placed, S/G slots per GPU (by the map's shape), replicas summing to S.
    assert (p.replicas >= 1).all() and (p.replicas.sum(axis=1) == slots).all()
    ours = dispatch_loads(model, p.phy2log, flow, gpus)
    published = dispatch_loads(model, p.greedy, flow, gpus)
    if model == "static":
        # SGLang's one generator couples the layers: the guarantee is on the mean imbalance, against
        # the published map and against the even-optimised placement, both evaluated under static.
        even = place(flow.counts.sum(axis=0), gpus, slots, dispatch="even", flow=flow).phy2log
        mean = [float(imbalance(x)[0].mean()) for x in (ours, published, dispatch_loads(model, even, flow, gpus))]
        assert mean[0] <= mean[1] and mean[0] <= mean[2]
    else:
        assert (ours.max(axis=1) <= published.max(axis=1)).all()
    # Whatever the model, every token lands somewhere.
    for other in DISPATCH:
        assert dispatch_loads(other, p.phy2log, flow, gpus).sum(axis=1) == pytest.approx(flow.total.sum(axis=1))


def test_divisor_placement_by_hand() -> None:
    # G = 2: one spare slot raises expert 0 (load 6) to 2 replicas; slots by share 3, 3, 3, 1:
    # expert 0 to GPU 0, its second copy to GPU 1 (GPU 0 holds one), expert 1 to GPU 0, expert 2 to GPU 1.
    layout = divisor_placement(np.array([[6, 3, 1]]), 4, 2)
    assert layout.tolist() == [[0, 1, 0, 2]]
    # Static, tokens spread evenly over the two ranks: rank 0 sends 3 + 1.5 local and expert 2's 0.5
    # to GPU 1; rank 1 keeps 3 + 0.5 and sends expert 1's 1.5 to GPU 0: 6 | 4, the even loads.
    flow = routing([np.array([[6, 3, 1]])])
    assert dispatch_loads("static", layout, flow, 2, assume_even=True).tolist() == [[6.0, 4.0]]
    assert dispatch_loads("even", layout, flow, 2).tolist() == [[6.0, 4.0]]


def test_divisor_shape_is_not_even_once_the_ranks_generators_diverge() -> None:
    # divisor_placement's map for these counts: replica counts 1 or 2 (dividing G = 4), replicas on
    # distinct GPUs. Expert 7 is on slots 0 (GPU 0) and 3 (GPU 1); ranks 2 and 3 lack it and draw
    # from their own generators, which earlier experts have advanced differently: both draw slot 0
    # (one rank each would be the even share), so GPU 0 serves three ranks' tokens of expert 7.
    counts = np.array([[16, 17, 42, 11, 34, 24, 58, 71]]) * 4
    layout = divisor_placement(counts, 12, 4)
    assert layout.tolist() == [[7, 2, 3, 7, 1, 4, 6, 5, 0, 6, 2, 4]]
    assert static_slots(layout, 8, 4)[0, :, 7].tolist() == [0, 3, 0, 0]
    flow = routing([counts])
    assert dispatch_loads("even", layout, flow, 4).tolist() == [[270.0, 278.0, 276.0, 268.0]]
    assert dispatch_loads("static", layout, flow, 4, assume_even=True).tolist() == [[341.0, 207.0, 276.0, 268.0]]


def test_divisor_shape_is_not_even_with_measured_ranks() -> None:
    # Expert 0 on GPUs 0 and 1 (2 divides 4), expert 1 on GPUs 2 and 3. Rank 2 keeps its 9 tokens
    # of expert 1 local; the even model would put half of them on GPU 3.
    layout = np.array([[0, 0, 1, 1]])
    flow = routing([np.array([[1, 1]]), np.array([[1, 1]]), np.array([[1, 9]]), np.array([[1, 1]])])
    assert replica_counts(layout, 2).tolist() == [[2, 2]]
    assert dispatch_loads("even", layout, flow, 4).tolist() == [[2.0, 2.0, 6.0, 6.0]]
    # Ranks 0 and 1 deal expert 1 one each (slots 3, 2 in their own draws), ranks 2, 3 expert 0.
    assert dispatch_loads("static", layout, flow, 4).tolist() == [[2.0, 2.0, 10.0, 2.0]]


def _generators(gpus: int, state: Any) -> list[random.Random]:
    out = [random.Random() for _ in range(gpus)]
    for rng in out:
        rng.setstate(state)
    return out


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1, 2]))
def test_static_search_scores_swaps_as_sglang_draws(seed: int, nodes: int) -> None:
    # The incremental scoring (ranks whose draws keep their shape reuse them) agrees with drawing
    # the whole layer again on every rank, loads and the generator states left after it.
    rng = np.random.default_rng(seed)
    gpus, experts, slots = 4, 8, 16
    counts = rng.poisson(30, size=(gpus, experts)).astype(np.float64)
    row = place(counts.sum(axis=0, keepdims=True), gpus, slots).phy2log[0]
    start = random.Random(SGLANG_SEED).getstate()
    layer = _Layer(row, counts, gpus, [start] * gpus, nodes)
    for _ in range(10):
        s, t = (int(v) for v in rng.integers(0, slots, size=2))
        trial = layer.swapped(s, t)
        again = _generators(gpus, start)
        assert np.allclose(trial.loads, static_layer_loads(trial.row, counts, gpus, again, nodes), rtol=1e-12)
        assert trial.ends == [g.getstate() for g in again]
        layer = trial
    searched = _generators(gpus, start)
    better = static_search(row, counts, gpus, searched, nodes)
    check = _generators(gpus, start)
    before = static_layer_loads(row, counts, gpus, check, nodes).max()
    check = _generators(gpus, start)
    assert static_layer_loads(better, counts, gpus, check, nodes).max() <= before
    assert [g.getstate() for g in check] == [g.getstate() for g in searched]
    assert np.array_equal(np.bincount(better, minlength=experts), np.bincount(row, minlength=experts))


def test_round_robin_per_step_restarts_the_blocks(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Expert 0 on slots 0 (GPU 0) and 2 (GPU 1); four passes routed to it. One kernel call: its
    # occurrences 0..3 go to replicas 0, 1, 0, 1. One call per pass: each is occurrence 0 of its
    # block 0, so replica 0 every time.
    layout = np.array([[0, 1, 0, 1]])
    trace = [np.zeros((4, 1), dtype=np.int64)]
    assert dispatch_loads("round-robin", layout, routing([np.array([[4, 0]])], [trace]), 2).tolist() == [[2.0, 2.0]]
    stepped = routing([np.array([[4, 0]])], [trace], [[np.arange(4)]], "--batch 1, consecutive passes")
    assert dispatch_loads("round-robin", layout, stepped, 2).tolist() == [[4.0, 0.0]]
    # Two steps of two passes: 0, 1 | 0, 1.
    halves = routing([np.array([[4, 0]])], [trace], [[np.array([0, 0, 1, 1])]], "--batch 2, consecutive passes")
    assert dispatch_loads("round-robin", layout, halves, 2).tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="^the engine steps do not match the trace's passes$"):
        routing([np.array([[4, 0]])], [trace], [[np.arange(3)]])
    # Through place --batch: the document says how round-robin's calls were taken.
    path = write_capture(tmp_path / "c.json", traced(2, 1, [[[0], [0], [0], [0], [1], [1], [1], [1]]]))
    out = tmp_path / "p.json"
    assert main(["place", path, "--gpus", "2", "--slots", "4", "--batch", "1", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dispatch"]["round_robin"] == "modelled: one kernel call per serving step (--batch 1, consecutive passes)"
    assert ("  round-robin dispatch: modelled: one kernel call per serving step (--batch 1, consecutive passes)"
            in capfd.readouterr().out.splitlines())


def test_trtllm_mtp_layers_get_rows(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", traced(2, 1, [[[0], [1]]]))
    yaml_path = tmp_path / "eplb.yaml"
    assert main(["place", path, "--gpus", "2", "--slots", "4", "--format", "trtllm", "--first-moe-layer", "3",
                 "--mtp-layers", "1", "-o", str(yaml_path)]) == 0
    # Decoder layers 0..2 dense, MoE layer 3 (the capture's), MTP layer 4 = num_hidden_layers + 0: trivial.
    text = yaml_path.read_text()
    assert text.splitlines()[2] == "  4: [0, 1, 0, 1]" and text.splitlines()[0] == "initial_global_assignments:"
    out = capfd.readouterr().out.splitlines()
    assert out[-2].endswith("(4 slots = 2 experts + 2 redundant; keys are decoder layers 3..3, then 1 MTP layers 4..4 "
                            "placed trivially)")
    assert main(["place", path, "--gpus", "2", "--format", "sglang", "--mtp-layers", "1", "-o", "-"]) == 2
    assert capfd.readouterr().err == ("turbospark: --mtp-layers applies to --format trtllm only (got --format sglang): "
                                      "SGLang's draft layers need no rows, turbospark's JSON holds the capture's "
                                      "MoE layers\n")
    assert main(["place", path, "--gpus", "2", "--format", "trtllm", "--mtp-layers", "-1", "-o", "-"]) == 2
    assert capfd.readouterr().err == "turbospark: --mtp-layers must be 0 or more, got -1\n"
