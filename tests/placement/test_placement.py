"""``turbospark.placement``: hand-worked placements, properties, and never worse than the published EPLB."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbospark.placement import place
from turbospark.placement._greedy import eplb
from turbospark.placement.dispatch import gpu_loads, imbalance, layer_stats, replica_counts, trivial_map

from placement_helpers import benchmark_module

published = benchmark_module("published_eplb")


def test_global_with_replicas_by_hand() -> None:
    # E=4, S=6, G=2. Replication: expert 1 (9) takes both spare slots (9 -> 4.5 -> 3 per replica).
    # Per-replica loads 1, 3, 4, 4, 3, 3; the greedy packs 4, 3, 3 | 4, 3, 1 = 10 | 8.
    p = place(np.array([[1, 9, 4, 4]]), 2, 6)
    assert p.greedy.tolist() == [[2, 1, 1, 3, 1, 0]]
    # The refinement swaps expert 2 (4) on GPU 0 with a replica of expert 1 (3) on GPU 1: 9 | 9.
    assert p.phy2log.tolist() == [[1, 1, 1, 3, 2, 0]]
    assert p.replicas.tolist() == [[1, 3, 1, 1]]
    assert gpu_loads(p.phy2log, np.array([[1, 9, 4, 4]]), 2).tolist() == [[9.0, 9.0]]
    assert gpu_loads(p.greedy, np.array([[1, 9, 4, 4]]), 2).tolist() == [[10.0, 8.0]]


def test_node_groups_by_hand() -> None:
    # Groups {0,1} (10 tokens) and {2,3} (8) go to nodes 0 and 1, each with 3 slots on 1 GPU.
    # Node 0 replicates expert 1 (4.5, 4.5, 1); node 1 replicates expert 2 (2, 4, 2).
    # The groups keep the optimum out of reach: 10 | 8, which no in-node swap changes.
    p = place(np.array([[1, 9, 4, 4]]), 2, 6, nodes=2, groups=2)
    assert p.greedy.tolist() == [[1, 1, 0, 3, 2, 2]]
    assert p.phy2log.tolist() == [[1, 1, 0, 3, 2, 2]]
    assert p.replicas.tolist() == [[1, 2, 2, 1]]
    assert layer_stats(gpu_loads(p.phy2log, np.array([[1, 9, 4, 4]]), 2)) == [
        {"imbalance": 1 / 9, "balancedness": 0.9, "max_load": 10.0, "mean_load": 9.0}]


def test_no_replicas_by_hand() -> None:
    # 8, 6, 1, 1 into 2 GPUs of 2 slots: 8 | 6 | 1 to the lighter GPU 1 | 1 to GPU 0 (GPU 1 full).
    p = place(np.array([[8, 1, 1, 6]]), 2)
    assert p.phy2log.tolist() == [[0, 2, 3, 1]]
    assert imbalance(gpu_loads(p.phy2log, np.array([[8, 1, 1, 6]]), 2))[0].tolist() == [0.125]


def test_trivial_map_and_a_layer_without_load() -> None:
    assert trivial_map(2, 3, 5).tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]
    loads = gpu_loads(trivial_map(2, 3, 6), np.array([[0, 0, 0], [4, 2, 2]]), 3)
    assert loads.tolist() == [[0.0, 0.0, 0.0], [3.0, 3.0, 2.0]]
    assert layer_stats(loads)[0] == {"imbalance": None, "balancedness": None, "max_load": 0.0, "mean_load": 0.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpus": 2, "slots": 3}, "--slots 3 is fewer than the 4 experts: every expert needs a slot"),
        ({"gpus": 3, "slots": 8}, "--slots 8 not divisible by --gpus 3"),
        ({"gpus": 3}, "the default 4 slots (one per expert) not divisible by --gpus 3"),
        ({"gpus": 4, "nodes": 3}, "--gpus 4 is not divisible by --nodes 3"),
        ({"gpus": 4, "nodes": 2, "groups": 3}, "the 4 experts do not split into --groups 3"),
        ({"gpus": 4, "nodes": 4, "groups": 2}, "--groups 2 is not divisible by --nodes 4"),
        ({"gpus": 0}, "--gpus must be a positive integer, got 0"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        place(np.ones((1, 4), dtype=np.int64), **kwargs)
    assert str(info.value) == message


def test_nothing_to_place() -> None:
    with pytest.raises(ValueError, match="^the capture has no layers to place$"):
        place(np.zeros((0, 4), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="^the capture has no experts to place$"):
        place(np.zeros((1, 0), dtype=np.int64), 1)
    with pytest.raises(ValueError, match="^counts must be a 2-D array of non-negative numbers"):
        place(np.array([[1, -1]]), 1)


def _random_case(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int, int | None]:
    nodes = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.sampled_from([None, nodes, 2 * nodes]))
    gpus = nodes * draw(st.integers(1, 4))
    experts = (groups or 1) * draw(st.integers(1, 6))
    while experts < gpus:
        experts *= 2
    per_gpu = -(-experts // gpus) + draw(st.integers(0, 2))
    layers = draw(st.integers(1, 4))
    skew = draw(st.sampled_from([0.0, 1.0, 2.0]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    scale = rng.permutation(np.arange(1, experts + 1, dtype=np.float64) ** -skew)
    counts = rng.poisson(200 * scale, size=(layers, experts))
    return counts, gpus, gpus * per_gpu, nodes, groups


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_properties_and_never_worse_than_published(data: st.DataObject) -> None:
    counts, gpus, slots, nodes, groups = data.draw(st.composite(_random_case)())
    p = place(counts, gpus, slots, nodes, groups)
    layers, experts = counts.shape
    assert p.phy2log.shape == (layers, slots)
    # Every expert has a slot; replica counts add up to S; S/G slots per GPU by construction.
    assert (p.replicas >= 1).all() and (p.replicas.sum(axis=1) == slots).all()
    assert np.array_equal(p.replicas, replica_counts(p.phy2log, experts))
    loads = gpu_loads(p.phy2log, counts, gpus)
    assert np.allclose(loads.sum(axis=1), counts.sum(axis=1))
    # The vectorised greedy is the published algorithm, map for map.
    ref_map, _, ref_count = published.rebalance_experts(counts, slots, groups or 1, nodes if groups else 1, gpus)
    assert np.array_equal(p.greedy, ref_map)
    assert np.array_equal(replica_counts(p.greedy, experts), ref_count)
    ref = gpu_loads(ref_map, counts, gpus).max(axis=1)
    assert (loads.max(axis=1) <= ref).all()
    if groups:
        # All replicas of a group's experts on one node.
        node_of_slot = np.arange(slots) // (slots // nodes)
        group_of_slot = p.phy2log // (experts // groups)
        for layer in range(layers):
            for g in range(groups):
                assert len(set(node_of_slot[group_of_slot[layer] == g].tolist())) == 1


def test_refinement_improves_on_skewed_counts() -> None:
    rng = np.random.default_rng(3)
    counts = np.floor(rng.pareto(1.2, size=(20, 64)) * 100).astype(np.int64)
    p = place(counts, 8, 72)
    ours = gpu_loads(p.phy2log, counts, 8).max(axis=1)
    greedy = gpu_loads(eplb(counts, 72, 1, 1, 8)[0], counts, 8).max(axis=1)
    assert (ours <= greedy).all() and (ours < greedy).sum() >= 10
