"""DeepSeek's EPLB greedy (replicate, balanced packing, hierarchical by node), vectorised over layers.

The published algorithm (deepseek-ai/EPLB, ``eplb.py``) loops in Python over
layers, items and packs. This is the same algorithm, step for step and with
the same arithmetic and tie-breaking, with the layer loop turned into numpy
operations on whole columns:

* loads are float32, as the published code casts them (``weight.float()``);
  pack weights accumulate in float32 in the same order;
* ``replicate``: each redundant slot goes to the expert with the largest
  load per replica, the lowest id on ties (torch's ``max`` returns the first
  maximum, as ``np.argmax`` does);
* ``balanced_packing``: items in descending load order, equal loads in the
  order torch's default CPU sort leaves them (``_stdsort`` replays it), each
  to the lightest pack that still has room, the lowest pack index on ties
  (Python's ``min`` returns the first minimum).

``benchmarks/published_eplb.py`` keeps the loop form for comparison; the
tests check that both give identical maps.
"""

from __future__ import annotations

import numpy as np

from ._stdsort import argsort_desc

__all__ = ["balanced_packing", "eplb", "hierarchical", "replicate"]


def replicate(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicate the columns of ``weight`` (rows x n float32) into ``num_phy`` >= n slots.

    Returns (phy2log, rank, logcnt): per row, the logical item of each slot,
    the replica rank of each slot and the replica count of each item.
    """
    rows, num_log = weight.shape
    phy2log = np.empty((rows, num_phy), dtype=np.int64)
    phy2log[:, :num_log] = np.arange(num_log)
    rank = np.zeros((rows, num_phy), dtype=np.int64)
    logcnt = np.ones((rows, num_log), dtype=np.int64)
    per_replica = weight.copy()
    row = np.arange(rows)
    for slot in range(num_log, num_phy):
        chosen = np.argmax(per_replica, axis=1)
        phy2log[:, slot] = chosen
        rank[:, slot] = logcnt[row, chosen]
        logcnt[row, chosen] += 1
        # float32 / float32, correctly rounded: the value torch computes.
        per_replica[row, chosen] = weight[row, chosen] / logcnt[row, chosen].astype(np.float32)
    return phy2log, rank, logcnt


def balanced_packing(weight: np.ndarray, num_packs: int, labels: np.ndarray | None = None,
                     accumulate: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Pack the n items of each row of ``weight`` (rows x n float32) into ``num_packs``
    packs of exactly n / num_packs items each, heaviest item first into the lightest pack.

    ``labels``: items with equal weight and label are interchangeable (see
    ``argsort_desc``). ``accumulate``: the dtype pack weights add up in (float32 as the
    published code's tensors; SGLang's copy adds Python floats: float64). Returns
    (pack_index, rank_in_pack), both rows x n int64.
    """
    rows, items = weight.shape
    per_pack = items // num_packs
    if per_pack == 1:
        return (np.broadcast_to(np.arange(items), weight.shape).copy(),
                np.zeros(weight.shape, dtype=np.int64))
    order = argsort_desc(weight, labels)
    # One step per item position, all rows at once, on flat views: a full
    # pack's weight becomes inf, so the lightest pack with room is a plain
    # argmin (first minimum, as Python's min). Real weights of full packs
    # are never read again.
    pack_weight: np.ndarray = np.zeros((rows, num_packs), dtype=accumulate)
    flat_weight = pack_weight.reshape(-1)
    filled = np.zeros(rows * num_packs, dtype=np.int64)
    base = np.arange(rows) * num_packs
    item_load = np.take_along_axis(weight, order, axis=1).T.copy()
    packs = np.empty((items, rows), dtype=np.int64)
    ranks = np.empty((items, rows), dtype=np.int64)
    for position in range(items):
        pack = np.argmin(pack_weight, axis=1)
        packs[position] = pack
        slot = base + pack
        ranks[position] = filled[slot]
        filled[slot] += 1
        flat_weight[slot] += item_load[position]
        done = slot[filled[slot] == per_pack]
        flat_weight[done] = np.inf
    pack_index = np.empty((rows, items), dtype=np.int64)
    rank_in_pack = np.empty((rows, items), dtype=np.int64)
    np.put_along_axis(pack_index, order, packs.T, axis=1)
    np.put_along_axis(rank_in_pack, order, ranks.T, axis=1)
    return pack_index, rank_in_pack


def _inverse(perm: np.ndarray) -> np.ndarray:
    inverse = np.empty_like(perm)
    np.put_along_axis(inverse, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inverse


def eplb(
    weight: np.ndarray, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray]:
    """The hierarchical EPLB placement of ``weight`` (layers x E loads).

    Groups of E / num_groups consecutive experts are packed onto nodes, the
    experts of each node replicated into its num_phy / num_nodes slots, and
    those packed onto the node's GPUs. ``num_groups = num_nodes = 1`` is the
    published global policy. Returns (phy2log, logcnt): layers x num_phy
    logical expert per slot (slots contiguous by GPU), layers x E replica counts.
    The caller checks divisibility (E by groups, groups and GPUs by nodes, slots by GPUs).
    """
    phy2log, _, logcnt = hierarchical(weight, num_phy, num_groups, num_nodes, num_gpus)
    return phy2log, logcnt


def hierarchical(weight: np.ndarray, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int, *,
                 accumulate: type = np.float32, replicas_interchangeable: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``eplb`` with the replica rank of each slot: (phy2log, phyrank, logcnt), layers x num_phy,
    num_phy, E. ``accumulate``: see ``balanced_packing``. ``replicas_interchangeable=False`` puts
    equal-load replicas of one expert in torch's order too (needed when the caller reads ``phyrank``:
    SGLang lists an expert's slots by replica rank)."""
    weight = np.asarray(weight, dtype=np.float32)
    layers, num_log = weight.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_phy // num_gpus
    per_node = num_log // num_nodes

    group_load = weight.reshape(layers, num_groups, group_size).sum(axis=-1, dtype=np.float32)
    group_pack, group_rank = balanced_packing(group_load, num_nodes, accumulate=accumulate)
    log2mlog = (((group_pack * groups_per_node + group_rank) * group_size)[:, :, None]
                + np.arange(group_size)).reshape(layers, num_log)
    mlog2log = _inverse(log2mlog)

    mlog_load = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, per_node)
    phy2mlog, phy_rank, mlog_count = replicate(mlog_load, num_phy // num_nodes)

    phy_load = np.take_along_axis(mlog_load / mlog_count.astype(np.float32), phy2mlog, axis=1)
    # Replicas of one expert are interchangeable in the map: only ties between
    # different experts need torch's order for the same map.
    pack_index, rank_in_pack = balanced_packing(phy_load, num_gpus // num_nodes,
                                                phy2mlog if replicas_interchangeable else None, accumulate)
    pphy2phy = _inverse(pack_index * per_gpu + rank_in_pack)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1)
    pphy2mlog = (pphy2mlog.reshape(layers, num_nodes, -1)
                 + np.arange(0, num_log, per_node)[None, :, None]).reshape(layers, -1)
    phy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=1)
    phyrank = np.take_along_axis(phy_rank, pphy2phy, axis=1).reshape(layers, -1)
    logcnt = np.take_along_axis(mlog_count.reshape(layers, -1), log2mlog, axis=1)
    return phy2log, phyrank, logcnt
