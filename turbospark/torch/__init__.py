"""Recording router top-k ids that live on a device, without a host sync per layer.

``DeviceRecorder`` wraps a ``RouterHistogram``. Its per-layer calls take device
tensors and only enqueue device work: the ids are copied into a preallocated
device staging buffer (static addresses, so the calls can be captured in a CUDA
graph), with a per-row keep flag (from a mask and/or a valid-row count that may
itself be a device tensor) and a per-row sequence id. Nothing is read on the
host until a flush, which copies the staged rows to pinned host memory on a
side stream, waits for that copy (the one sync), and hands the rows to the
recorder in call order. A flush happens when the staging buffer is full, when
``flush()`` is called, and before every write of the recorder (``close()``,
``with`` exit, drop, interpreter exit, the SIGTERM path): nothing staged is
lost or written twice.

With the recorder's trace and probe off, the device path is counts-only: each
call adds to an (L, E) device count matrix with ``index_add_``, and only those
counts and the per-layer pass totals cross to the host.

The package's modules: ``_device`` (``DeviceRecorder``, ``GraphRegion``),
``_buffers`` (the staging rows and their sizes), ``_counts`` (the counts-only
device matrix), ``_checks`` (what the host can check of a call), ``_transfer``
(device-to-host copies and the hand-over to the recorder).

This package imports torch; ``import turbospark`` never imports it.
"""

from ._buffers import COUNTS_ONLY_CAPACITY, DEFAULT_CAPACITY, staging_bytes
from ._device import DeviceRecorder, GraphRegion
from ._transfer import _to_host  # the vLLM plugin's device copies (turbospark/vllm/_handover.py)

__all__ = ["COUNTS_ONLY_CAPACITY", "DEFAULT_CAPACITY", "DeviceRecorder", "GraphRegion", "staging_bytes"]
