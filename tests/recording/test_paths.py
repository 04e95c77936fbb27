"""One capture file per process: {rank} and {pid} in the path, rank-suffixed paths under a launcher."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
from childproc import run_script
from conftest import require_module

import turbospark
from turbospark.recording import _paths


@pytest.fixture(autouse=True)
def _launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    _paths._warned.clear()


def test_placeholders(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    hist = turbospark.RouterHistogram(str(tmp_path / "cap-{rank}-{pid}.json"), 1, 4, 2)
    hist.discard()
    assert hist.path == str(tmp_path / f"cap-3-{os.getpid()}.json")


def test_rank_defaults_to_zero(tmp_path: Any) -> None:
    hist = turbospark.RouterHistogram(str(tmp_path / "r{rank}.json"), 1, 4, 2)
    hist.discard()
    assert hist.path == str(tmp_path / "r0.json")


def test_from_env_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "env-{rank}.json"))
    monkeypatch.setenv("RANK", "5")
    hist = turbospark.RouterHistogram.from_env(1, 4, 2)
    assert hist is not None
    hist.discard()
    assert hist.path == str(tmp_path / "env-5.json")


def test_other_ranks_write_beside_the_path_and_warn_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    path = str(tmp_path / "capture.json")
    with pytest.warns(RuntimeWarning) as caught:
        first = turbospark.RouterHistogram(path, 1, 4, 2)
    assert [str(w.message) for w in caught] == [
        f"WORLD_SIZE=4 and the capture path {path!r} has no {{rank}} or {{pid}}: "
        f"rank 2 writes {str(tmp_path / 'capture.rank2.json')!r} instead, so no rank overwrites another"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = turbospark.RouterHistogram(path, 1, 4, 2)
    for hist in (first, second):
        hist.discard()
        assert hist.path == str(tmp_path / "capture.rank2.json")


def test_rank_zero_keeps_the_path_silently(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    hist = turbospark.RouterHistogram(str(tmp_path / "capture.json"), 1, 4, 2)
    hist.discard()
    assert hist.path == str(tmp_path / "capture.json")


@pytest.mark.parametrize(
    ("path", "moved"),
    [("a/cap.json", "a/cap.rank7.json"), ("a/cap", "a/cap.rank7"), ("a/.hidden", "a/.hidden.rank7"),
     ("a.b/c.tar.gz", "a.b/c.tar.rank7.gz")],
)
def test_beside(path: str, moved: str) -> None:
    assert _paths.beside(path, 7) == moved


def test_unparsable_rank_warns_and_reads_zero(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "two")
    with pytest.warns(RuntimeWarning, match="ignoring RANK='two': not a non-negative integer"):
        hist = turbospark.RouterHistogram(str(tmp_path / "r{rank}.json"), 1, 4, 2)
    hist.discard()
    assert hist.path == str(tmp_path / "r0.json")


def test_every_rank_of_a_launch_keeps_its_file(tmp_path: Any) -> None:
    results = []
    for rank in range(3):
        results.append(run_script(
            tmp_path,
            f"""
            hist = R.from_env(1, 4, 2)
            hist.record(0, [{rank}, 3])
            assert 'torch' not in sys.modules
            """,
            env={"TURBOSPARK_ROUTER_HIST": str(tmp_path / "cap.json"), "RANK": str(rank), "WORLD_SIZE": "3"},
        ))
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr
        name = "cap.json" if rank == 0 else f"cap.rank{rank}.json"
        assert f"[router-hist] wrote {tmp_path / name}" in result.stderr
        assert ("RuntimeWarning" in result.stderr) == (rank != 0)
        assert turbospark.load(tmp_path / name).counts[0].tolist() == [int(rank == e) + int(e == 3) for e in range(4)]


def test_torch_distributed_rank_wins(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = require_module("torch")
    dist = torch.distributed
    monkeypatch.setenv("RANK", "9")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        hist = turbospark.RouterHistogram(str(tmp_path / "r{rank}.json"), 1, 4, 2)
        hist.discard()
        assert hist.path == str(tmp_path / "r0.json")
        assert _paths.rank_and_world() == (0, 1)
    finally:
        dist.destroy_process_group()


def test_placeholders_in_the_directory_are_resolved_before_the_destination_check(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 16 item 12: the check ran on the template, so run-{rank}/ did not exist.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    (tmp_path / "run-2").mkdir()
    hist = turbospark.RouterHistogram(str(tmp_path / "run-{rank}" / "cap.json"), 1, 4, 2)
    hist.discard()
    assert hist.path == str(tmp_path / "run-2" / "cap.json")
    monkeypatch.setenv("TURBOSPARK_ROUTER_HIST", str(tmp_path / "run-{rank}" / "env.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = turbospark.RouterHistogram.from_env(1, 4, 2)
    assert env is not None
    env.discard()
    # A directory the resolved path names but that does not exist is still refused, by its resolved name.
    with pytest.raises(FileNotFoundError) as info:
        turbospark.RouterHistogram(str(tmp_path / "other-{rank}" / "cap.json"), 1, 4, 2)
    assert str(tmp_path / "other-2" / "cap.json") in str(info.value)
