"""The proof of "no host sync" on CPU (not a test): a guard that fails on every host read of tensor data.

On a CUDA device each of these ops waits for the device; on CPU they run
silently. ``no_host_read()`` (the fixture's value) is a context manager:
inside it, any such op, and the tensor methods that read memory without
dispatching (``tolist``, ``numpy``, ``__array__``, ``item``), raise
AssertionError. Code that passes under it on CPU enqueues only device work.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _NoHostRead(TorchDispatchMode):
    """Fails on every op that reads a tensor's data on the host or moves it between devices."""

    FORBIDDEN = {
        aten._local_scalar_dense, aten.item, aten.nonzero, aten.nonzero_static, aten.masked_select,
        aten.equal, aten.is_nonzero, aten.allclose, aten.unique_consecutive, aten._unique2,
        aten.repeat_interleave, aten.bincount, aten.masked_scatter, aten.to_dense,
    }

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in self.FORBIDDEN:
            raise AssertionError(f"host read of device data: {func}")
        if packet in (aten.index, aten.index_put, aten.index_put_) and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        ):
            raise AssertionError(f"boolean-mask indexing (a host sync): {func}")
        if packet in (aten._to_copy, aten.to) and "device" in kwargs:
            raise AssertionError(f"a device transfer: {func}")
        if packet in (aten.copy_, aten._copy_from) and args[0].device != args[1].device:
            raise AssertionError(f"a copy between devices: {func}")
        return func(*args, **kwargs)


@pytest.fixture
def no_host_read() -> Any:
    """The dispatch mode, plus a patch of the tensor methods that read memory without dispatching."""

    def refuse(name: str) -> Any:
        def method(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"host read of device data: Tensor.{name}")

        return method

    @contextlib.contextmanager
    def guard() -> Any:
        with pytest.MonkeyPatch.context() as patch, _NoHostRead():
            for name in ("tolist", "numpy", "__array__", "item"):
                patch.setattr(torch.Tensor, name, refuse(name))
            yield

    return guard


