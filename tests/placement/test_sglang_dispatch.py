"""Static dispatch against SGLang 0.5.23's own code: the wheel's eplb modules (tests/sglang_harness.py)
run once per source rank on placement files turbospark writes, as each server rank runs them.

Needs torch and the wheel: ``TURBOSPARK_SGLANG_WHEEL`` names the .whl
(``pip download --no-deps sglang==0.5.23``). Without either the tests skip
saying so, and under ``CI=true`` fail (conftest's ``skip_or_fail``).
Counts are integers (and, for the even-spread assumption of one capture,
multiples of G), so every load is an exact float and the figures must be
equal, not close.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import require_module, skip_or_fail

require_module("torch")

import sglang_harness  # noqa: E402
from placement_helpers import write_capture  # noqa: E402

from turbospark.cli import main  # noqa: E402
from turbospark.placement.dispatch import dispatch_loads, routing, static_slots  # noqa: E402
from turbospark.placement.formats import sglang_text  # noqa: E402

WHEEL_VARIABLE = "TURBOSPARK_SGLANG_WHEEL"


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sglang_harness.Engine]:
    wheel = os.environ.get(WHEEL_VARIABLE)
    if not wheel or not Path(wheel).is_file():
        skip_or_fail(f"{WHEEL_VARIABLE} does not name SGLang's wheel ({wheel!r}): "
                     "pip download --no-deps sglang==0.5.23, then set it to the .whl", optional_as="sglang")
    engine = sglang_harness.load(wheel, tmp_path_factory.mktemp("sglang"))
    yield engine
    engine.close()


def _flags(gpus: int, slots: int, experts: int, path: Path, nodes: int = 1) -> str:
    return (f"--tp {gpus} --ep-size {gpus} --moe-a2a-backend deepep --ep-num-redundant-experts {slots - experts} "
            f"--init-expert-location {path}" + (f" --nnodes {nodes}" if nodes > 1 else ""))


def _random_map(rng: np.random.Generator, layers: int, experts: int, slots: int) -> np.ndarray:
    rows = []
    for _ in range(layers):
        row = np.concatenate([np.arange(experts), rng.integers(0, experts, slots - experts)])
        rng.shuffle(row)
        rows.append(row)
    return np.array(rows)


def _imbalance(loads: np.ndarray) -> list[float]:
    return ((loads.max(axis=-1) - loads.mean(axis=-1)) / loads.mean(axis=-1)).tolist()


CASES = [  # (seed, G, nodes, E, S, dense layers D)
    (0, 4, 1, 8, 12, 0), (1, 8, 1, 16, 24, 0), (2, 8, 1, 16, 32, 3), (3, 4, 1, 8, 16, 2),
    (4, 8, 2, 16, 24, 0), (5, 16, 2, 16, 32, 1), (6, 8, 4, 8, 16, 0), (7, 4, 2, 4, 8, 2),
    (8, 2, 1, 4, 6, 1), (9, 8, 1, 8, 8, 2),
]


@pytest.mark.parametrize("seed, gpus, nodes, experts, slots, dense", CASES)
def test_random_placements_dispatch_as_sglang(sglang: sglang_harness.Engine, tmp_path: Path, seed: int, gpus: int,
                                              nodes: int, experts: int, slots: int, dense: int) -> None:
    # Random maps hold one-slot experts, several copies on one GPU and replicas spread over nodes.
    rng = np.random.default_rng(seed)
    layers = 3
    phy2log = _random_map(rng, layers, experts, slots)
    path = tmp_path / "placement.json"
    path.write_text(sglang_text(phy2log, dense))
    sglang.serve(_flags(gpus, slots, experts, path, nodes), dense + layers, experts)
    theirs = sglang.rank_maps()[:, dense:]
    assert np.array_equal(static_slots(phy2log, experts, gpus, nodes, dense), theirs.transpose(1, 0, 2))
    # Measured per-rank counts, and one capture's counts assumed spread evenly (multiples of G).
    ranks = [rng.integers(0, 50, size=(layers, experts)) for _ in range(gpus)]
    ours = dispatch_loads("static", phy2log, routing(ranks), gpus, nodes=nodes, first_layer=dense)
    assert ours.tolist() == sglang_harness.gpu_loads(theirs, np.stack(ranks), slots).tolist()
    total = rng.integers(0, 50, size=(layers, experts)) * gpus
    even = dispatch_loads("static", phy2log, routing([total]), gpus, True, nodes=nodes, first_layer=dense)
    sent = np.broadcast_to(total // gpus, (gpus, layers, experts))
    assert even.tolist() == sglang_harness.gpu_loads(theirs, sent, slots).tolist()


def test_one_slot_experts_and_local_copies_draw_nothing(sglang: sglang_harness.Engine, tmp_path: Path) -> None:
    # Layer 0: expert 0 has one slot, expert 1 a copy on every GPU: no rank draws. Layer 1 then
    # gets the untouched Random(42) on every rank; 91cfe79 had shuffled for both and differed.
    phy2log = np.array([[0, 1, 1, 2, 1, 3, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3]])
    path = tmp_path / "placement.json"
    path.write_text(sglang_text(phy2log))
    sglang.serve(_flags(4, 8, 4, path), 2, 4)
    theirs = sglang.rank_maps()
    assert theirs[:, 0].tolist() == [[0, 1, 3, 5], [0, 2, 3, 5], [0, 4, 3, 5], [0, 6, 3, 5]]
    assert np.array_equal(static_slots(phy2log, 4, 4), theirs.transpose(1, 0, 2))


def _place(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["place", *args])
    return code, out.getvalue() + err.getvalue()


def _printed_flags(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("SGLang: "))
    return line[len("SGLang: "):line.index(" (")]


@pytest.mark.parametrize("ranks, nodes, dense", [(1, 1, 0), (8, 1, 0), (8, 1, 3), (8, 2, 0), (1, 2, 2)])
def test_place_reports_sglangs_figures(sglang: sglang_harness.Engine, tmp_path: Path, ranks: int, nodes: int,
                                      dense: int) -> None:
    # turbospark place --dispatch static (optimised for it), the SGLang file and the flags it prints,
    # loaded by SGLang rank by rank: the document's per-layer static imbalance, its mean and the
    # printed figure are SGLang's.
    gpus, experts, slots, layers = 8, 16, 24, 4
    rng = np.random.default_rng(ranks * 10 + nodes + dense)
    popularity = rng.permutation(np.arange(1, experts + 1) ** -1.0)
    counts = [rng.poisson(400 * popularity, size=(layers, experts)) * (gpus if ranks == 1 else 1) for _ in range(ranks)]
    paths = [write_capture(tmp_path / f"r{i}.json", {"num_layers": layers, "num_experts": experts, "top_k": 1,
                                                      "counts": c.tolist()}) for i, c in enumerate(counts)]
    common = [*paths, "--gpus", str(gpus), "--slots", str(slots), "--dispatch", "static", "--nodes", str(nodes),
              "--first-moe-layer", str(dense)]
    out = tmp_path / "sglang.json"
    code, printed = _place([*common, "--format", "sglang", "-o", str(out)])
    assert code == 0, printed
    code, text = _place([*common, "-o", str(tmp_path / "doc.json")])
    assert code == 0, text
    doc = json.loads((tmp_path / "doc.json").read_text())
    rows = json.loads(out.read_text())["physical_to_logical_map"]
    assert rows[dense:] == doc["physical_to_logical_map"]
    flags = _printed_flags(printed)
    sglang.serve(flags, dense + layers, experts)
    # SGLang's own rule for DeepEP sets ep_size to tp_size: the printed --tp must be G.
    assert (sglang.config.parallel.ep_size, sglang.config.parallel.nnodes) == (gpus, nodes)
    maps = sglang.rank_maps()[:, dense:]
    sent = np.stack(counts) if ranks > 1 else np.broadcast_to(counts[0] // gpus, (gpus, layers, experts))
    figures = _imbalance(sglang_harness.gpu_loads(maps, sent, slots))
    assert [row["imbalance"]["static"] for row in doc["layers"]] == figures
    mean = math.fsum(figures) / len(figures)
    assert doc["summary"]["imbalance"]["static"] == mean
    assert re.search(r"static \(the default with DeepEP\) gives imbalance ([0-9.]+)", printed).group(1) == f"{mean:.3f}"


def test_printed_flags_before_the_fix_gave_sglang_another_ep_size(sglang: sglang_harness.Engine, tmp_path: Path) -> None:
    # 91cfe79 printed --ep-size G without --tp: under DeepEP SGLang sets ep_size to tp_size (1).
    path = tmp_path / "p.json"
    path.write_text(sglang_text(np.array([[0, 1, 2, 3]])))
    sglang.serve(f"--ep-size 4 --moe-a2a-backend deepep --init-expert-location {path}", 1, 4)
    assert sglang.config.parallel.ep_size == 1

