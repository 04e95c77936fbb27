"""The README's "Recording from torch" examples, run as written."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from conftest import require_module
from readme_blocks import block

import turbospark

torch = require_module("torch")


def _run(marker: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(block(marker), f"README:{marker}", "exec"), namespace)  # noqa: S102 -- the README's own code
    return namespace


def test_cpu_tensors_masks_sequences(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: Any) -> None:
    _run('RouterHistogram("batched.json"', tmp_path, monkeypatch)
    assert (tmp_path / "batched.json").read_text() == (
        '{"num_layers":2,"num_experts":8,"top_k":2,"counts":[[2,2,1,2,2,2,1,0],[0,1,2,0,0,0,0,1]],'
        '"trace":[[3,5,0,1,4,5,0,2,4,6,1,3],[1,2,2,7]],'
        '"seq":[[0,10,11,10,11,12],[0,0]],"phase":[[1,0,0,1,1,1],[1,1]]}'
    )
    assert capfd.readouterr().err == "[router-hist] wrote batched.json\n"


def test_device_path(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: Any) -> None:
    torch.manual_seed(0)
    namespace = _run('RouterHistogram("device.json"', tmp_path, monkeypatch)
    capture = turbospark.load(tmp_path / "device.json")
    assert capture.counts.sum(axis=1).tolist() == [2 * 2 * 5] * 4  # 2 valid rows x top-2 x 5 steps
    assert [row.tolist() for row in capture.seq] == [[0, 1] * 5] * 4
    assert [row.tolist() for row in capture.phase] == [[1] * 10] * 4
    assert namespace["dev"].staged_rows == 0
    assert capfd.readouterr().err == "[router-hist] wrote device.json\n"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_cuda_graph_example(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run('RouterHistogram("graphed.json"', tmp_path, monkeypatch)
    capture = turbospark.load(tmp_path / "graphed.json")
    assert capture.counts.sum(axis=1).tolist() == [5 * 2 * 10] * 4
    assert [row.shape for row in capture.trace] == [(50, 2)] * 4


@pytest.mark.parametrize("rank", [0, 1])
def test_one_file_per_process(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: Any, rank: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TURBOSPARK_ROUTER_HIST", raising=False)
    _run('"routing-{rank}.json"', tmp_path, monkeypatch)
    out, err = capfd.readouterr()
    assert out == f"routing-{rank}.json\n"
    assert err == f"[router-hist] wrote routing-{rank}.json\n"
    assert (tmp_path / f"routing-{rank}.json").exists()
