"""``place`` on a long capture: a layer at a time, and the round-robin model a chunk of whole blocks at a time
(issue 25): the same figures as the whole-array code, for any chunk."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from turbospark.capture.reader import Capture
from turbospark.placement import dispatch, samples
from turbospark.placement.dispatch import LayerIds, dispatch_loads, routing, trtllm_block


def _capture(seed: int) -> Capture:
    rng = np.random.default_rng(seed)
    trace = tuple(rng.integers(0, 12, (int(rng.integers(0, 9000)), 4)).astype(np.uint8) for _ in range(3))
    seq = [rng.integers(0, 40, t.shape[0]).astype(np.int64) for t in trace]
    phase = [np.ones(t.shape[0], dtype=np.int64) for t in trace]
    counts = np.stack([np.bincount(t.ravel(), minlength=12) for t in trace]).astype(np.int64)
    return Capture(3, 12, 4, counts, trace, None, None, seq, phase)


def _whole_block_loads(phy2log: np.ndarray, trace: tuple[np.ndarray, ...], gpus: int) -> np.ndarray:
    """The round-robin loads from the definition: block b of 1,024 ids, the q-th id of expert e in it takes
    replica (q + b) mod r_e of e's slots in slot order."""
    loads = np.zeros((phy2log.shape[0], gpus))
    per_gpu = phy2log.shape[1] // gpus
    for layer, ids in enumerate(trace):
        slots = {e: [s for s in range(phy2log.shape[1]) if phy2log[layer, s] == e] for e in range(12)}
        flat = ids.reshape(-1).tolist()
        for b in range(0, len(flat), trtllm_block):
            seen: dict[int, int] = {}
            for e in flat[b:b + trtllm_block]:
                q = seen.get(e, 0)
                seen[e] = q + 1
                slot = slots[e][(q + b // trtllm_block) % len(slots[e])]
                loads[layer, slot // per_gpu] += 1
    return loads


@pytest.mark.parametrize("chunk", [trtllm_block, 3 * trtllm_block, 1024 * trtllm_block])
def test_round_robin_loads_are_the_same_for_any_chunk_of_whole_blocks(monkeypatch: pytest.MonkeyPatch,
                                                                      chunk: int) -> None:
    capture = _capture(1)
    rng = np.random.default_rng(2)
    # 16 slots on 4 GPUs: every expert once, four of them again.
    phy2log = np.stack([np.concatenate([rng.permutation(12), rng.choice(12, 4, replace=False)]) for _ in range(3)])
    monkeypatch.setattr(dispatch, "_ROUND_ROBIN_CHUNK", chunk)
    loads = dispatch_loads("round-robin", phy2log, routing([capture.counts], [capture.trace]), 4)
    assert loads is not None
    assert np.array_equal(loads, _whole_block_loads(phy2log, capture.trace, 4))


def test_a_split_keeps_no_mask_and_its_fit_routing_reads_a_layer_when_asked() -> None:
    capture = _capture(3)
    parts = samples.split(capture, Fraction(1, 2))
    assert isinstance(parts.fit_masks, samples.FitMasks)
    for layer in range(3):
        found, first = np.unique(capture.seq[layer], return_index=True)  # type: ignore[index]
        keep = found[np.argsort(first, kind="stable")][: found.shape[0] // 2]
        mask = np.isin(capture.seq[layer], keep)  # type: ignore[index]
        assert np.array_equal(parts.fit_masks[layer], mask)
        assert np.array_equal(parts.fit[layer], np.bincount(capture.trace[layer][mask].ravel(), minlength=12))
        assert np.array_equal(parts.test[layer],  # type: ignore[index]
                              np.bincount(capture.trace[layer][~mask].ravel(), minlength=12))
    flow = routing([parts.fit], [LayerIds(capture.trace, parts.fit_masks)])
    assert flow.traces is not None and isinstance(flow.traces[0], LayerIds)
    assert np.array_equal(flow.traces[0][2], capture.trace[2][parts.fit_masks[2]])
