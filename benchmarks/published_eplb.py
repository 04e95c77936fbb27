"""A faithful numpy re-implementation of DeepSeek's published EPLB (deepseek-ai/EPLB, ``eplb.py``),
kept in the published code's loop form, for the quality and speed comparisons.

Semantics kept from the published code, step by step:

* loads are cast to float32 (``weight.float()``); per-replica loads are
  float32 divisions; pack weights start at 0 and add float32 item loads in
  packing order;
* ``replicate_experts``: one redundant slot at a time, to the expert with the
  largest load per replica (first maximum on ties, as torch's ``max``);
* ``balanced_packing``: for each layer, items in descending load order, each
  to the pack with the smallest weight among those not yet full, the lowest
  index on ties (Python's ``min`` over packs in order); with one item per
  pack, item i goes to pack i;
* ``rebalance_experts_hierarchical``: groups to nodes, replication within
  nodes, physical experts to the GPUs of the node; ``rebalance_experts``
  falls back to the global policy (one group, one node) when the groups do
  not divide over the nodes.

Ties: the published code sorts with torch's default (unstable) sort, which
on CPU is libstdc++'s ``std::sort`` on (value, index) pairs, so equal loads
come out in an order that depends on the whole row. ``argsort_desc``
(``turbospark.placement._stdsort``) replays that sort; without it, 69 of 200
random integer-load cases gave a different map.

How faithfulness was checked: the published ``eplb.py`` itself, run with
torch 2.13.0 (CPU, Linux), and this file, on the same loads: 400 random
cases (1-3 layers, 2-88 experts, 1-8 groups, 1-4 nodes, 1-12 GPUs, 0-2
spare slots per GPU), half with distinct loads and half with small integer
loads full of ties, gave identical ``phy2log``, ``log2phy`` and ``logcnt``;
and the sort alone matched torch's order on 1,028 rows (random ties, sorted,
reversed, organ-pipe and periodic rows of up to 5,000 items, which exercise
the heapsort fallback). The tests check that the vectorised greedy in
``turbospark.placement._greedy`` gives the same maps as this file.
"""

from __future__ import annotations

import numpy as np

from turbospark.placement._stdsort import argsort_desc


def balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    num_layers, num_items = weight.shape
    assert num_items % num_packs == 0
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack_index = np.broadcast_to(np.arange(num_items), weight.shape).copy()
        return pack_index, np.zeros(weight.shape, dtype=np.int64)
    order = argsort_desc(weight.astype(np.float32))
    pack_index = np.full(weight.shape, -1, dtype=np.int64)
    rank_in_pack = np.full(weight.shape, -1, dtype=np.int64)
    for layer in range(num_layers):
        loads = [0] * num_packs
        filled = [0] * num_packs
        for item in order[layer]:
            pack = min((p for p in range(num_packs) if filled[p] < per_pack), key=loads.__getitem__)
            pack_index[layer, item] = pack
            rank_in_pack[layer, item] = filled[pack]
            loads[pack] += weight[layer, item]  # a float32 scalar: float32 sums, as in torch
            filled[pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, num_log = weight.shape
    assert num_phy >= num_log
    phy2log = np.tile(np.arange(num_phy, dtype=np.int64), (rows, 1))
    rank = np.zeros((rows, num_phy), dtype=np.int64)
    logcnt = np.ones((rows, num_log), dtype=np.int64)
    row = np.arange(rows)
    for slot in range(num_log, num_phy):
        chosen = (weight / logcnt.astype(np.float32)).argmax(axis=-1)
        phy2log[:, slot] = chosen
        rank[:, slot] = logcnt[row, chosen]
        logcnt[row, chosen] += 1
    return phy2log, rank, logcnt


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def rebalance_experts_hierarchical(weight, num_physical_experts, num_groups, num_nodes, num_gpus):
    num_layers, num_logical = weight.shape
    assert num_logical % num_groups == 0
    group_size = num_logical // num_groups
    assert num_groups % num_nodes == 0
    groups_per_node = num_groups // num_nodes
    assert num_gpus % num_nodes == 0
    assert num_physical_experts % num_gpus == 0
    per_gpu = num_physical_experts // num_gpus

    tokens_per_group = weight.reshape(num_layers, num_groups, group_size).sum(-1, dtype=np.float32)
    group_pack, group_rank = balanced_packing(tokens_per_group, num_nodes)
    log2mlog = (((group_pack * groups_per_node + group_rank) * group_size)[..., None]
                + np.arange(group_size)).reshape(num_layers, -1)
    mlog2log = _inverse(log2mlog)

    tokens_per_mlog = np.take_along_axis(weight, mlog2log, -1).reshape(-1, num_logical // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate_experts(tokens_per_mlog, num_physical_experts // num_nodes)

    tokens_per_phy = np.take_along_axis(tokens_per_mlog / mlogcnt.astype(np.float32), phy2mlog, -1)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, num_gpus // num_nodes)
    pphy2phy = _inverse(pack_index * per_gpu + rank_in_pack)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, -1)
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1)
                 + np.arange(0, num_logical, num_logical // num_nodes)[None, :, None]).reshape(num_layers, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, -1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, -1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, -1)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """(phy2log, log2phy, logcnt) as the published entry point returns them."""
    num_layers, num_logical = weight.shape
    weight = np.asarray(weight, dtype=np.float32)
    if num_groups % num_nodes == 0:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(
            weight, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(weight, num_replicas, 1, 1, num_gpus)
    maxlogcnt = int(logcnt.max())
    log2phy = np.full((num_layers, num_logical * maxlogcnt), -1, dtype=np.int64)
    np.put_along_axis(log2phy, phy2log * maxlogcnt + phyrank,
                      np.broadcast_to(np.arange(num_replicas), phy2log.shape), axis=1)
    return phy2log, log2phy.reshape(num_layers, num_logical, maxlogcnt), logcnt
