"""The two uneven collectives vLLM 0.32's CPU communicator lacks, for the data-parallel test (a test shim).

vLLM 0.32's ``CpuCommunicator`` implements neither ``all_gatherv`` nor
``reduce_scatterv`` (``DeviceCommunicatorBase`` raises
``NotImplementedError``), and every MoE layer of a data-parallel engine
needs both: the modular kernel's naive DP prepare gathers the routed tokens
of all DP ranks (``AgRsAll2AllManager.dispatch``) and its finalize
reduce-scatters the expert outputs back. So ``data_parallel_size=2`` with an
MoE model stops at the first forward on the CPU backend. This module, loaded
as a ``vllm.general_plugins`` entry point in every vLLM process of the test
(the test writes a metadata-only dist-info naming it), adds both with the
semantics of vLLM's XPU communicator (``xpu_communicator.py``): gather along
dim 0 in group-rank order, each rank's part ``sizes[rank]`` rows; sum across
the group, then each rank keeps its own ``sizes[rank]`` rows. Gloo gathers
only equal shapes, so parts are padded to the largest.

It changes nothing vLLM computes on GPUs and nothing the plugin does: a
wrong shim would change the engine's outputs, which the test compares with
a data_parallel_size=1 run and with transformers.
"""

from __future__ import annotations

from typing import Any, Optional, Union


def register() -> None:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    if "all_gatherv" not in CpuCommunicator.__dict__:
        CpuCommunicator.all_gatherv = _all_gatherv
    if "reduce_scatterv" not in CpuCommunicator.__dict__:
        CpuCommunicator.reduce_scatterv = _reduce_scatterv


def _all_gatherv(self: Any, input_: Union[Any, list[Any]], dim: int = 0, sizes: Optional[list[int]] = None) -> Any:
    import torch
    import torch.distributed as dist

    if dim != 0:
        raise NotImplementedError("only dim 0 all-gatherv is supported")
    if isinstance(input_, (list, tuple)):
        return [_all_gatherv(self, one, dim, sizes) for one in input_]
    world = self.world_size
    if sizes is None:
        sizes = [int(input_.shape[0])] * world
    assert len(sizes) == world and input_.shape[0] == sizes[self.rank_in_group], (sizes, input_.shape)
    most = max(sizes)
    padded = input_.new_zeros((most,) + tuple(input_.shape[1:]))
    padded[: input_.shape[0]] = input_
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=self.device_group)
    return torch.cat([part[:size] for part, size in zip(parts, sizes)], dim=0)


def _reduce_scatterv(self: Any, input_: Any, dim: int = -1, sizes: Optional[list[int]] = None) -> Any:
    import torch.distributed as dist

    if dim < 0:
        dim += input_.dim()
    tensor = input_.movedim(0, dim).contiguous()
    world = self.world_size
    if sizes is None:
        assert tensor.shape[0] % world == 0
        sizes = [tensor.shape[0] // world] * world
    assert len(sizes) == world and tensor.shape[0] == sum(sizes), (sizes, tensor.shape)
    dist.all_reduce(tensor, group=self.device_group)
    start = sum(sizes[: self.rank_in_group])
    return tensor.narrow(0, start, sizes[self.rank_in_group]).movedim(0, dim).contiguous()
