"""``turbospark rebalance --dask``: the sweep's settings as Dask tasks give the serial sweep's document byte
for byte (every engine, a streamed capture too); a capture changed mid-job and a scheduler that does not
answer are refused naming them."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import vllm_eplb_harness
from conftest import require_module
from placement_helpers import traced, write_capture
from turbospark.cli import main
from turbospark.metrics import distributed as distributed_module
from turbospark.rebalance.distributed import setting_task, shares
from turbospark.rebalance.replay import Setting


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A LocalCluster of 2 single-threaded workers in this process, reachable over TCP like any scheduler."""
    distributed = require_module("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _capture_file(tmp_path: Path) -> str:
    capture = vllm_eplb_harness.drifting(4, 3, 8, 2, 72)
    return write_capture(tmp_path / "c.json", traced(8, 2, [t.tolist() for t in capture.trace]))


SWEEPS = [
    ["--num-redundant-experts", "0,4", "--window-size", "2,5", "--step-interval", "3,8", "--drift", "4"],
    ["--engine", "turbospark", "--num-redundant-experts", "4", "--window-size", "3", "--step-interval", "4,6",
     "--max-moves", "1,3"],
    ["--engine", "sglang", "--num-redundant-experts", "0,4", "--window-size", "2", "--step-interval", "3,5,8",
     "--first-moe-layer", "2", "--groups", "2"],
]


@pytest.mark.parametrize("sweep", SWEEPS, ids=["vllm", "turbospark", "sglang"])
def test_dask_sweep_is_the_serial_sweep_byte_for_byte(tmp_path: Path, scheduler: str, sweep: list[str]) -> None:
    common = ["rebalance", _capture_file(tmp_path), "--gpus", "4", "--batch", "3", "--sweep", "--expert-bytes", "7",
              *sweep]
    serial = _run([*common, "--json"])
    assert serial[0] == 0 and serial[1].startswith('{"capture":')
    assert _run([*common, "--json", "--dask", scheduler]) == serial
    table = _run(common)
    assert _run([*common, "--dask", scheduler, "-o", str(tmp_path / "d.json")]) == table
    assert (tmp_path / "d.json").read_text() == serial[1]


def test_dask_local_and_a_streamed_capture(tmp_path: Path) -> None:
    # A LocalCluster of worker processes started and closed for the job, each reading the sidecar itself.
    require_module("distributed")
    from turbospark import RouterHistogram

    path = str(tmp_path / "s.json")
    rng = np.random.default_rng(1)
    hist = RouterHistogram(path, 2, 8, 2, trace="stream")
    for _ in range(60):
        for layer in range(2):
            hist.record(layer, rng.choice(8, 2, replace=False).tolist())
    hist.close()
    common = ["rebalance", path, "--gpus", "4", "--batch", "4", "--engine", "sglang", "--num-redundant-experts", "4",
              "--step-interval", "3,5", "--sweep", "--json"]
    serial = _run(common)
    assert serial[0] == 0
    assert _run([*common, "--dask", "local"]) == serial


def test_shares_are_contiguous_and_even() -> None:
    settings = [Setting("vllm", r, 2, 4) for r in range(7)]
    assert [[s.redundant for s in part] for part in shares(settings, 3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [len(part) for part in shares(settings, 10)] == [1] * 7
    assert shares(settings, 0) == [settings]


def test_local_workers_keep_glibcs_malloc_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Dask's MALLOC_TRIM_THRESHOLD_=65536 made every large numpy temporary fault its pages in again: the
    # replay ran 3-4x slower in a worker. --dask local's workers start without it.
    require_module("distributed")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    client, cluster = distributed_module.connect("local", "rebalance")
    try:
        seen = client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_")
        assert len(seen) == (os.cpu_count() or 1) and set(seen.values()) == {None}
    finally:
        client.close()
        cluster.close()


def test_a_capture_changed_during_the_job_is_refused(tmp_path: Path) -> None:
    path = _capture_file(tmp_path)
    _, version = distributed_module.load_version(path)
    os.utime(path, ns=(1, 1))
    with pytest.raises(ValueError) as caught:
        setting_task(path, False, version, 3, 4, [Setting("vllm", 0, 2, 4)], 1, 1, 0)
    assert str(caught.value) == (f"{path} changed while the sweep ran (rewritten, or a live capture that grew): "
                                 "run it again on a finished capture")


def test_dask_errors_exit_2_naming_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_module("distributed")
    monkeypatch.setattr(distributed_module, "CONNECT_TIMEOUT", "1s")  # port 9 answers nothing: do not wait 10 s
    path = _capture_file(tmp_path)
    code, out, err = _run(["rebalance", path, "--gpus", "4", "--batch", "3", "--dask", "tcp://127.0.0.1:9"])
    assert (code, out) == (2, "")
    assert err.startswith("turbospark: cannot reach the Dask scheduler at 'tcp://127.0.0.1:9': ")
    missing = str(tmp_path / "nope.json")
    assert _run(["rebalance", missing, "--gpus", "4", "--batch", "3", "--dask", "tcp://127.0.0.1:9"]) == (
        2, "", f"turbospark: cannot read {missing}: No such file or directory\n")
    assert _run(["rebalance", path, "--gpus", "4", "--batch", "3", "--num-redundant-experts", "1", "--dask",
                 "tcp://127.0.0.1:9"]) == (2, "", "turbospark: 8 experts + 1 redundant = 9 slots, not divisible by "
                                                  "--gpus 4\n")
    monkeypatch.setitem(sys.modules, "distributed", None)  # dask not installed
    code, out, err = _run(["rebalance", path, "--gpus", "4", "--batch", "3", "--dask", "local"])
    assert (code, out) == (2, "")
    assert err.startswith("turbospark: rebalance --dask needs dask distributed (")
    assert err.endswith("); install it with pip install 'turbospark[dask]'\n")
