"""The SGLang replay against SGLang 0.5.23's own code from its wheel (tests/sglang_eplb_harness.py): its
rebalance algorithms on the same window loads, the static dispatch a rearrangement installs on every rank,
and its whole EPLB loop (manager, recorder buffer, algorithm, metadata update, dispatch) run rank by rank
with the flags ``turbospark rebalance --engine sglang`` prints.

Needs torch and the wheel: ``TURBOSPARK_SGLANG_WHEEL`` names the .whl
(``pip download --no-deps sglang==0.5.23``). Without either the tests skip saying
so, and under ``CI=true`` fail (conftest's ``skip_or_fail``). Maps must be equal,
element for element; loads are integers, so the per-step figures are equal too.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shlex
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Optional

import numpy as np
import pytest

from conftest import require_module, skip_or_fail

torch = require_module("torch")

import sglang_eplb_harness  # noqa: E402
import vllm_eplb_harness  # noqa: E402
from placement_helpers import traced, write_capture  # noqa: E402

from turbospark.capture.reader import Capture  # noqa: E402
from turbospark.cli import main  # noqa: E402
from turbospark.rebalance import sglang_policy  # noqa: E402
from turbospark.rebalance.replay import Setting, replay  # noqa: E402
from turbospark.rebalance.steps import form_steps  # noqa: E402
from turbospark.rebalance.sweep import engine_flags  # noqa: E402

WHEEL_VARIABLE = "TURBOSPARK_SGLANG_WHEEL"


@pytest.fixture(scope="module")
def wheel() -> str:
    path = os.environ.get(WHEEL_VARIABLE)
    if not path or not Path(path).is_file():
        skip_or_fail(f"{WHEEL_VARIABLE} does not name SGLang's wheel ({path!r}): "
                     "pip download --no-deps sglang==0.5.23, then set it to the .whl", optional_as="sglang")
    return path


@pytest.fixture(scope="module")
def loop(wheel: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sglang_eplb_harness.Loop]:
    loaded = sglang_eplb_harness.Loop(wheel, tmp_path_factory.mktemp("sglang-eplb"))
    yield loaded
    loaded.close()


def _geometry(rng: np.random.Generator) -> tuple[int, int, Optional[int], int, int]:
    """(G, nodes, groups or None, E, S): every divisibility SGLang asserts holds."""
    gpus = int(rng.choice([1, 2, 4, 8]))
    nodes = int(rng.choice([n for n in (1, 2, 4) if gpus % n == 0]))
    groups = [None, 1, 2, 4, 8][int(rng.integers(0, 5))]
    step = groups or 1
    experts = step * int(rng.integers(1, 5)) * 2
    while experts % gpus:
        experts += step
    slots = (-(-experts // gpus) + int(rng.integers(0, 4))) * gpus
    return gpus, nodes, groups, experts, slots


@pytest.mark.parametrize("seed", range(200))
def test_placements_equal_the_wheel_algorithm(loop: sglang_eplb_harness.Loop, seed: int) -> None:
    # Small integer counts tie often: the order of equal loads is torch's std::sort, also among one
    # expert's replicas (it reaches log2phy, the order the dispatch lists an expert's slots in).
    rng = np.random.default_rng(seed)
    gpus, nodes, groups, experts, slots = _geometry(rng)
    buffered = rng.integers(0, int(rng.choice([1, 3, 50, 100000])), size=(int(rng.integers(1, 4)),
                                                                          int(rng.integers(1, 4)), experts))
    algorithms = loop.modules["eplb_algorithms"]
    chosen = algorithms.compute_algorithm(raw_algorithm="auto", num_groups=groups, num_nodes=nodes)
    assert chosen.name == sglang_policy.algorithm(groups, nodes)
    phy2log, log2phy, _ = algorithms.rebalance_experts(
        tokens_per_expert=torch.from_numpy(buffered).to(torch.int32), num_physical_experts=slots,
        num_local_physical_experts=slots // gpus, num_groups=groups, num_nodes=nodes, algorithm=chosen)
    ours = sglang_policy.rebalance_experts(buffered.sum(axis=0), slots, groups, nodes, gpus)
    assert ours[0].tolist() == phy2log.tolist()
    assert ours[1].tolist() == log2phy.tolist()


def test_large_rows_with_ties_follow_torchs_sort(loop: sglang_eplb_harness.Loop) -> None:
    # 288 slots on 8 GPUs: 36 a GPU, past std::sort's 16-item insertion sort; an all-zero row (a dense
    # layer's window) and ties everywhere. A stable sort gives another map (checked below).
    weight = np.stack([np.zeros(256, dtype=np.int64), np.random.default_rng(3).integers(0, 3, 256),
                       np.repeat([5, 1], 128)])
    algorithms = loop.modules["eplb_algorithms"]
    phy2log, log2phy, _ = algorithms.rebalance_experts(
        tokens_per_expert=torch.from_numpy(weight)[None], num_physical_experts=288, num_local_physical_experts=36,
        num_groups=8, num_nodes=2, algorithm=algorithms.EplbAlgorithm.deepseek_hierarchical)
    ours = sglang_policy.rebalance_experts(weight, 288, 8, 2, 8)
    assert (ours[0].tolist(), ours[1].tolist()) == (phy2log.tolist(), log2phy.tolist())
    stable = torch.from_numpy(weight).float().sort(dim=-1, descending=True, stable=True).indices
    assert stable.tolist() != torch.from_numpy(weight).float().sort(-1, descending=True).indices.tolist()


def test_pack_weights_add_up_as_python_floats(loop: sglang_eplb_harness.Loop) -> None:
    # SGLang's balanced_packing sums weight.tolist() (float64); the published EPLB sums float32 tensors.
    # On this window the two pick different packs: SGLang's map is the float64 one.
    from turbospark.placement._greedy import hierarchical

    weight = np.array([[11, 5, 3, 6, 2, 10, 14, 4]])
    algorithms = loop.modules["eplb_algorithms"]
    phy2log, _, _ = algorithms.rebalance_experts(
        tokens_per_expert=torch.from_numpy(weight)[None], num_physical_experts=16, num_local_physical_experts=4,
        num_groups=None, num_nodes=1, algorithm=algorithms.EplbAlgorithm.deepseek)
    assert sglang_policy.rebalance_experts(weight, 16, None, 1, 4)[0].tolist() == phy2log.tolist()
    published = hierarchical(weight.astype(np.float32), 16, 1, 1, 4, replicas_interchangeable=False)[0]
    assert published.tolist() != phy2log.tolist()


DISPATCH_CASES = [  # (seed, G, nodes, groups, E, S, dense layers)
    (0, 4, 1, None, 8, 12, 0), (1, 8, 1, 4, 16, 24, 2), (2, 8, 2, 4, 16, 32, 0), (3, 4, 2, None, 8, 16, 1),
    (4, 16, 4, 8, 32, 48, 3), (5, 2, 1, None, 4, 6, 0),
]


@pytest.mark.parametrize("seed, gpus, nodes, groups, experts, slots, dense", DISPATCH_CASES)
def test_every_rank_installs_the_dispatch_of_the_replay(loop: sglang_eplb_harness.Loop, seed: int, gpus: int,
                                                        nodes: int, groups: Optional[int], experts: int, slots: int,
                                                        dense: int) -> None:
    # ExpertLocationMetadata.init_by_eplb, on each rank, from the same window: the rank's static dispatch
    # map, MoE rows, against the shared-generator map carried through the dense rows first.
    rng = np.random.default_rng(seed)
    layers = 3
    window = np.concatenate([np.zeros((dense, experts), dtype=np.int64),
                             rng.integers(0, 6, size=(layers, experts))])
    engine = loop.engine
    engine.serve(f"--tp {gpus} --ep-size {gpus} --moe-a2a-backend deepep --ep-num-redundant-experts "
                 f"{slots - experts}" + (f" --nnodes {nodes}" if nodes > 1 else ""), dense + layers, experts)
    engine.config.hf.num_groups = groups
    location = loop.modules["expert_location"]
    theirs = []
    for rank in range(gpus):
        loop._become(rank, SimpleNamespace(expert_location_metadata=None))
        metadata = location.ExpertLocationMetadata.init_by_eplb(SimpleNamespace(hf_config=engine.config.hf),
                                                                torch.from_numpy(window)[None].to(torch.int32))
        theirs.append(metadata.logical_to_rank_dispatch_physical_map[dense:].tolist())
    _, log2phy = sglang_policy.rebalance_experts(window, slots, groups, nodes, gpus)
    rng_shared = sglang_policy.generator()
    rows = [sglang_policy.dispatch_layer(table, slots, gpus, nodes, rng_shared) for table in log2phy]
    assert np.stack(rows[dense:]).transpose(1, 0, 2).tolist() == theirs


def _base(seed: int, layers: int, experts: int, passes: int) -> list[np.ndarray]:
    return list(vllm_eplb_harness.drifting(seed, layers, experts, 2, passes).trace)


def _spread(base: list[np.ndarray], gpus: int) -> Capture:
    """The capture of G ranks each routing ``base``'s passes: every pass G times, consecutively."""
    trace = tuple(np.repeat(rows, gpus, axis=0) for rows in base)
    experts = int(max(rows.max() for rows in base)) + 1
    counts = np.stack([np.bincount(rows.ravel(), minlength=experts) for rows in trace])
    return Capture(len(trace), experts, trace[0].shape[1], counts, trace=trace)


def _served(flags: str) -> str:
    """The server flags of a printed SGLang command: after the model path, before the remark."""
    return flags.split(" --model-path MODEL ", 1)[1].split(" (", 1)[0]


LOOP_CASES = [  # (seed, G, nodes, groups, R, W, I, batch, dense layers)
    (0, 4, 1, None, 4, 3, 6, 5, 2), (1, 4, 2, None, 8, 6, 6, 3, 0), (2, 8, 1, None, 8, 2, 5, 4, 1),
    (3, 2, 1, None, 0, 4, 4, 6, 0), (4, 4, 1, 4, 4, 5, 7, 4, 3), (5, 8, 2, 2, 8, 1, 3, 2, 1),
]


@pytest.mark.parametrize("seed, gpus, nodes, groups, redundant, window, interval, batch, dense", LOOP_CASES)
def test_replay_equals_sglangs_own_loop(loop: sglang_eplb_harness.Loop, seed: int, gpus: int, nodes: int,
                                        groups: Optional[int], redundant: int, window: int, interval: int,
                                        batch: int, dense: int) -> None:
    # Every rank routes the same passes (so each expert's tokens are spread evenly over the ranks, as the
    # replay of one capture assumes); SGLang is served the flags turbospark prints for the setting.
    experts = 8
    base = _base(seed, 3, experts, 90)
    setting = Setting("sglang", redundant, window, interval)
    flags = _served(engine_flags(setting, gpus, experts, nodes))
    series, done = loop.run(flags, base, batch, dense, experts, groups)
    capture = _spread(base, gpus)
    (result,) = replay(capture, form_steps(capture, batch * gpus), gpus, [setting], groups=groups or 1, nodes=nodes,
                       first_layer=dense)
    assert len(done) >= 2
    assert result.steps == [step for step, _ in done]
    assert [m.tolist() for m in result.maps] == [m for _, m in done]
    assert [None if x != x else x for x in result.series.tolist()] == series
    moved = [int((np.array(b) != np.array(a)).sum()) for a, b in
             zip([[[s % experts for s in range(experts + redundant)]] * 3] + [m for _, m in done], [m for _, m in done])]
    assert result.moved.tolist() == moved


def test_the_recommended_command_runs_in_sglangs_loop(loop: sglang_eplb_harness.Loop, tmp_path: Path) -> None:
    # turbospark rebalance --engine sglang --sweep: the command it recommends, served to SGLang's loop,
    # gives the rearrangements and per-step figures the document holds for that setting.
    gpus, experts, batch = 4, 8, 3
    base = _base(7, 2, experts, 96)
    capture = _spread(base, gpus)
    path = write_capture(tmp_path / "c.json", traced(experts, 2, [t.tolist() for t in capture.trace]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["rebalance", path, "--gpus", str(gpus), "--batch", str(batch * gpus), "--engine", "sglang",
                     "--num-redundant-experts", "0,4", "--step-interval", "4,8", "--window-size", "2,4", "--sweep",
                     "--first-moe-layer", "1", "--json"])
    assert code == 0
    doc = json.loads(out.getvalue())
    chosen = doc["settings"][doc["recommended"]]
    series, done = loop.run(_served(doc["recommended_flags"]), base, batch, 1, experts)
    assert [(r["step"], r["physical_to_logical_map"]) for r in chosen["rearrangements"]] == done
    assert chosen["series"] == series


def test_printed_flags_are_sglangs_server_arguments(wheel: str) -> None:
    # Each --flag of the printed command is the command-line name SGLang 0.5.23 gives a field of its
    # server arguments (arg_groups/fields/*.py; arg_utils.py's _field_to_cli_name, no cli_name of its
    # own), a valueless one a bool field.
    fields: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
                for node in ast.walk(ast.parse(archive.read(name).decode())):
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                        fields[node.target.id] = ast.unparse(node.annotation)
    text = _served(engine_flags(Setting("sglang", 32, 500, 1000), 16, 256, 2))
    words = shlex.split(text)
    for index, word in enumerate(words):
        if word.startswith("--"):
            field = word[2:].replace("-", "_")
            assert field in fields and "cli_name=" not in fields[field], word
            valueless = index + 1 == len(words) or words[index + 1].startswith("--")
            assert fields[field].startswith("A[bool") == valueless, (word, fields[field])
    assert text == ("--tp-size 16 --ep-size 16 --moe-a2a-backend deepep --ep-dispatch-algorithm static --enable-eplb "
                    "--ep-num-redundant-experts 32 --eplb-rebalance-num-iterations 1000 "
                    "--expert-distribution-recorder-buffer-size 500 --nnodes 2")
