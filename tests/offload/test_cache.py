"""``turbospark cache``: every policy against a brute-force simulation written from the definitions,
Belady against exhaustive search, properties, prefetch accounting by hand, the JSON shape, the CLI."""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark.offload import _cache_py
from turbospark.offload.cache import (
    NO_PREDICTIONS, NO_TRACE, _kernel, cache_report, default_slots, parse_policies, parse_slots,
    simulate_cache,
)
from turbospark.capture.reader import loads
from turbospark.cli import main
from turbospark.cli._cache import cache_lines, parse_bytes

from childproc import run_python
from conftest import require_module
from placement_helpers import traced, write_capture

Rows = list[list[int]]


# --- brute force, from docs/cache.md alone ------------------------------------------------------

def brute(rows: Rows, slots: int, policy: str, pred: Optional[Rows] = None) -> tuple[int, int, int, int, int]:
    """(needed, hits, loads, prefetched, useful) by the definitions, with no precomputation.

    LRU keeps the cache as a list from least to most recently used (a pass's
    experts appended in ascending id, so a lower id counts as older); LFU and
    Belady pick the victim by scanning; Belady looks up the next use by
    scanning the rest of the trace at each eviction.
    """
    base = policy.partition("+")[2] or policy
    cache: list[int] = []
    uses: dict[int, int] = {}
    last: dict[int, int] = {}
    needed = hits = loads = prefetched = useful = 0

    def next_use(x: int, t: int) -> float:
        return next((u for u in range(t + 1, len(rows)) if x in rows[u]), float("inf"))

    def admit(wanted: list[int], t: int, clock: int) -> set[int]:
        loaded = set()
        for x in wanted:
            if x in cache:
                continue
            if len(cache) == slots:
                free = [y for y in cache if y not in wanted]
                if base == "lru":
                    victim = free[0]
                elif base == "lfu":
                    victim = min(free, key=lambda y: (uses.get(y, 0), last[y], y))
                else:
                    victim = max(free, key=lambda y: (next_use(y, t), -y))
                cache.remove(victim)
            cache.append(x)
            loaded.add(x)
        for x in sorted(wanted):  # used now: most recent, lower id older
            cache.remove(x)
            cache.append(x)
            last[x] = clock
        return loaded

    for t, row in enumerate(rows):
        fetched: set[int] = set()
        if pred is not None and t < len(pred):
            fetched = admit(sorted(set(pred[t])), t, 2 * t)
            prefetched += len(fetched)
        wanted = sorted(set(row))
        needed += len(wanted)
        resident = [x for x in wanted if x in cache]
        hits += len(resident)
        useful += len([x for x in resident if x in fetched])
        loads += len(admit(wanted, t, 2 * t + 1))
        for x in wanted:
            uses[x] = uses.get(x, 0) + 1
    return needed, hits, loads, prefetched, useful


def optimal_misses(rows: Rows, slots: int) -> int:
    """The fewest demand loads any eviction choice achieves, by exhaustive search."""
    @functools.lru_cache(maxsize=None)
    def best(t: int, cache: frozenset[int]) -> int:
        if t == len(rows):
            return 0
        wanted = set(rows[t])
        missing = sorted(wanted - cache)
        free = sorted(cache - wanted)
        evict = max(0, len(cache) + len(missing) - slots)
        return len(missing) + min(
            best(t + 1, (cache - set(out)) | wanted) for out in itertools.combinations(free, evict))
    return best(0, frozenset())


def random_rows(rng: random.Random, passes: int, experts: int, k: int) -> Rows:
    return [rng.sample(range(experts), k) for _ in range(passes)]


def run(rows: Rows, experts: int, slots: int, policy: str, pred: Optional[Rows] = None, *,
        simulate=None) -> tuple[int, int, int, int, int]:
    k = len(rows[0]) if rows else 1
    ids = np.array(rows, dtype=np.int64).reshape(len(rows), k)
    guess = None if pred is None else np.array(pred, dtype=np.int64).reshape(len(pred), k)
    if simulate is None:
        out = simulate_cache(ids, experts, slots, policy, pred=guess)
        return out["needed"], out["hits"], out["loads"], out["prefetched"], out["useful"]
    base = policy.partition("+")[2] or policy
    return simulate(ids, np.arange(len(rows), dtype=np.int64), np.zeros(1, dtype=np.int64), experts,
                    slots, {"lru": 0, "lfu": 1, "belady": 2}[base], guess)


# --- exact small cases by hand -------------------------------------------------------------------

HAND = [[0, 1], [2, 3], [0, 1], [0, 2]]


@pytest.mark.parametrize("slots, policy, expected", [
    # C = 2: every pass but the last evicts everything; the last keeps 0.
    (2, "lru", (8, 1, 7, 0, 0)),
    (2, "belady", (8, 1, 7, 0, 0)),
    # C = 3, LRU: pass 1 evicts 0 (tie at pass 0: lower id), pass 2 evicts 2, pass 3 evicts 3.
    (3, "lru", (8, 2, 6, 0, 0)),
    # Belady: pass 1 evicts 0 (0 and 1 both next used at pass 2: lower id), pass 2 evicts 3 (never again).
    (3, "belady", (8, 3, 5, 0, 0)),
    # LFU: pass 1 evicts 0 (1 use each, lower id), pass 2 evicts 2 (tie 1 use, same pass), pass 3 evicts 3.
    (3, "lfu", (8, 2, 6, 0, 0)),
])
def test_policies_by_hand(slots: int, policy: str, expected: tuple[int, ...]) -> None:
    assert run(HAND, 4, slots, policy) == expected
    assert brute(HAND, slots, policy) == expected


def test_prefetch_by_hand() -> None:
    # C = 2. Pass 0 prefetches 0, 1: both useful. Pass 1 prefetches 2 (0 refreshed, 1 evicted): 2
    # useful, 3 a demand miss evicting 0. Pass 2 prefetches 0, 1: useful. Pass 3 prefetches 3
    # (1 refreshed, 0 evicted), then needs 0 and 2: two demand misses, the prefetch of 3 wasted.
    pred = [[0, 1], [2, 0], [0, 1], [1, 3]]
    expected = (8, 5, 3, 6, 5)
    assert run(HAND, 4, 2, "pilot+lru", pred) == expected
    assert brute(HAND, 2, "pilot+lru", pred) == expected


# --- against brute force and exhaustive search ---------------------------------------------------

CASES = [(seed, experts, k) for seed in range(40) for experts, k in ((5, 1), (6, 2), (8, 3))]


@pytest.mark.parametrize("seed, experts, k", CASES)
def test_every_policy_matches_brute_force(seed: int, experts: int, k: int) -> None:
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randint(1, 30), experts, k)
    pred = random_rows(rng, rng.randint(0, len(rows)), experts, k)
    for slots in range(k, experts + 2):
        for policy in ("lru", "lfu", "belady"):
            assert run(rows, experts, slots, policy) == brute(rows, slots, policy), (policy, slots)
        for policy in ("pilot+lru", "pilot+lfu"):
            assert run(rows, experts, slots, policy, pred) == brute(rows, slots, policy, pred), (policy, slots)


@pytest.mark.parametrize("seed", range(60))
def test_belady_is_the_exhaustive_optimum(seed: int) -> None:
    rng = random.Random(1000 + seed)
    experts, k = rng.choice([(4, 1), (5, 2), (6, 2), (6, 3)])
    rows = random_rows(rng, rng.randint(1, 9), experts, k)
    for slots in range(k, experts + 1):
        _, _, loads, _, _ = run(rows, experts, slots, "belady")
        assert loads == optimal_misses(rows, slots), (rows, slots)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_properties(data: st.DataObject) -> None:
    experts = data.draw(st.integers(2, 9))
    k = data.draw(st.integers(1, min(3, experts)))
    passes = data.draw(st.integers(0, 25))
    rows = [data.draw(st.lists(st.integers(0, experts - 1), min_size=k, max_size=k)) for _ in range(passes)]
    ids = np.array(rows, dtype=np.int64).reshape(passes, k)
    distinct = len({x for row in rows for x in row})
    previous = {"lru": -1, "belady": -1}
    for slots in range(k, experts + 2):
        got = {p: simulate_cache(ids, experts, slots, p) for p in ("lru", "lfu", "belady")}
        needed = sum(len(set(row)) for row in rows)
        for p, out in got.items():
            assert out["needed"] == needed and out["hits"] + out["loads"] == needed
            # Belady is at least as good as every other policy, at every size.
            assert out["hits"] <= got["belady"]["hits"]
        for p in previous:  # LRU and Belady never lose hits with more slots
            assert got[p]["hits"] >= previous[p]
            previous[p] = got[p]["hits"]
        if slots >= experts:  # only cold misses
            assert all(out["loads"] == distinct for out in got.values())


@pytest.mark.parametrize("seed", range(25))
def test_streams_and_both_kernels_agree(seed: int) -> None:
    rng = np.random.default_rng(seed)
    experts, k = 12, 3
    ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(80)]).astype(np.int64)
    pred = np.stack([rng.choice(experts, k, replace=False) for _ in range(60)]).astype(np.int64)
    order = rng.permutation(80).astype(np.int64)
    starts = np.array([0, 17, 40, 41], dtype=np.int64)
    for policy, guess in ((0, None), (1, None), (2, None), (0, pred), (1, pred)):
        for slots in (3, 5, 12):
            reference = _cache_py.simulate(ids, order, starts, experts, slots, policy, guess)
            assert _kernel()(ids, order, starts, experts, slots, policy, guess) == reference
            # Streams are independent caches: the totals are the sums of separate runs.
            bounds = list(starts) + [80]
            parts = [_cache_py.simulate(ids, order[a:b], np.zeros(1, dtype=np.int64), experts, slots, policy,
                                        guess) for a, b in zip(bounds, bounds[1:])]
            assert tuple(map(sum, zip(*parts))) == reference


def test_the_compiled_kernel_is_used_unless_pure_python_is_forced() -> None:
    module = _kernel().__module__
    expected = "turbospark.offload._cache_py" if os.environ.get("TURBOSPARK_PUREPYTHON") else \
        "turbospark.offload._cache_kernels"
    assert module == expected


# --- the report ------------------------------------------------------------------------------------

# Layer 0: one pass; layer 1: HAND, with predictions for layer 1 only.
DOC = traced(4, 2, [[[0, 1]], HAND], pred=[[], [0, 1, 2, 0, 0, 1, 1, 3]])


def test_report_by_hand() -> None:
    doc = cache_report(loads(json.dumps(DOC)), [2, 3], ["lru", "belady", "pilot"], expert_bytes=10)
    layer0 = {
        "layer": 0, "passes": 1, "needed": 2, "streams": 1,
        # Two cold misses; layer 0 has no prediction, so pilot+lru is plain LRU there.
        "hit_rate": {"lru": [0.0, 0.0], "belady": [0.0, 0.0], "pilot+lru": [0.0, 0.0]},
        "misses_per_token": {"lru": [2.0, 2.0], "belady": [2.0, 2.0], "pilot+lru": [2.0, 2.0]},
        "bytes_per_token": {"lru": [20.0, 20.0], "belady": [20.0, 20.0], "pilot+lru": [20.0, 20.0]},
        "prefetch": {"pilot+lru": {"useful": [0, 0], "wasted": [0, 0]}},
    }
    # C = 3 with prefetch: pass 0 prefetches 0, 1 (useful); pass 1 prefetches 2 into the free slot
    # (useful), then 3 misses, evicting 1; pass 2 prefetches 1, evicting 2 (tied with 3: lower id),
    # useful; pass 3's predictions 1, 3 are resident (refreshed), 0 hits, 2 misses evicting 1.
    layer1 = {
        "layer": 1, "passes": 4, "needed": 8, "streams": 1,
        "hit_rate": {"lru": [1 / 8, 2 / 8], "belady": [1 / 8, 3 / 8], "pilot+lru": [5 / 8, 6 / 8]},
        "misses_per_token": {"lru": [7 / 4, 6 / 4], "belady": [7 / 4, 5 / 4], "pilot+lru": [3 / 4, 2 / 4]},
        "bytes_per_token": {"lru": [70 / 4, 60 / 4], "belady": [70 / 4, 50 / 4], "pilot+lru": [90 / 4, 60 / 4]},
        "prefetch": {"pilot+lru": {"useful": [5, 4], "wasted": [1, 0]}},
    }
    assert doc["layers"] == [layer0, layer1]
    assert doc["model"] == {
        "routed_layers": 2,
        "hit_rate": {"lru": [1 / 16, 2 / 16], "belady": [1 / 16, 3 / 16], "pilot+lru": [5 / 16, 6 / 16]},
        "misses_per_token": {"lru": [3.75, 3.5], "belady": [3.75, 3.25], "pilot+lru": [2.75, 2.5]},
        "bytes_per_token": {"lru": [37.5, 35.0], "belady": [37.5, 32.5], "pilot+lru": [42.5, 35.0]},
        "prefetch": {"pilot+lru": {"useful_per_token": [1.25, 1.0], "wasted_per_token": [0.25, 0.0]}},
    }
    assert {key: doc[key] for key in doc if key not in ("layers", "model")} == {
        "num_layers": 2, "num_experts": 4, "top_k": 2, "slots": [2, 3], "policies": ["lru", "belady", "pilot+lru"],
        "shared": False, "batch": None, "batches": None, "expert_bytes": 10}


def test_pilot_without_predictions_is_null_with_why() -> None:
    doc = cache_report(loads(json.dumps(traced(4, 2, [HAND]))), [2], ["lru", "pilot+lfu"])
    assert doc["layers"][0]["hit_rate"] == {"lru": [1 / 8], "pilot+lfu": None}
    assert doc["layers"][0]["why"] == {"pilot+lfu": NO_PREDICTIONS}
    assert doc["layers"][0]["bytes_per_token"] is None and "prefetch" not in doc["layers"][0]
    assert doc["model"]["hit_rate"] == {"lru": [1 / 8], "pilot+lfu": None}
    assert doc["model"]["why"] == {"pilot+lfu": NO_PREDICTIONS}


# Two sequences interleaved: seq 0 routes (0,1) twice, seq 1 (2,3) twice, alternating.
SEQ_DOC = traced(4, 2, [[[0, 1], [2, 3], [0, 1], [2, 3]]], seq=[[0, 1, 0, 1]], phase=[[1, 1, 1, 1]])


def test_per_sequence_and_shared_caches() -> None:
    capture = loads(json.dumps(SEQ_DOC))
    per_seq = cache_report(capture, [2], ["lru"])["layers"][0]
    # One cache each: the second pass of each sequence hits both experts.
    assert (per_seq["streams"], per_seq["hit_rate"]) == (2, {"lru": [0.5]})
    shared = cache_report(capture, [2, 4], ["lru"], shared=True)["layers"][0]
    # One 2-slot cache in recorder order thrashes; 4 slots hold both sequences.
    assert (shared["streams"], shared["hit_rate"]) == (1, {"lru": [0.0, 0.5]})
    # Continuous batching with one row runs seq 0 to the end, then seq 1.
    batched = cache_report(capture, [2], ["lru"], shared=True, batch=1)["layers"][0]
    assert batched["hit_rate"] == {"lru": [0.5]}


@pytest.mark.parametrize("call, message", [
    (lambda c: cache_report(c, [1]), "cache size 1 is below top_k 2: a pass needs its 2 experts resident at once"),
    (lambda c: cache_report(c, [2], ["lru", "fifo"]), "unknown cache policy 'fifo'"),
    (lambda c: cache_report(c, [2], expert_bytes=0), "expert bytes must be at least 1, got 0"),
    (lambda c: cache_report(c, [2], batch=4), "it needs shared=True"),
    (lambda c: cache_report(loads(json.dumps({"num_layers": 1, "num_experts": 4, "top_k": 2,
                                               "counts": [[0, 0, 0, 0]]})), [2]), NO_TRACE),
])
def test_bad_settings_are_named(call, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call(loads(json.dumps(DOC)))
    assert message in str(info.value)


def test_simulate_cache_refuses_bad_ids() -> None:
    with pytest.raises(ValueError, match=r"ids holds expert id 7, outside 0\.\.3"):
        simulate_cache(np.array([[0, 7]]), 4, 2, "lru")
    with pytest.raises(ValueError, match="integer expert ids, got dtype float64"):
        simulate_cache(np.array([[0.0, 1.0]]), 4, 2, "lru")
    with pytest.raises(ValueError, match="policy pilot\\+lru needs predictions"):
        simulate_cache(np.array([[0, 1]]), 4, 2, "pilot")


def test_parsers() -> None:
    assert parse_slots(["16", "4:10:3", "8:9", 5]) == [4, 5, 7, 8, 9, 10, 16]
    assert parse_policies("LRU, pilot,opt,lru") == ["lru", "pilot+lru", "belady"]
    assert parse_bytes("12MiB") == 12 * 2**20 and parse_bytes("3k") == 3000 and parse_bytes("7") == 7
    for bad in ("8:4", "x", "1:4:0", "-3"):
        with pytest.raises(ValueError, match="bad cache size"):
            parse_slots([bad])
    with pytest.raises(ValueError, match="bad expert size '12 parsecs'"):
        parse_bytes("12 parsecs")
    assert default_slots(loads(json.dumps(DOC))) == [2, 4]


# --- the command line ----------------------------------------------------------------------------

def test_cli_text(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["cache", path, "--slots", "2", "3", "--policy", "lru,belady,pilot", "--expert-bytes", "10"]) == 0
    assert capfd.readouterr().out == "\n".join([
        "expert cache: 2 routed layers, 4 experts, top_k 2; one cache per layer over the whole trace (no sequence tags)",
        "hit rate, mean over routed layers:",
        "  slots        lru     belady  pilot+lru",
        "      2       6.2%       6.2%      31.2%",
        "      3      12.5%      18.8%      37.5%",
        "demand misses per token, all routed layers:",
        "  slots        lru     belady  pilot+lru",
        "      2       3.75       3.75       2.75",
        "      3       3.50       3.25       2.50",
        "bytes loaded per token (demand + prefetch), 10 B per expert:",
        "  slots        lru     belady  pilot+lru",
        "      2       38 B       38 B       42 B",
        "      3       35 B       32 B       35 B",
        "pilot+lru prefetches per token at each size: useful 1.25, 1.00; wasted 0.25, 0.00",
        "belady: the optimum of any demand policy (evicts the expert used farthest ahead); prefetch policies "
        "load extra experts and can exceed it. Definitions: docs/cache.md.",
    ]) + "\n"


def test_cli_json_matches_the_api(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    out = tmp_path / "cache.json"
    assert main(["cache", path, "--slots", "2:3", "--json", "-o", str(out)]) == 0
    assert capfd.readouterr().out == ""
    assert json.loads(out.read_text()) == cache_report(loads(json.dumps(DOC)), [2, 3])


@pytest.mark.parametrize("argv, message", [
    (["--slots", "1"], "turbospark: cache size 1 is below top_k 2: a pass needs its 2 experts resident at once\n"),
    (["--policy", "mru"], "turbospark: unknown cache policy 'mru': choose from lru, lfu, belady, pilot+lru, "
                          "pilot+lfu (pilot = pilot+lru)\n"),
    (["--expert-bytes", "0"], "turbospark: bad expert size '0': give whole bytes >= 1, optionally with k, M, G "
                              "(powers of 1000) or KiB, MiB, GiB\n"),
    (["--batch", "2"], "turbospark: batch forms the serving iterations a shared cache sees: it needs "
                       "shared=True (--shared)\n"),
])
def test_cli_refusals_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str], argv: list[str],
                             message: str) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["cache", path, *argv]) == 2
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", message)


def test_cli_counts_only_capture_exits_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "c.json", {"num_layers": 1, "num_experts": 4, "top_k": 2, "counts": [[1, 1, 0, 0]]})
    assert main(["cache", path]) == 2
    assert capfd.readouterr().err == f"turbospark: {NO_TRACE}\n"


def test_text_report_names_the_stream_model() -> None:
    capture = loads(json.dumps(SEQ_DOC))
    assert cache_lines(cache_report(capture, [2], ["lru"]))[0].endswith(
        "one cache per layer per sequence (up to 2 sequences per layer)")
    assert cache_lines(cache_report(capture, [2], ["lru"], shared=True, batch=3))[0].endswith(
        "one cache per layer shared by all sequences, in serving iterations of 3 rows")


def test_shared_batch_without_sequence_tags_says_it_keeps_the_recorders_order(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capture = loads(json.dumps(DOC))
    plain = cache_report(capture, [2, 3], ["lru", "belady", "pilot"], shared=True)
    batched = cache_report(capture, [2, 3], ["lru", "belady", "pilot"], shared=True, batch=3)
    # Iterations of 3 consecutive passes are the recorder's order: the same figures.
    assert (batched["batch"], batched["batches"], plain["batches"]) == (3, "consecutive passes", None)
    assert (batched["layers"], batched["model"]) == (plain["layers"], plain["model"])
    tagged = cache_report(loads(json.dumps(SEQ_DOC)), [2], ["lru"], shared=True, batch=3)
    assert tagged["batches"] == "concurrent sequences"
    path = write_capture(tmp_path / "c.json", DOC)
    assert main(["cache", path, "--slots", "2", "--shared", "--batch", "3"]) == 0
    assert capfd.readouterr().out.splitlines()[0] == (
        "expert cache: 2 routed layers, 4 experts, top_k 2; one cache per layer shared by all passes, in the "
        "recorder's order (no sequence tags: iterations of 3 consecutive passes keep it)")


# --- the figure ----------------------------------------------------------------------------------

def test_plot_draws_the_documents_curves(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    require_module("matplotlib")
    from matplotlib.figure import Figure

    capture = write_capture(tmp_path / "c.json", DOC)
    document = tmp_path / "cache.json"
    assert main(["cache", capture, "--slots", "2", "3", "4", "--json", "-o", str(document),
                 "--expert-bytes", "1MiB"]) == 0
    drawn: list[Any] = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self), original(self, *a, **k))[1])
    assert main(["plot", "--cache", str(document)]) == 0
    assert capfd.readouterr().out.endswith(f"wrote {tmp_path / 'cache.png'}\n")
    assert (tmp_path / "cache.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left, right = drawn[0].axes
    model = json.loads(document.read_text())["model"]
    assert [line.get_label() for line in left.get_lines()] == ["lru", "lfu", "belady", "pilot+lru"]
    for line in left.get_lines():
        assert line.get_xdata().tolist() == [2, 3, 4]
        assert line.get_ydata().tolist() == [100 * v for v in model["hit_rate"][line.get_label()]]
    belady = right.get_lines()[2]
    assert belady.get_ydata().tolist() == [v / 2**20 for v in model["bytes_per_token"]["belady"]]


def test_plot_refuses_a_capture_given_as_cache_document(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capture = write_capture(tmp_path / "c.json", DOC)
    assert main(["plot", "--cache", capture]) == 2
    assert capfd.readouterr().err == (f"turbospark: cannot read {capture}: not turbospark's cache JSON "
                                      "(write it with `turbospark cache CAPTURE --json`)\n")


# --- sizes at and beyond num_experts ---------------------------------------------------------------

HUGE = [4, 5, 2**61, 2**62, 2**63 - 1, 2**63, 10**30]


def test_a_size_beyond_the_experts_serves_as_num_experts_in_both_kernels(tmp_path: Path) -> None:
    # In a child: the compiled kernel once sized its heap (slots + 1) * 8 bytes, which wraps from
    # 2**61 and let LFU and Belady write past it (SIGSEGV); 2**63 did not fit its int64 argument.
    code = (
        "import json, numpy as np\n"
        "from turbospark.offload import _cache_py\n"
        "from turbospark.offload.cache import _kernel\n"
        f"ids = np.array({HAND}, dtype=np.int64)\n"
        "pred = np.array([[0, 1], [2, 0], [0, 1], [1, 3]], dtype=np.int64)\n"
        "order, starts = np.arange(4, dtype=np.int64), np.zeros(1, dtype=np.int64)\n"
        "out = {}\n"
        f"for slots in {HUGE}:\n"
        "    for policy, guess in ((0, None), (1, None), (2, None), (0, pred), (1, pred)):\n"
        "        for name, simulate in (('twin', _cache_py.simulate), ('kernel', _kernel())):\n"
        "            out.setdefault(f'{name} {policy} {guess is not None}', []).append(\n"
        "                list(simulate(ids, order, starts, 4, slots, policy, guess)))\n"
        "print(json.dumps(out))\n"
    )
    child = run_python("-c", code)
    assert (child.returncode, child.stderr) == (0, "")
    got = json.loads(child.stdout)
    # C >= E: only cold misses (0, 1, 2, 3); with the prefetch of HAND's predictions 3 is the only
    # demand load, and 0, 1, 2 are useful prefetches.
    for name in ("twin", "kernel"):
        for policy in (0, 1, 2):
            assert got[f"{name} {policy} False"] == [[8, 4, 4, 0, 0]] * len(HUGE)
        for policy in (0, 1):
            assert got[f"{name} {policy} True"] == [[8, 7, 1, 3, 3]] * len(HUGE)


def test_cli_sizes_beyond_the_experts(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "c.json", DOC)
    child = run_python("-m", "turbospark", "cache", path, "--slots", "4", str(2**62), str(10**30),
                       "--policy", "lru,lfu,belady,pilot")
    assert (child.returncode, child.stderr) == (0, "")
    lines = child.stdout.splitlines()
    assert lines[1:6] == [
        "hit rate, mean over routed layers:",
        "  " + " " * 26 + "slots        lru        lfu     belady  pilot+lru",
        "  " + " " * 30 + "4      25.0%      25.0%      25.0%      43.8%",
        "  " + " " * 12 + "4611686018427387904      25.0%      25.0%      25.0%      43.8%",
        "  1000000000000000000000000000000      25.0%      25.0%      25.0%      43.8%",
    ]


def test_sizes_that_are_not_integers_are_named() -> None:
    ids, order, starts = np.array(HAND, dtype=np.int64), np.arange(4, dtype=np.int64), np.zeros(1, np.int64)
    for simulate in (_cache_py.simulate, _kernel()):
        with pytest.raises(ValueError) as info:
            simulate(ids, order, starts, 4, 2.5, 0, None)
        assert str(info.value) == "slots must be an integer, got 2.5"


# --- pilot="self": layer 0 is predicted too -----------------------------------------------------------

# What a pilot="self" model capture holds: every layer's predictions are its own selections.
SELF_DOC = traced(4, 2, [HAND, HAND[::-1]], pred=[sum(HAND, []), sum(HAND[::-1], [])])


def test_a_self_capture_prefetches_layer_0_perfectly() -> None:
    doc = cache_report(loads(json.dumps(SELF_DOC)), [2], ["lru", "pilot"])
    # Each pass prefetches exactly what it needs: every lookup hits, every prefetch is useful,
    # layer 0 included (it was served as plain LRU: 1 hit in 8).
    for entry in doc["layers"]:
        assert entry["hit_rate"] == {"lru": [1 / 8], "pilot+lru": [1.0]}
        assert entry["misses_per_token"] == {"lru": [7 / 4], "pilot+lru": [0.0]}
        assert entry["prefetch"] == {"pilot+lru": {"useful": [7], "wasted": [0]}}
    assert doc["model"]["hit_rate"] == {"lru": [1 / 8], "pilot+lru": [1.0]}
