"""No leaks: recorders are collected, and the compiled core frees every buffer.

Resident memory is read from ``/proc/self/status`` (skipped where there is
none). Each check first warms up (allocator pools, numpy caches), then runs
enough cycles that a leak of the buffers involved would dwarf the bound: a
lost trace buffer per recorder costs tens of megabytes over the run.
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any, Callable

import numpy as np
import pytest

import turbospark


def rss_bytes() -> int:
    """This process's resident set size."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pytest.skip("no /proc/self/status VmRSS here")


def growth(cycle: Callable[[int], None], warmup: int, cycles: int) -> int:
    """How much resident memory ``cycles`` calls of ``cycle`` add, after ``warmup`` calls."""
    for i in range(warmup):
        cycle(i)
    gc.collect()
    before = rss_bytes()
    for i in range(cycles):
        cycle(i)
    gc.collect()
    return rss_bytes() - before


MB = 1 << 20
BLOCK = (np.arange(200 * 8, dtype=np.int64).reshape(200, 8) * 7) % 16


def test_create_record_close_cycles_leave_memory_flat(capfd: pytest.CaptureFixture[str]) -> None:
    # Every feature on, so every buffer a recorder owns is allocated, grown and freed.
    def cycle(i: int) -> None:
        hist = turbospark.RouterHistogram(os.devnull, 4, 16, trace=True, pilot="next", router_logits=(1, 2))
        for layer in range(4):
            hist.record_many(layer, BLOCK)  # 6.4 KB of trace per layer, grown past its first buffer
            hist.record(layer, [1, 2, 3, 4, 5, 6, 7, 8])
            hist.record_prediction(layer, (np.arange(8) + layer) % 16)
            hist.record_router_logits(layer, np.linspace(-1, 1, 16, dtype=np.float32))
        try:
            hist.record(0, [99] * 8)
        except ValueError:
            pass
        if i % 2:
            hist.close()  # the full write path, to /dev/null
        else:
            hist.discard()
            assert len(hist.to_json()) > 15_000

    added = growth(cycle, warmup=300, cycles=3000)
    capfd.readouterr()  # 1,650 "[router-hist] wrote /dev/null" lines
    # A leaked trace (four layers of 512+ ids) per cycle alone would be 25 MB.
    assert added < 8 * MB, f"resident memory grew by {added / MB:.1f} MB"


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_big_buffers_are_freed(cores: tuple[Any, Any], which: str) -> None:
    # A recorder with 3.2 MB of trace and predictions, 150 times over: a core
    # that kept any of it would grow by hundreds of megabytes.
    cls = cores[0] if which == "compiled" else cores[1]
    block = np.random.default_rng(0).integers(0, 64, size=(50_000, 8), dtype=np.int32)
    refs: list[Any] = []

    def cycle(i: int) -> None:
        hist = cls(os.devnull, 2, 64, trace=True, pilot="self")
        hist.record_many(i % 2, block)
        for row in block[:200]:
            hist.record_prediction(1, row)
        # Rejected calls allocate scratch space too, and must free it.
        for bad in (np.concatenate([block[:5_000], [[64] * 8]]), [[1] * 8] * 999 + [[1] * 7]):
            try:
                hist.record_many(0, bad)
            except ValueError:
                pass
        try:
            hist.record(0, list(range(8)) * 1000)
        except ValueError:
            pass
        if i % 10 == 0:
            assert len(hist.to_json()) > 800_000
        hist.discard()
        if i % 25 == 0:
            refs.append(weakref.ref(hist))

    added = growth(cycle, warmup=20, cycles=150)
    assert added < 8 * MB, f"resident memory grew by {added / MB:.1f} MB"
    assert [ref() for ref in refs] == [None] * len(refs)


@pytest.mark.parametrize("how", ["closed", "dropped-open", "in-a-cycle", "context-manager", "failed-write"])
def test_recorders_are_collected(tmp_path: Any, capfd: pytest.CaptureFixture[str], how: str) -> None:
    # The registry that writes open recorders at exit must not keep them alive.
    refs = []
    for i in range(20):
        path = str(tmp_path / ("missing/x.json" if how == "failed-write" else f"c{i}.json"))
        if how == "context-manager":
            with turbospark.RouterHistogram(path, 2, 4, trace=True) as hist:
                hist.record(0, [1, 2])
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            hist = turbospark.RouterHistogram(path, 2, 4, trace=True, pilot="next")
            if how == "failed-write":
                os.rmdir(os.path.dirname(path))  # gone by the time of the write
            hist.record(0, [1, 2])
            if how in ("closed", "failed-write"):
                hist.close()
            elif how == "in-a-cycle":
                hist.me = hist
        refs.append(weakref.ref(hist))
        del hist
    gc.collect()
    assert [ref() for ref in refs] == [None] * 20
    err = capfd.readouterr().err
    if how == "failed-write":
        assert err.count("[router-hist] FAILED writing") == 20
    else:
        assert err.count("[router-hist] wrote") == 20


def test_failed_constructions_leave_memory_flat(tmp_path: Any) -> None:
    def cycle(i: int) -> None:
        for bad in ((2, 0), (-1, 4), (2, 4, -1)):
            try:
                turbospark.RouterHistogram(str(tmp_path / "c.json"), *bad)
            except ValueError:
                pass
        try:
            turbospark.RouterHistogram(str(tmp_path / "c.json"), 2, 4, pilot="sideways")
        except ValueError:
            pass

    added = growth(cycle, warmup=500, cycles=5000)
    assert added < 4 * MB, f"resident memory grew by {added / MB:.1f} MB"
    assert list(tmp_path.iterdir()) == []
